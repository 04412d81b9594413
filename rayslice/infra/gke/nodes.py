"""What the GKE nodes are, as plain data: pool names, the TPU taint, the selectors pods use to
land on them, one pool plan per slice, and the nodes' own identity.

Pure (no Pulumi): the KubeRay manifests (`kuberay`) and the Pulumi component (`cluster`) both
read these, so a pool and the pods that must land on it are described by one fact each. The
shape of a slice is the catalog's; nothing here re-checks it (the tests compare it with xpk).
"""

from __future__ import annotations

from dataclasses import dataclass

from rayslice import capacity_table
from rayslice.names import slice_name
from rayslice.spec import ClusterSpec

# GKE puts this taint on every TPU node; the pools declare it so the pods' toleration and the
# nodes' taint are one fact. Spelt as the container API spells it (NodeTaint.effect enum).
TPU_TAINT = {"key": "google.com/tpu", "value": "present", "effect": "NO_SCHEDULE"}
# The container API spells taint effects in upper snake case, Kubernetes in camel case.
K8S_TAINT_EFFECT = {
    "NO_SCHEDULE": "NoSchedule",
    "PREFER_NO_SCHEDULE": "PreferNoSchedule",
    "NO_EXECUTE": "NoExecute",
}
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"

# The node service account's project roles. Google's "Configure GKE node service accounts"
# (docs.cloud.google.com/kubernetes-engine/security/configure-node-service-accounts) names
# roles/container.defaultNodeServiceAccount as the minimum a node account needs (it carries the
# logging, monitoring and resource-metadata permissions that the older "Harden your cluster"
# page listed as logging.logWriter, monitoring.metricWriter, monitoring.viewer and
# stackdriver.resourceMetadata.writer). Nothing more: the Ray image comes from Docker Hub, so
# roles/artifactregistry.reader is not needed (docs/deploy-gke.md says when to add it).
NODE_PROJECT_ROLES = ("roles/container.defaultNodeServiceAccount",)


def head_pool_name(spec: ClusterSpec) -> str:
    """The CPU pool the Ray head (and the KubeRay operator) runs on."""
    return f"{spec.name}-head"


@dataclass(frozen=True)
class TpuPoolPlan:
    """One TPU node pool = one slice: what GKE needs to place `node_count` nodes as one slice."""

    name: str
    slice_index: int
    machine_type: str
    node_count: int
    topology: str
    # "COMPACT" (multi-host, with a tpu_topology), "workload-policy" (tpu7x multi-host: a
    # COMPACT placement that names a workload policy), or None (single host: no placement).
    placement: str | None
    zone: str
    spot: bool
    reservation: str | None
    # capacity=flex-start: the pool starts empty and the cluster autoscaler grows it to
    # `node_count` once the zone has every node (`cluster.GkeCluster._tpu_pool`); its nodes
    # run at most `max_run_hours`.
    flex_start: bool
    max_run_hours: int | None
    # NodeManagement.autoRepair as the cell's nodePools.create sends it: on (GKE's default for
    # new pools, sent anyway so that the program says what the table says), off on flex-start.
    auto_repair: bool


def tpu_pool_plans(spec: ClusterSpec) -> list[TpuPoolPlan]:
    """One pool per slice, shaped by the catalog's GKE entry for the spec's accelerator type."""
    tpu = spec.tpu
    assert spec.zone is not None and tpu.machine_type, "the spec was validated for platform=gke"
    # What the capacity changes in a pool is the stack's cell's (`capacity_table`): its
    # nodePools.create call's fields, whether it consumes a named reservation, whether a run
    # duration bounds it (flex-start).
    cell = capacity_table.cell_for(spec)
    config = cell.calls[0].body.get("config") or {}
    return [
        TpuPoolPlan(
            name=slice_name(spec.name, i),
            slice_index=i,
            machine_type=tpu.machine_type,
            node_count=tpu.hosts,
            topology=tpu.topology,
            placement=tpu.placement,
            zone=spec.zone,
            spot=bool(config.get("spot")),
            reservation=spec.reservation
            if cell.reservation_affinity == capacity_table.SPECIFIC_RESERVATION
            else None,
            flex_start=cell.run_duration,
            max_run_hours=spec.max_run_hours if cell.run_duration else None,
            auto_repair=bool(cell.calls[0].body["management"]["autoRepair"]),
        )
        for i in range(spec.slices)
    ]


def tpu_node_selector(spec: ClusterSpec) -> dict[str, str]:
    """The node labels GKE gives every node of the spec's TPU pools (the workers' selector)."""
    assert spec.tpu.gke_accelerator is not None, "the spec was validated for platform=gke"
    return {TPU_ACCELERATOR_LABEL: spec.tpu.gke_accelerator, TPU_TOPOLOGY_LABEL: spec.tpu.topology}


def head_node_selector(spec: ClusterSpec) -> dict[str, str]:
    """The head pod's selector: the CPU pool made for it."""
    return {NODE_POOL_LABEL: head_pool_name(spec)}


def tpu_toleration() -> dict[str, str]:
    """The pods' side of `TPU_TAINT`."""
    return {
        "key": TPU_TAINT["key"],
        "operator": "Equal",
        "value": TPU_TAINT["value"],
        "effect": K8S_TAINT_EFFECT[TPU_TAINT["effect"]],
    }
