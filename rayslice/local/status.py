"""What `rayslice local status` shows: hosts, roles, boot states, Ray nodes and resources.

`status_report` gathers it as plain data (the ``--json`` form); `format_report` lays it out.
Ray's view comes from the head's dashboard API over the bridge, so nothing runs inside a host.
"""

from __future__ import annotations

import urllib.error
from collections import Counter

from rayslice.local.simulator import Simulation


def status_report(sim: Simulation) -> dict:
    spec = sim.spec()
    hosts, states = [], sim.states()
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
    }
    try:
        nodes = sim.ray_nodes()
    except (OSError, urllib.error.URLError, KeyError, ValueError) as exc:
        report["ray"] = {"error": f"head dashboard not reachable: {exc}"}
        return report
    totals: Counter[str] = Counter()
    for node in nodes:
        totals.update(node["resources"])
    report["ray"] = {"nodes": nodes, "totals": dict(sorted(totals.items()))}
    return report


def format_report(report: dict) -> str:
    lines = [
        f"simulation {report['run_id']}: {report['slices']} x {report['accelerator_type']}, "
        f"head={report['head']}, network {report['network']}, dashboard {report['dashboard']}"
    ]
    rows = [("HOST", "ROLE", "IP", "UP", "STATE")]
    rows += [
        (h["name"], h["role"], h["ip"], "yes" if h["running"] else "no", h["state"] or "-")
        for h in report["hosts"]
    ]
    lines += _table(rows)
    ray = report["ray"]
    if "error" in ray:
        lines.append(f"Ray: {ray['error']}")
        return "\n".join(lines)
    lines.append(f"Ray: {len(ray['nodes'])} node(s) alive")
    rows = [("NODE IP", "RESOURCES")]
    rows += [(n["ip"], _resources(n["resources"])) for n in sorted(ray["nodes"], key=lambda n: n["ip"])]
    lines += _table(rows)
    lines.append(f"cluster: {_resources(ray['totals'])}")
    return "\n".join(lines)


def _resources(resources: dict[str, float]) -> str:
    shown = {
        k: v for k, v in resources.items() if not k.startswith(("node:", "memory", "object_store_memory"))
    }
    return ", ".join(f"{k} {v:g}" for k, v in sorted(shown.items()))


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
