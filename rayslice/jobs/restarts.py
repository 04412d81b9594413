"""Telling a node's death from a job's own failure, and waiting for the cluster to be whole again
(`rayslice run --max-restarts`).

The cluster's shape is read from the head's dashboard (the state API), in `ray.nodes()`'s shape,
and judged by the same code the workloads use to choose slices (`rayslice.workloads._cluster`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayslice.errors import JobFailed, NoCluster
from rayslice.jobs.connection import Target, auth_headers

# How long `--max-restarts` waits for a cluster to be whole again after a node died.
REJOIN_TIMEOUT_S = 1800.0

# What Ray 2.60 writes when work was lost with its node, read from its own code: the core
# worker's task error (NodeDiedError, in _raylet.so), the GCS's actor death causes and its
# health check (gcs_server), and python/ray/exceptions.py. A job that fails with none of these in
# its message or the tail of its logs failed on its own.
NODE_DEATH_MARKERS = (
    "the node it was running on is dead or unavailable",
    "the actor's node was preempted",
    "the actor's node was terminated",
    "has missed too many heartbeats",
    "failed due to node preemption",
    "the task's local raylet died",
    "NodeDiedError",
    "LocalRayletDiedError",
)


def node_death_reason(text: str) -> str | None:
    """The first line of `text` that says a node died (trimmed), or None if none does."""
    markers = [m.lower() for m in NODE_DEATH_MARKERS]
    for line in text.splitlines():
        if any(m in line.lower() for m in markers):
            line = line.strip()
            return line if len(line) <= 200 else line[:197] + "..."
    return None


# How Ray names a dead node in those messages ("node ID: <hex>", "node with node id: <hex>").
DEAD_NODE_ID = re.compile(r"node id: ([0-9a-f]{4,})\b", re.IGNORECASE)


def dead_node_ids(text: str) -> frozenset[str]:
    """The IDs of the nodes a failure says died: they must be gone before the cluster counts as whole."""
    return frozenset(match.lower() for match in DEAD_NODE_ID.findall(text))


@dataclass(frozen=True)
class ClusterShape:
    """What "whole" means for a cluster: its complete TPU slices and how many nodes were alive."""

    slices: frozenset[str]
    nodes: int
    alive: frozenset[str] = frozenset()  # the alive nodes' IDs


def cluster_nodes(target: Target) -> list[dict[str, Any]]:
    """The cluster's nodes from the dashboard's state API, in `ray.nodes()`'s shape."""
    import requests

    response = requests.get(
        f"{target.url}/api/v0/nodes",
        params={"detail": "1", "limit": "10000"},
        headers=auth_headers(target.token_file),
        timeout=10,
    )
    response.raise_for_status()
    return [
        {
            "NodeID": n["node_id"],
            "NodeManagerAddress": n["node_ip"],
            "Alive": n["state"] == "ALIVE",
            "Resources": n.get("resources_total") or {},
            "Labels": n.get("labels") or {},
        }
        for n in response.json()["data"]["result"]["result"]
    ]


def shape_of(nodes: Sequence[dict[str, Any]]) -> ClusterShape:
    from rayslice.workloads import _cluster  # imports ray, which `rayslice run --list` never needs

    complete = {s.name for s in _cluster.tpu_slices(_cluster.tpu_hosts(nodes)) if s.complete}
    alive = frozenset(str(n["NodeID"]).lower() for n in nodes if n["Alive"])
    return ClusterShape(frozenset(complete), len(alive), alive)


def read_nodes(target: Target) -> list[dict[str, Any]]:
    """`cluster_nodes`, with a dashboard that cannot answer as `NoCluster` (exit 3)."""
    try:
        return cluster_nodes(target)
    except (OSError, ValueError, KeyError) as exc:
        raise NoCluster(f"cannot read the nodes of {target.url}: {exc}") from None


def cluster_shape(target: Target) -> ClusterShape:
    return shape_of(read_nodes(target))


def wait_until_whole(
    target: Target,
    baseline: ClusterShape,
    timeout_s: float,
    *,
    dead: frozenset[str] = frozenset(),
    poll_s: float = 5.0,
    settle: int = 2,
) -> None:
    """Block until every slice of `baseline` is complete, as many nodes are alive and none of the
    `dead` node IDs is, `settle` polls in a row. Ray lists a node that was just lost as alive until
    its health check gives up, so right after the failure the lost slice can still look whole."""
    deadline = time.monotonic() + timeout_s
    in_a_row = 0
    while True:
        try:
            now = shape_of(cluster_nodes(target))
        except (OSError, ValueError, KeyError):  # the head itself may be coming back
            now = ClusterShape(frozenset(), 0)
        whole = baseline.slices <= now.slices and now.nodes >= baseline.nodes and not dead & now.alive
        in_a_row = in_a_row + 1 if whole else 0
        if in_a_row >= settle:
            return
        if time.monotonic() > deadline:
            missing = ", ".join(sorted(baseline.slices - now.slices)) or "none"
            raise JobFailed(
                f"the cluster was not whole again after {timeout_s:.0f}s (incomplete slices: {missing}; "
                f"{now.nodes} of {baseline.nodes} nodes alive); not restarting"
            )
        time.sleep(poll_s)
