"""What `rayslice local status` shows: hosts, roles, boot states, each host's Ray nodes, resources,
and the cloud's view: each slice's state and the recovery events, as `rayslice status` shows them.

`status_report` gathers it as plain data (the ``--json`` form); `format_report` lays it out.
Ray's view comes from the head's dashboard API over the bridge, so nothing runs inside a host and
no root is needed: only the state dir and the dashboard are read. The cloud's view comes from the
simulation's cloud API emulation, read with the credentials it made for the simulation's owner
(`cloud_bridge.cloud_access`) through `rayslice status`'s own `gather`, so a preemption and the
controller's recreation show here as they do there.

Each running TPU host's chips (duty cycle, HBM) come from its metrics endpoint, every host asked
at once with a time-out (`rayslice.chip_metrics`).

Ray nodes are shown per host, matched by IP. A host that was rebooted comes back as a new Ray
node while Ray still lists the old one as alive until its heartbeats time out; on one host only
the newest node (by its start time) is current, and only while the host runs. Every other node
on that host reads as ``stale``, so a 4-host slice never looks like 5 nodes.
"""

from __future__ import annotations

import urllib.error
from collections import Counter
from typing import Any

from rayslice import chip_metrics
from rayslice import spec as spec_module
from rayslice.errors import RaysliceError
from rayslice.local.simulation.cloud_bridge import cloud_access, cloud_config
from rayslice.local.simulation.simulator import Simulation
from rayslice.local.simulation.state import ROLE_HEAD, ROLE_WORKER
from rayslice.recovery.commands import client_for, gather, render_text

CURRENT = "current"
STALE = "stale"


def mark_nodes(hosts: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each node with the host it runs on (by IP) and whether it is `CURRENT` or `STALE`."""
    by_ip = {h["ip"]: h for h in hosts}
    marked = []
    newest: dict[str, dict[str, Any]] = {}
    for node in nodes:
        host = by_ip.get(node["ip"])
        if host is not None and host["running"]:
            best = newest.get(node["ip"])
            if best is None or (node.get("start_time_ms") or 0) > (best.get("start_time_ms") or 0):
                newest[node["ip"]] = node
    for node in nodes:
        host = by_ip.get(node["ip"])
        marked.append(
            {
                **node,
                "host": host["name"] if host is not None else None,
                "status": CURRENT if newest.get(node["ip"]) is node else STALE,
            }
        )
    return marked


def status_report(sim: Simulation) -> dict:
    spec = sim.spec()
    hosts: list[dict[str, Any]] = []
    states = sim.states()
    for host in sim.plan.hosts:
        hosts.append(
            {
                "name": host.name,
                "role": host.role,
                "ip": host.ip,
                "slice": host.slice_index,
                "worker": host.worker,
                "netns": host.netns,
                "running": sim.running(host.name),
                "state": states[host.name],
                "guest_attributes": sim.guest_attributes(host.name),
                "startup_script_exit": sim.script_exit(host.name),
            }
        )
    report: dict = {
        "run_id": sim.plan.run_id,
        "accelerator_type": spec.accelerator_type,
        "slices": spec.slices,
        "head": spec.head,
        "network": sim.plan.network,
        "dashboard": sim.dashboard_url(),
        "state_dir": str(sim.state_dir),
        "hosts": hosts,
        "cloud": cloud_report(sim),
        "chips": chip_metrics.read_hosts(
            {h["name"]: h["ip"] for h in hosts if h["running"] and h["role"] in (ROLE_HEAD, ROLE_WORKER)}
        ),
    }
    try:
        nodes = sim.ray_nodes()
    except PermissionError as exc:
        report["ray"] = {
            "error": f"cannot read the cluster's token ({exc.filename}); run as its owner or root"
        }
        return report
    except (OSError, urllib.error.URLError, KeyError, ValueError) as exc:
        report["ray"] = {"error": f"head dashboard not reachable: {exc}"}
        return report
    marked = mark_nodes(hosts, nodes)
    totals: Counter[str] = Counter()
    for node in marked:
        if node["status"] == CURRENT:
            totals.update(node["resources"])
    for row in hosts:
        row["ray_nodes"] = [
            {"id": n["id"], "status": n["status"]} for n in marked if n["host"] == row["name"]
        ]
    report["ray"] = {"nodes": marked, "totals": dict(sorted(totals.items()))}
    return report


def cloud_report(sim: Simulation) -> dict[str, Any]:
    """`rayslice status --json`'s data for the simulation; {"error": why} when it cannot be read."""
    try:
        spec = spec_module.load(cloud_config(sim.spec()))
        return gather(client_for(spec, cloud_access(sim.state_dir)), spec)
    except RaysliceError as exc:
        return {"error": str(exc)}


def format_report(report: dict) -> str:
    lines = [
        f"simulation {report['run_id']}: {report['slices']} x {report['accelerator_type']}, "
        f"head={report['head']}, network {report['network']}, dashboard {report['dashboard']}"
    ]
    ray = report["ray"]
    reachable = "error" not in ray
    rows = [("HOST", "ROLE", "IP", "UP", "STATE", *(("RAY NODE",) if reachable else ()))]
    for h in report["hosts"]:
        row: tuple[str, ...] = (
            h["name"],
            h["role"],
            h["ip"],
            "yes" if h["running"] else "no",
            h["state"] or "-",
        )
        if reachable:
            row += (_host_nodes(h.get("ray_nodes", [])),)
        rows.append(row)
    lines += _table(rows)
    lines += _ray_lines(report) if reachable else [f"Ray: {ray['error']}"]
    if report.get("chips"):
        lines += chip_metrics.chip_lines(report["chips"])
    cloud = report["cloud"]
    lines.append(f"cloud API: {cloud['error']}" if "error" in cloud else render_text(cloud))
    return "\n".join(lines)


def _ray_lines(report: dict) -> list[str]:
    ray = report["ray"]
    lines: list[str] = []
    current = [n for n in ray["nodes"] if n["status"] == CURRENT]
    stale = [n for n in ray["nodes"] if n["status"] == STALE]
    summary = f"Ray: {len(current)} of {len(report['hosts'])} host(s) have a current node"
    if stale:
        summary += (
            f"; {len(stale)} stale node(s) from a host that was powered off or rebooted "
            "(Ray drops them when their heartbeats time out)"
        )
    lines.append(summary)
    rows: list[tuple[str, ...]] = [("NODE IP", "HOST", "RESOURCES")]
    rows += [
        (n["ip"], n["host"] or "(not a simulated host)", _resources(n["resources"]))
        for n in sorted(current, key=lambda n: n["ip"])
    ]
    lines += _table(rows)
    lines.append(f"cluster: {_resources(ray['totals'])}")
    return lines


def _host_nodes(nodes: list[dict[str, Any]]) -> str:
    current = [n for n in nodes if n["status"] == CURRENT]
    stale = [n for n in nodes if n["status"] == STALE]
    parts = [f"{n['id'][:8]} current" for n in current]
    if stale:
        parts.append(f"{len(stale)} stale")
    return ", ".join(parts) or "-"


def _resources(resources: dict[str, float]) -> str:
    shown = {
        k: v for k, v in resources.items() if not k.startswith(("node:", "memory", "object_store_memory"))
    }
    return ", ".join(f"{k} {v:g}" for k, v in sorted(shown.items()))


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
