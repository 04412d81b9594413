"""`rayslice status`: each slice's state, each host's boot state and the recovery events, read
from the cloud with Application Default Credentials. On GKE: each slice's node pool (its status,
a phase, its nodes against the slice's hosts, since when, the run limit); the Ray pods are not
read (that needs the cluster's credentials), and status names the kubectl command instead.

Given no stack file and no ``--set`` key, it reads the simulated cluster of the default state
dir when one is up (`rayslice.clusters`, as `rayslice run` finds it): the spec it was made from,
and its cloud API emulation with the credentials the emulation made for its owner
(`client_for`). Nothing of the user's environment is needed then.

No Pulumi CLI and no stack state: every name derives from the spec, as infra derives it
(`rayslice.names.slice_name`, `head_name`, `host_name` via the MIG's listing). A host's boot
state is the ``rayslice/state`` guest attribute its boot script publishes; the events are the
``rayslice/recovery-*`` guest attributes the controller publishes on its own VM
(`rayslice.recovery.events`), beside that VM's state. The API calls are those of
`rayslice.recovery.cloud`, so the simulator's emulation answers them through the normal endpoint
override.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any

import click

from rayslice import capacity_table, clusters, names, printable
from rayslice import spec as spec_module
from rayslice.cli import load_spec, spec_options
from rayslice.cloud.capacity import ACTIVE as QUEUED_ACTIVE
from rayslice.cloud.capacity import FAILED as QUEUED_FAILED
from rayslice.cloud.capacity import SUSPENDED as QUEUED_SUSPENDED
from rayslice.cloud.capacity import WAITING as QUEUED_WAITING
from rayslice.cloud.rest import default_session, key_file_session
from rayslice.cloud.states import INSTANCE_RUNNING, INSTANCE_TERMINATED, POOL_ERROR, POOL_STOPPING
from rayslice.errors import EXIT_OK, InvalidInput, NoCluster
from rayslice.recovery import kinds
from rayslice.recovery.cloud import CloudClient, Location
from rayslice.recovery.events import events_from_guest_attributes
from rayslice.recovery.kinds import STATE_QUERY, boot_state, hours, managed_status
from rayslice.spec import ClusterSpec

NAMESPACE_QUERY = f"{names.GUEST_ATTRIBUTE_NAMESPACE}/"


# A GKE slice's phase, read from its node pool (container v1 NodePool.status) and the nodes of its
# MIGs. No source says whether a flex-start pool that waits for capacity reads PROVISIONING or
# RUNNING with no node (GKE creates the pool empty; its autoscaler adds the nodes later), so both
# read as waiting. A pool whose nodes all stopped (TERMINATED: a node failed or went into
# maintenance, and GKE shut the whole slice down) is down, not waiting: GKE brings it back where
# the pool has auto-repair on; a flex-start pool has it off and stays down.
WAITING, PROVISIONING, RUNNING, DOWN, FAILED, DELETING, MISSING = (
    "waiting",
    "provisioning",
    "running",
    "down",
    "failed",
    "deleting",
    "missing",
)


def node_pool_phase(pool: dict[str, Any], nodes: list[str], hosts: int) -> str:
    """waiting (flex-start, no node yet), provisioning (some nodes, or a pool being created),
    running (every host), down (every node it has stopped), failed (ERROR) or deleting
    (STOPPING); `nodes` are the instance states of the pool's nodes."""
    status = pool.get("status")
    running = nodes.count(INSTANCE_RUNNING)
    if status == POOL_STOPPING:
        return DELETING
    if status == POOL_ERROR:
        return FAILED
    if running >= hosts:
        return RUNNING
    if nodes and nodes.count(INSTANCE_TERMINATED) == len(nodes):
        return DOWN
    if running == 0 and (pool.get("config") or {}).get("flexStart"):
        return WAITING
    return PROVISIONING


def _gke_slice(client: CloudClient, spec: ClusterSpec, name: str) -> dict[str, Any]:
    """A GKE slice: its node pool's status and phase, and the nodes of the pool's MIGs (the pool's
    ``instanceGroupUrls``, read through Compute Engine: no cluster credentials needed)."""
    pool = client.get_node_pool(spec.gke_cluster_name, name)
    if pool is None:
        return {"name": name, "state": "MISSING", "phase": MISSING, "hosts": []}
    nodes: list[dict[str, Any]] = []
    since = None
    for url in pool.get("instanceGroupUrls", []):
        group = str(url).rsplit("/", 1)[-1]
        mig = client.get_mig(group)
        if mig is None:
            continue
        since = since or mig.get("creationTimestamp")
        for instance in client.list_managed_instances(group):
            host, status = managed_status(instance)
            nodes.append({"worker": len(nodes), "name": host, "instance": status})
    states = [str(n["instance"]) for n in nodes]
    conditions = pool.get("conditions") or []
    reason = "; ".join(f"{c.get('code', '')}: {c.get('message', '')}" for c in conditions) or pool.get(
        "statusMessage"
    )
    duration = str((pool.get("config") or {}).get("maxRunDuration") or "")
    return {
        "name": name,
        "state": str(pool.get("status", "STATUS_UNSPECIFIED")),
        "phase": node_pool_phase(pool, states, spec.tpu.hosts),
        "nodes_running": states.count(INSTANCE_RUNNING),
        "hosts_asked": spec.tpu.hosts,
        "since": since,
        "run_hours": hours(duration) if duration else None,
        "flex_start": bool((pool.get("config") or {}).get("flexStart")),
        # NodeManagement.autoRepair, on unless the pool's create turned it off (GKE's default)
        "auto_repair": bool((pool.get("management") or {}).get("autoRepair", True)),
        "reason": reason or None,
        "hosts": nodes,
    }


def ray_pods_command(spec: ClusterSpec) -> str:
    """How to list the Ray pods, which status cannot see (they need the cluster's credentials)."""
    namespace = names.gke_namespace(spec.name)
    return shlex.join(
        ["kubectl", "get", "pods", "--namespace", namespace, "--selector", f"ray.io/cluster={spec.name}"]
    )


def _gather_gke(client: CloudClient, spec: ClusterSpec) -> dict[str, Any]:
    return {
        "cluster": spec.name,
        "platform": spec.platform,
        "project": spec.project,
        "zone": spec.zone,
        "gke_cluster": spec.gke_cluster_name,
        "head": None,
        "controller": None,
        "slices": [_gke_slice(client, spec, spec.slice_name(i)) for i in range(spec.slices)],
        "events": [],
        "recovery": False,
        "ray_pods": {
            "visible": False,
            "why": "Ray pods are Kubernetes objects: reading them needs the cluster's credentials",
            "command": ray_pods_command(spec),
        },
    }


def gather(client: CloudClient, spec: ClusterSpec) -> dict[str, Any]:
    """Everything `status` shows, as JSON-ready data (the --json output)."""
    kind = kinds.of(spec.platform)
    if kind is None:  # GKE: node pools, read through the container API
        return _gather_gke(client, spec)
    cell = capacity_table.cell_for(spec)
    slices = [
        kind.status(client, spec.slice_name(i), spec.tpu.hosts, waits=spec.waits_for_capacity, cell=cell)
        for i in range(spec.slices)
    ]
    head: dict[str, Any] | None = None
    controller: dict[str, Any] | None = None
    events: list[dict[str, Any]] = []
    if spec.head == "vm":
        head_vm = names.head_name(spec.name)
        head = {"name": head_vm, "boot": boot_state(client.instance_guest_attributes(head_vm, STATE_QUERY))}
    if spec.runs_recovery:
        controller_vm = names.controller_name(spec.name)
        entries = client.instance_guest_attributes(controller_vm, NAMESPACE_QUERY)
        controller = {"name": controller_vm, "boot": boot_state(entries)}
        events = [dataclasses.asdict(e) for e in events_from_guest_attributes(entries)]
    return {
        "cluster": spec.name,
        "platform": spec.platform,
        "project": spec.project,
        "zone": spec.zone,
        "head": head,
        "controller": controller,
        "slices": slices,
        "events": events,
        "recovery": spec.runs_recovery,
    }


def render_text(data: dict[str, Any]) -> str:
    lines = [f"cluster {data['cluster']} ({data['platform']}, {data['project']}/{data['zone']})"]
    if data["head"] is not None:
        lines.append(f"head VM {data['head']['name']}: {data['head']['boot']}")
    if data["controller"] is not None:
        lines.append(f"controller VM {data['controller']['name']}: {data['controller']['boot']}")
    for item in data["slices"]:
        if "phase" in item:  # a GKE node pool
            lines += _pool_lines(item)
            continue
        meaning = f": {item['meaning']}" if item.get("meaning") else ""
        lines.append(f"slice {item['name']}: {item['state']}{meaning}")
        if item.get("request"):
            lines.append(f"  {_request_line(item['request'])}")
        for host in item["hosts"]:
            instance = f" [{host['instance']}]" if "instance" in host else ""
            lines.append(f"  worker {host['worker']} {host['name']}{instance}: {host['boot']}")
    if data.get("ray_pods"):
        pods = data["ray_pods"]
        lines.append(
            f"Ray pods: not shown ({pods['why']}); after `pulumi stack output get_credentials_command`:"
        )
        lines.append(f"  {pods['command']}")
    elif not data["recovery"]:
        lines.append("recovery: off (no controller runs for this cluster)")
    elif not data["events"]:
        lines.append("recovery events: none")
    else:
        lines.append("recovery events:")
        for event in data["events"]:
            seen = f"  {event['time']} {event['slice']}: saw {event['seen']}"
            lines.append(f"{seen}; {event['action']} -> {event['outcome']}")
    # Boot states and events come from guest attributes, which any process on a host can write:
    # shown escaped, a value cannot move the cursor, rewrite earlier lines or fake a new one.
    return "\n".join(printable.escaped(line) for line in lines)


def _pool_lines(item: dict[str, Any]) -> list[str]:
    """A GKE slice: its pool's status and phase, nodes against hosts, since when, run limit."""
    phase = item["phase"]
    if phase == MISSING:
        return [f"slice {item['name']}: node pool MISSING"]
    meaning = {
        WAITING: "waiting for capacity (flex-start: GKE adds every node at once when the zone has them)",
        PROVISIONING: "provisioning nodes",
        RUNNING: "running",
        DOWN: "down: every node stopped; "
        + (
            "GKE's auto-repair brings the slice back whole"
            if item["auto_repair"]
            else "auto-repair is off for this pool, so it stays down (flex-start: until its nodes' run ends)"
        ),
        FAILED: f"failed: {item['reason'] or 'no reason given'}",
        DELETING: "being deleted",
    }[phase]
    since = f" since {item['since']}" if item["since"] else ""
    run = f", nodes run at most {item['run_hours']:g} h" if item["run_hours"] else ""
    lines = [
        f"slice {item['name']}: node pool {item['state']}, {meaning}{since}; "
        f"{item['nodes_running']} of {item['hosts_asked']} nodes running{run}"
    ]
    lines += [f"  node {n['worker']} {n['name']} [{n['instance']}]" for n in item["hosts"]]
    return lines


def _request_line(request: dict[str, Any]) -> str:
    state = request["state"]
    waits = (
        f"fails at {request['deadline']} if still waiting"
        if request["deadline"]
        else "no deadline: waits until deleted"
    )
    meaning = {
        QUEUED_WAITING: f"waiting for capacity since {request['since']} ({waits})",
        QUEUED_ACTIVE: f"fulfilled (asked {request['since']})",
        QUEUED_FAILED: f"failed: {request['reason'] or 'no reason given'}",
        QUEUED_SUSPENDED: request["reason"] or "suspended: its node was deleted",
    }.get(state, state)
    run = f", run at most {request['run_hours']:g} h" if request["run_hours"] else ""
    hosts = f"{request['hosts_joined']} of {request['hosts_asked']} hosts joined"
    return f"{request['kind']} {request['name']}: {state}, {meaning}{run}; {hosts}"


def client_for(spec: ClusterSpec, access: clusters.CloudAccess) -> CloudClient:
    """A client for the cloud API `access` names, with its service-account key, at the spec's
    project and zone (a found cluster's: `rayslice.clusters`)."""
    session = key_file_session(access.credentials_file)
    assert spec.project is not None and spec.zone is not None  # a found cluster's config has both
    return CloudClient(session, Location(spec.project, spec.zone), environ=access.endpoints)


def _found_cluster() -> tuple[ClusterSpec, CloudClient] | None:
    """The spec and a client of the cluster a finder reports (the simulation); None if none is up."""
    found = clusters.find()
    if found is None:
        return None
    if found.cloud is None:
        raise NoCluster(f"cannot read the cloud state of {found.where}: {found.cloud_problem}")
    spec = spec_module.load(dict(found.config))
    return spec, client_for(spec, found.cloud)


@click.command("status")
@spec_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the same data).")
def status_command(stack_file: str | None, overrides: tuple[str, ...], as_json: bool) -> int:
    """Show each slice's state, each host's boot state and the recovery events, from the cloud.

    Without --stack-file and --set: the simulated cluster of `rayslice local up`, if one is up.
    """
    named = stack_file is not None or bool(overrides)
    found = None if named else _found_cluster()
    if found is not None:
        spec, client = found
    elif not named:
        raise InvalidInput(
            "rayslice status needs a cluster: pass --stack-file Pulumi.<stack>.yaml (or --set project=ID "
            "--set zone=Z ...), or start a simulated cluster with `rayslice local up`"
        )
    else:
        spec = load_spec(stack_file, overrides)
        if spec.project is None:
            raise InvalidInput(
                "rayslice status needs the project: set rayslice:project or gcp:project (or --set project=ID)"
            )
        assert spec.zone is not None  # load_spec(require_zone=True) refuses a spec without one
        client = CloudClient(default_session(), Location(spec.project, spec.zone))
    data = gather(client, spec)
    click.echo(json.dumps(data, indent=2) if as_json else render_text(data))
    return EXIT_OK
