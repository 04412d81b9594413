"""The Kubernetes objects of one Ray cluster on GKE, as plain dicts (no Pulumi here).

`manifests` returns them in the order they are applied, so `rayslice preview --output yaml`
prints exactly what `pulumi up` applies (`component.KubeRay`). The tests validate the
RayCluster against KubeRay 1.7.0's CRD and the rest against the Kubernetes OpenAPI schema. The
shape of a TPU worker group comes from the catalog once: `numOfHosts` = hosts, `replicas` =
slices, ``google.com/tpu`` = chips per host, the node selector = the pools' labels.

TPU identity: one headless Service per (slice, host) selects exactly one pod by KubeRay's
replica and host index labels, and the pod start command (``startup_scripts/pod_start.sh.j2``)
derives ``TPU_WORKER_ID``, ``TPU_WORKER_HOSTNAMES``, ``TPU_NAME`` and ``MEGASCALE_*`` from the
same labels. docs/deploy-gke.md says why this replaces the kuberay-tpu-webhook.

Isolation: every object lives in a namespace of its own (`namespace_manifest`), the Ray pods
run as a service account of their own that carries no API token and no RBAC binding
(`service_account_manifest`), and `network_policies` admit traffic to the Ray pods only from
the same RayCluster's pods in that namespace, plus the dashboard from
``dashboardSourceRanges``. docs/deploy-gke.md (Isolation) says what each one stops.
"""

from __future__ import annotations

import json
import shlex

import yaml

from rayslice.infra.gke.nodes import NODE_POOL_LABEL, head_node_selector, tpu_node_selector, tpu_toleration
from rayslice.names import CLIENT_PORT, DASHBOARD_PORT, GCS_PORT, MEGASCALE_PORT, gke_namespace
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts import pod
from rayslice.startup_scripts.locks import Lock

# The operator release; tests/fixtures/kuberay-v<version>/ holds the CRD it installs.
KUBERAY_VERSION = "1.7.0"
CHART = "kuberay-operator"
CHART_REPO = "https://ray-project.github.io/kuberay-helm/"
OPERATOR_NAMESPACE = "kuberay-system"
# The replica and host index labels the pod start command reads (on by default in 1.7; pinned
# here so a chart default can never switch them off under us).
OPERATOR_VALUES = {"featureGates": [{"name": "RayMultiHostIndexing", "enabled": True}]}

RAY_API_VERSION = "ray.io/v1"
OVERWRITE_CMD_ANNOTATION = "ray.io/overwrite-container-cmd"
NETWORKING_API_VERSION = "networking.k8s.io/v1"
# Labels KubeRay puts on every pod it creates (ray-operator/controllers/ray/utils/constant.go).
LABEL_CLUSTER = "ray.io/cluster"
LABEL_NODE_TYPE = "ray.io/node-type"  # "head" or "worker"
LABEL_GROUP = "ray.io/group"
LABEL_REPLICA_NAME = "ray.io/worker-group-replica-name"  # multi-host groups only
MANAGED_BY = {"app.kubernetes.io/managed-by": "rayslice"}
# The label the API server puts on every namespace, set to its name and not writable by anyone
# (Kubernetes 1.22+): the one namespace label a NetworkPolicy can trust.
LABEL_NAMESPACE_NAME = "kubernetes.io/metadata.name"
# Pod Security Admission: refuse privileged pods, host namespaces, host paths and added
# capabilities in the cluster's namespace. The Ray pods ask for none of these.
POD_SECURITY = {"pod-security.kubernetes.io/enforce": "baseline"}
TPU_RESOURCE = "google.com/tpu"

POD_START_DIR = "/etc/rayslice"
POD_START_FILE = "pod-start.sh"
POD_START_VOLUME = "pod-start"
# The head pod's share of its CPU node (any headMachineType with 4 vCPUs and 16 GB fits).
HEAD_RESOURCES = {"cpu": "3", "memory": "12Gi"}


def namespace_name(spec: ClusterSpec) -> str:
    """The cluster's own namespace; spec names are DNS labels of at most 40 characters, so
    this stays within the 63 a namespace name may have."""
    return gke_namespace(spec.name)


def service_account_name(spec: ClusterSpec) -> str:
    """The Kubernetes service account the Ray pods run as."""
    return f"{spec.name}-ray"


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


def namespace_manifest(spec: ClusterSpec) -> dict:
    """A namespace per cluster: the NetworkPolicy's peers name it, so pods elsewhere (``default``
    included) cannot join by copying the Ray pods' labels, and creating pods here takes rights
    granted for this namespace (or cluster-wide)."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace_name(spec),
            "labels": {**MANAGED_BY, LABEL_CLUSTER: spec.name, **POD_SECURITY},
        },
    }


def service_account_manifest(spec: ClusterSpec) -> dict:
    """The Ray pods' identity: no API token is mounted, and no Role is bound to it.

    Nothing in the pods talks to the Kubernetes API: the pod start script reads its identity
    from labels (downward API) and its peers from DNS, and KubeRay hands the Ray token over as an
    environment variable from a Secret. KubeRay gives Ray pods API access in two cases only, both
    off: the in-tree autoscaler sidecar (a slice never scales) and Kubernetes-delegated token
    auth (``authOptions.enableK8sTokenAuth``). The token stays off here and on the pod spec, so
    neither another pod using this account nor these pods under another account get one.
    """
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": service_account_name(spec),
            "namespace": namespace_name(spec),
            "labels": {**MANAGED_BY, LABEL_CLUSTER: spec.name},
        },
        "automountServiceAccountToken": False,
    }


def pod_start_configmap(
    spec: ClusterSpec, package_source: str | None = None, lock: Lock | None = None
) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": pod_start_configmap_name(spec),
            "namespace": namespace_name(spec),
            "labels": dict(MANAGED_BY),
        },
        "data": {POD_START_FILE: pod.render_pod_start(spec, package_source, lock)},
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
                        "namespace": namespace_name(spec),
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
        # Ray >= 2.59 turns token auth on by itself when ~/.ray/auth_token exists, and any
        # RAY_AUTH_MODE other than "token" disables it: say "disabled" explicitly.
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


def _pod_identity(spec: ClusterSpec) -> dict:
    """The pod spec fields that run every Ray pod as `service_account_manifest`, tokenless."""
    return {"serviceAccountName": service_account_name(spec), "automountServiceAccountToken": False}


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
                **_pod_identity(spec),
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
        **_pod_identity(spec),
        "nodeSelector": tpu_node_selector(spec),
        "tolerations": [tpu_toleration()],
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
            "namespace": namespace_name(spec),
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
    return manifest


def ray_pods_selector(spec: ClusterSpec) -> dict:
    """Every pod KubeRay starts for this RayCluster (head and workers)."""
    return {"matchLabels": {LABEL_CLUSTER: spec.name}}


def network_policies(spec: ClusterSpec) -> list[dict]:
    """Who may connect to the Ray pods: only the same RayCluster's pods in the cluster's own
    namespace, on any port, and the head's dashboard (the Jobs API) also from
    ``dashboardSourceRanges``.

    The peer names the namespace by the label the API server sets (`LABEL_NAMESPACE_NAME`)
    *and* the pods by their RayCluster label, in one entry, which Kubernetes ANDs: a pod in
    another namespace that copies ``ray.io/cluster`` matches the pod selector but not the
    namespace one. (Two entries, one per selector, would be ORed and admit every pod of the
    namespace.)

    Ray's pods talk to each other on more than the head's well-known ports (GCS, dashboard,
    client): raylets, object managers, workers, and the JAX / megascale coordinators use ports
    of their own, so the rule among the cluster's pods names no port. Everything else in the
    cluster (other namespaces, other apps) is refused, since NetworkPolicies only add what
    they admit once a pod is selected. ``kubectl port-forward`` enters through the kubelet,
    not the pod network, so the documented tunnel keeps working. Enforced only where the
    cluster runs Dataplane V2 or network policy (docs/deploy-gke.md).
    """
    own_pods = {
        "namespaceSelector": {"matchLabels": {LABEL_NAMESPACE_NAME: namespace_name(spec)}},
        "podSelector": ray_pods_selector(spec),
    }
    policies = [
        {
            "apiVersion": NETWORKING_API_VERSION,
            "kind": "NetworkPolicy",
            "metadata": {
                "name": f"{spec.name}-ray-pods",
                "namespace": namespace_name(spec),
                "labels": {**MANAGED_BY, LABEL_CLUSTER: spec.name},
            },
            "spec": {
                "podSelector": ray_pods_selector(spec),
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [own_pods]}],
            },
        }
    ]
    if spec.dashboard_source_ranges:
        policies.append(
            {
                "apiVersion": NETWORKING_API_VERSION,
                "kind": "NetworkPolicy",
                "metadata": {
                    "name": f"{spec.name}-dashboard",
                    "namespace": namespace_name(spec),
                    "labels": {**MANAGED_BY, LABEL_CLUSTER: spec.name},
                },
                "spec": {
                    "podSelector": {"matchLabels": {LABEL_CLUSTER: spec.name, LABEL_NODE_TYPE: "head"}},
                    "policyTypes": ["Ingress"],
                    "ingress": [
                        {
                            "from": [{"ipBlock": {"cidr": cidr}} for cidr in spec.dashboard_source_ranges],
                            "ports": [{"protocol": "TCP", "port": DASHBOARD_PORT}],
                        }
                    ],
                },
            }
        )
    return policies


# The kinds of `manifests`, in the order `kubectl apply` should create them: everything else
# lives in the Namespace; the pods that the RayCluster starts run as the ServiceAccount, mount
# the ConfigMap, are named by the Services, and are fenced by the NetworkPolicies from their
# first packet.
APPLY_ORDER = ("Namespace", "ServiceAccount", "ConfigMap", "Service", "NetworkPolicy", "RayCluster")


def manifests(spec: ClusterSpec, package_source: str | None = None, lock: Lock | None = None) -> list[dict]:
    """Every object of the Ray cluster, in `APPLY_ORDER` (the operator excluded); `lock` is the
    stack's lock, if it has one."""
    return [
        namespace_manifest(spec),
        service_account_manifest(spec),
        pod_start_configmap(spec, package_source, lock),
        *host_services(spec),
        *network_policies(spec),
        raycluster_manifest(spec),
    ]


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
