"""KubeRay on the GKE cluster: the operator and the Kubernetes objects of one Ray cluster.

The objects are built by pure functions (`manifests` and the builders it calls), so
`rayslice preview --output yaml` prints exactly what `pulumi up` applies, and the tests
validate the RayCluster against KubeRay's CRD. The shape of a TPU worker group comes from the
catalog once: `numOfHosts` = hosts, `replicas` = slices, ``google.com/tpu`` = chips per host,
the node selector = the pools' accelerator and topology labels; `check_raycluster` asserts the
rule that ties them together before anything is applied.

TPU identity: one headless Service per (slice, host) selects exactly one pod by KubeRay's
replica and host index labels, and the pod start command (``startup_scripts/pod_start.sh.j2``)
derives ``TPU_WORKER_ID``, ``TPU_WORKER_HOSTNAMES``, ``TPU_NAME`` and ``MEGASCALE_*`` from the
same labels. The README (GKE section) says why this replaces the kuberay-tpu-webhook.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s
import yaml

from rayslice import catalog
from rayslice.infra.gke_cluster import (
    K8S_TAINT_EFFECT,
    NODE_POOL_LABEL,
    TPU_TAINT,
    head_node_selector,
    tpu_node_selector,
)
from rayslice.names import CLIENT_PORT, DASHBOARD_PORT, GCS_PORT, MEGASCALE_PORT
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts import pod

# The operator release; the CRD in ../shared/fixtures/kuberay-v<version>/ is the one it installs.
KUBERAY_VERSION = "1.7.0"
CHART = "kuberay-operator"
CHART_REPO = "https://ray-project.github.io/kuberay-helm/"
OPERATOR_NAMESPACE = "kuberay-system"
# The replica and host index labels the pod start command reads (on by default in 1.7; pinned
# here so a chart default can never switch them off under us).
OPERATOR_VALUES = {"featureGates": [{"name": "RayMultiHostIndexing", "enabled": True}]}

NAMESPACE = "default"
RAY_API_VERSION = "ray.io/v1"
OVERWRITE_CMD_ANNOTATION = "ray.io/overwrite-container-cmd"
LABEL_CLUSTER = "ray.io/cluster"
LABEL_GROUP = "ray.io/group"
LABEL_REPLICA_NAME = "ray.io/worker-group-replica-name"  # multi-host groups only
MANAGED_BY = {"app.kubernetes.io/managed-by": "rayslice"}
TPU_RESOURCE = "google.com/tpu"

POD_START_DIR = "/etc/rayslice"
POD_START_FILE = "pod-start.sh"
POD_START_VOLUME = "pod-start"
# The head pod's share of its CPU node (any headMachineType with 4 vCPUs and 16 GB fits).
HEAD_RESOURCES = {"cpu": "3", "memory": "12Gi"}


def worker_group_name(spec: ClusterSpec) -> str:
    return f"tpu-{spec.accelerator_type}"


def head_service_name(spec: ClusterSpec) -> str:
    """The Service KubeRay creates for the head (``<cluster>-head-svc``)."""
    return f"{spec.name}-head-svc"


def pod_start_configmap_name(spec: ClusterSpec) -> str:
    return f"{spec.name}-pod-start"


def tpu_resources(spec: ClusterSpec) -> str:
    """``rayStartParams.resources``: KubeRay pastes it into a bash command, hence shell-quoted."""
    return shlex.quote(json.dumps({"TPU": spec.tpu.chips_per_host}))


def pod_start_configmap(spec: ClusterSpec, package_source: str | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": pod_start_configmap_name(spec),
            "namespace": NAMESPACE,
            "labels": dict(MANAGED_BY),
        },
        "data": {POD_START_FILE: pod.render_pod_start(spec, package_source)},
    }


def host_services(spec: ClusterSpec) -> list[dict]:
    """One headless Service per TPU host; its name is that host's entry in TPU_WORKER_HOSTNAMES."""
    services = []
    for slice_index in range(spec.slices):
        for host in range(spec.tpu.hosts):
            selector = {
                LABEL_CLUSTER: spec.name,
                LABEL_GROUP: worker_group_name(spec),
                pod.LABEL_REPLICA_INDEX: str(slice_index),
            }
            if spec.tpu.multi_host:  # KubeRay sets the host index on multi-host groups only
                selector[pod.LABEL_HOST_INDEX] = str(host)
            services.append(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {
                        "name": pod.host_service_name(spec, slice_index, host),
                        "namespace": NAMESPACE,
                        "labels": {**MANAGED_BY, LABEL_CLUSTER: spec.name},
                    },
                    "spec": {
                        "clusterIP": "None",
                        # The name must resolve while the pod is still starting: libtpu and the
                        # megascale coordinator need their peers before Ray reports ready.
                        "publishNotReadyAddresses": True,
                        "selector": selector,
                        "ports": [{"name": "megascale", "port": MEGASCALE_PORT}],
                    },
                }
            )
    return services


def _field_env(name: str, field_path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def _container(
    spec: ClusterSpec, name: str, role: str, env: list[dict], ports: list[dict], resources: dict
) -> dict:
    if spec.ray_auth == "none":
        # Ray >= 2.59 may switch token auth on by itself; say "off" explicitly (FACTS.md).
        env = [*env, {"name": "RAY_AUTH_MODE", "value": "disabled"}]
    return {
        "name": name,
        "image": pod.ray_image(spec),
        "command": ["/bin/bash", f"{POD_START_DIR}/{POD_START_FILE}"],
        "env": [{"name": pod.ENV_ROLE, "value": role}, *env],
        "ports": ports,
        "resources": resources,
        "volumeMounts": [{"name": POD_START_VOLUME, "mountPath": POD_START_DIR, "readOnly": True}],
    }


def _pod_volumes(spec: ClusterSpec) -> list[dict]:
    return [
        {
            "name": POD_START_VOLUME,
            "configMap": {"name": pod_start_configmap_name(spec), "defaultMode": 0o555},
        }
    ]


def _slice_affinity(spec: ClusterSpec) -> dict:
    """Keep each slice's pods on one node pool, and different slices on different pools.

    All pools carry the same accelerator and topology labels, so the node selector alone could
    mix the hosts of two slices. ``matchLabelKeys`` / ``mismatchLabelKeys`` (Kubernetes 1.31+)
    compare KubeRay's per-replica name, with the node pool as the topology domain.
    """
    group = {"matchLabels": {LABEL_CLUSTER: spec.name, LABEL_GROUP: worker_group_name(spec)}}
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": group,
                    "matchLabelKeys": [LABEL_REPLICA_NAME],
                    "topologyKey": NODE_POOL_LABEL,
                }
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": group,
                    "mismatchLabelKeys": [LABEL_REPLICA_NAME],
                    "topologyKey": NODE_POOL_LABEL,
                }
            ]
        },
    }


def _head_group(spec: ClusterSpec) -> dict:
    ports = [
        {"name": "gcs", "containerPort": GCS_PORT},
        {"name": "dashboard", "containerPort": DASHBOARD_PORT},
        {"name": "client", "containerPort": CLIENT_PORT},
    ]
    container = _container(
        spec,
        "ray-head",
        "head",
        [],
        ports,
        {"requests": dict(HEAD_RESOURCES), "limits": dict(HEAD_RESOURCES)},
    )
    return {
        "rayStartParams": {"dashboard-host": "0.0.0.0"},
        "template": {
            "spec": {
                "nodeSelector": head_node_selector(spec),
                "containers": [container],
                "volumes": _pod_volumes(spec),
            }
        },
    }


def _worker_group(spec: ClusterSpec) -> dict:
    tpu = spec.tpu
    env = [
        {"name": "TPU_ACCELERATOR_TYPE", "value": tpu.accelerator_type},
        {"name": "TPU_TOPOLOGY", "value": tpu.topology},
        _field_env(pod.ENV_REPLICA_INDEX, f"metadata.labels['{pod.LABEL_REPLICA_INDEX}']"),
        _field_env(pod.ENV_POD_IP, "status.podIP"),
    ]
    if tpu.multi_host:
        env.append(_field_env(pod.ENV_HOST_INDEX, f"metadata.labels['{pod.LABEL_HOST_INDEX}']"))
    chips = {TPU_RESOURCE: str(tpu.chips_per_host)}
    container = _container(
        spec,
        "ray-worker",
        "worker",
        env,
        [{"name": "megascale", "containerPort": MEGASCALE_PORT}],
        {"requests": dict(chips), "limits": dict(chips)},
    )
    pod_spec: dict = {
        "nodeSelector": tpu_node_selector(spec),
        "tolerations": [
            {
                "key": TPU_TAINT["key"],
                "operator": "Equal",
                "value": TPU_TAINT["value"],
                "effect": K8S_TAINT_EFFECT[TPU_TAINT["effect"]],
            }
        ],
        "containers": [container],
        "volumes": _pod_volumes(spec),
    }
    if tpu.multi_host:
        pod_spec["affinity"] = _slice_affinity(spec)
    return {
        "groupName": worker_group_name(spec),
        # A slice is all-or-nothing: no autoscaling between these bounds.
        "replicas": spec.slices,
        "minReplicas": spec.slices,
        "maxReplicas": spec.slices,
        "numOfHosts": tpu.hosts,
        "rayStartParams": {"resources": tpu_resources(spec)},
        "template": {"spec": pod_spec},
    }


def raycluster_manifest(spec: ClusterSpec) -> dict:
    """The RayCluster for `spec`: a head group and one TPU worker group (all slices share a shape)."""
    manifest = {
        "apiVersion": RAY_API_VERSION,
        "kind": "RayCluster",
        "metadata": {
            "name": spec.name,
            "namespace": NAMESPACE,
            "labels": dict(MANAGED_BY),
            "annotations": {OVERWRITE_CMD_ANNOTATION: "true"},
        },
        "spec": {
            "rayVersion": spec.ray_version,
            "authOptions": {"mode": "token" if spec.ray_auth == "token" else "disabled"},
            "headGroupSpec": _head_group(spec),
            "workerGroupSpecs": [_worker_group(spec)],
        },
    }
    # The shape comes from the validated spec's catalog entry: a failure here is a catalog bug.
    problems = check_raycluster(manifest)
    assert not problems, "inconsistent RayCluster: " + "; ".join(problems)
    return manifest


def check_raycluster(manifest: dict) -> list[str]:
    """The kuberay-tpu-webhook's rule, kept without the webhook: every TPU worker group's
    ``numOfHosts`` x ``google.com/tpu`` equals the chips of the topology it selects, and the
    topology exists for the accelerator it selects."""
    problems = []
    by_label = {g.gke_accelerator: g.name for g in catalog.GENERATIONS if g.gke_accelerator}
    for group in manifest["spec"].get("workerGroupSpecs", []):
        pod_spec = group["template"]["spec"]
        selector = pod_spec.get("nodeSelector", {})
        limits = pod_spec["containers"][0].get("resources", {}).get("limits", {})
        if TPU_RESOURCE not in limits:
            continue
        name, accelerator = group["groupName"], selector.get("cloud.google.com/gke-tpu-accelerator")
        topology = selector.get("cloud.google.com/gke-tpu-topology")
        if accelerator not in by_label or topology is None:
            problems.append(
                f"group {name}: node selector must name a GKE TPU accelerator and topology, got {selector}"
            )
            continue
        try:
            shape = catalog.lookup(f"{by_label[accelerator]}-{topology}", "gke")
        except catalog.CatalogError as exc:
            problems.append(f"group {name}: topology {topology} does not exist for {accelerator} ({exc})")
            continue
        hosts, per_host = group.get("numOfHosts", 1), int(limits[TPU_RESOURCE])
        if hosts * per_host != shape.chips:
            problems.append(
                f"group {name}: numOfHosts {hosts} x {TPU_RESOURCE} {per_host} = {hosts * per_host} chips, "
                f"but topology {topology} has {shape.chips}; use numOfHosts {shape.hosts} with {shape.chips_per_host} chips each"
            )
    return problems


# The kinds of `manifests`, in the order `kubectl apply` should create them: the pods that
# the RayCluster starts mount the ConfigMap and are named by the Services.
APPLY_ORDER = ("ConfigMap", "Service", "RayCluster")


def manifests(spec: ClusterSpec, package_source: str | None = None) -> list[dict]:
    """Every object of the Ray cluster, in `APPLY_ORDER` (the operator excluded)."""
    return [pod_start_configmap(spec, package_source), *host_services(spec), raycluster_manifest(spec)]


class _ManifestDumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (the pod start script) as readable ``|`` blocks."""


_ManifestDumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar(
        "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None
    ),
)


def manifests_yaml(objects: list[dict]) -> str:
    """Kubernetes objects (`manifests`, or what the program registered from them) as one
    multi-document YAML stream for ``kubectl apply -f -``."""
    return yaml.dump_all(objects, Dumper=_ManifestDumper, sort_keys=False)


@dataclass(frozen=True)
class KubeRayArgs:
    spec: ClusterSpec
    provider: k8s.Provider  # reaches the GKE cluster
    operator_node_pool: pulumi.Resource  # a pool the operator pod can run on (the head pool)


class KubeRay(pulumi.ComponentResource):
    """The KubeRay operator (Helm release or the GKE add-on) and the Ray cluster's objects."""

    ray_cluster_name: pulumi.Output[str]

    def __init__(self, name: str, args: KubeRayArgs, opts: pulumi.ResourceOptions | None = None):
        spec = args.spec
        objects = manifests(spec)  # pure, and checked, before anything is registered
        super().__init__("rayslice:infra:KubeRay", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider)
        operator: list[pulumi.Resource] = [args.operator_node_pool]
        if spec.kuberay == "helm":
            operator = [
                k8s.helm.v3.Release(
                    f"{name}-operator",
                    name=CHART,
                    chart=CHART,
                    version=KUBERAY_VERSION,
                    repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=CHART_REPO),
                    namespace=OPERATOR_NAMESPACE,
                    create_namespace=True,
                    values=OPERATOR_VALUES,
                    opts=pulumi.ResourceOptions.merge(
                        on_cluster, pulumi.ResourceOptions(depends_on=[args.operator_node_pool])
                    ),
                )
            ]
        configmap, *services, cluster = objects
        prerequisites: list[pulumi.Resource] = [
            k8s.core.v1.ConfigMap(
                f"{name}-pod-start", metadata=configmap["metadata"], data=configmap["data"], opts=on_cluster
            )
        ]
        prerequisites += [
            k8s.core.v1.Service(
                f"{name}-{svc['metadata']['name']}",
                metadata=svc["metadata"],
                spec=svc["spec"],
                opts=on_cluster,
            )
            for svc in services
        ]
        ray_cluster = k8s.apiextensions.CustomResource(
            f"{name}-raycluster",
            api_version=cluster["apiVersion"],
            kind=cluster["kind"],
            metadata=cluster["metadata"],
            spec=cluster["spec"],
            opts=pulumi.ResourceOptions.merge(
                on_cluster, pulumi.ResourceOptions(depends_on=[*operator, *prerequisites])
            ),
        )
        self.ray_cluster_name = ray_cluster.id.apply(lambda _: spec.name)
        # Declared above and repeated here so it is the component's recorded output.
        self.register_outputs({"ray_cluster_name": self.ray_cluster_name})
