"""How soon Ray sees a preempted slice, with the preemption notice and without, in one run.

The cluster is the smallest Spot multislice: a CPU head VM and two single-host v5litepod-8 Spot
slices on TPU VMs (the real boot script on every host, Ray's own defaults: the GCS declares a
silent node dead after 3 s x 5 health checks). Slice 1 is preempted twice with
``rayslice local preempt``:

* without notice (``--notice-s 0``, the baseline): the hosts power off at once, and Ray learns of
  it only when the GCS's health checks fail;
* with GCE's notice (``--notice-s 30``, Google's window): each host's ``instance/preempted``
  turns TRUE, its preemption watcher drains its Ray node with reason
  DRAIN_NODE_REASON_PREEMPTION, and the hosts power off 30 s later.

Between the two the recovery controller recreates the slice and its host rejoins. The clock of
each starts when the preemption is requested (the notice, where there is one) and stops when
the head's GCS no longer offers the slice's nodes for scheduling: draining (`get_draining_nodes`)
or no longer alive. Also shown: when the GCS lists them dead. Printed: both times and their ratio.

Run as root: ``.venv/bin/python bench/preemption_notice.py`` (a few minutes). With
``--state-dir DIR --slice NAME`` it preempts one slice of a running simulation instead and prints
what it saw as JSON (tests/integration/test_recovery.py runs it so, keeping Ray's token settings
out of the test's own process).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ray._raylet import Config  # type: ignore[attr-defined]  # compiled: mypy cannot see it
from recovery import wait

from rayslice import cli, names
from rayslice import spec as spec_module
from rayslice.local.simulation import cloud_bridge
from rayslice.local.simulation.simulator import Simulation
from rayslice.startup_scripts.preemption_watcher import GcsClient, GcsNodeInfo

BRING_UP_TIMEOUT_S = 600
SEEN_TIMEOUT_S = 300
SPEC = {"platform": "tpu-vm", "acceleratorType": "v5litepod-8", "slices": 2, "capacity": "spot"}


@dataclass
class Loss:
    """Seconds from the preemption request until Ray stopped scheduling on the slice, until the
    hosts were off (`rayslice local preempt` returned) and until the GCS listed its nodes dead."""

    notice_s: float
    unschedulable_s: float
    off_s: float
    dead_s: float


class Gcs:
    """The head's GCS, read from this machine with the simulation's Ray token."""

    def __init__(self, sim: Simulation):
        if sim.token_file.exists():
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ["RAY_AUTH_TOKEN_PATH"] = str(sim.token_file)
            # Ray caches its config (the auth mode with it) when it is imported; this reloads it
            # from the environment, as Ray's own `_enable_token_auth` does
            # (ray/_private/authentication/authentication_token_setup.py).
            Config.initialize("")
        self.client = GcsClient(address=f"{sim.plan.head.ip}:{names.GCS_PORT}")

    def alive(self, ips: set[str]) -> set[str]:
        nodes = self.client.get_all_node_info(timeout=5, state_filter=GcsNodeInfo.GcsNodeState.ALIVE)
        return {i.node_id.hex() for i in nodes.values() if i.node_manager_address in ips}

    def draining(self) -> set[str]:
        return set(self.client.get_draining_nodes(timeout=5))


def preempt(sim: Simulation, gcs: Gcs, victim: str, notice_s: float) -> Loss:
    ips = {sim.plan.host(h).ip for h in cloud_bridge.slice_hosts(sim.plan, int(victim.rsplit("-", 1)[1]))}
    watched = gcs.alive(ips)
    assert watched, f"no alive Ray node on {victim}"
    argv = ["local", "preempt", "--state-dir", str(sim.state_dir), "--notice-s", str(notice_s), victim]
    outcome: list[int] = []
    start = time.monotonic()
    command = threading.Thread(target=lambda: outcome.append(cli.main(argv)))
    command.start()
    unschedulable = off = dead = 0.0
    while not dead:
        if time.monotonic() - start > SEEN_TIMEOUT_S:
            raise TimeoutError(f"Ray did not see {victim} go within {SEEN_TIMEOUT_S} s")
        if not off and not command.is_alive():
            off = time.monotonic() - start
        alive = gcs.alive(ips) & watched
        if not unschedulable and alive <= gcs.draining():
            unschedulable = time.monotonic() - start
        if not alive:
            dead = time.monotonic() - start
        time.sleep(0.1)
    command.join()
    off = off or time.monotonic() - start
    if outcome != [0]:
        raise RuntimeError(f"rayslice local preempt {victim} failed")
    return Loss(notice_s, unschedulable, off, dead)


def rejoined(sim: Simulation, gcs: Gcs, victim: str, before: set[str]) -> None:
    index = int(victim.rsplit("-", 1)[1])
    ips = {sim.plan.host(h).ip for h in cloud_bridge.slice_hosts(sim.plan, index)}
    wait(
        lambda: bool(gcs.alive(ips)) and not gcs.alive(ips) & before,
        BRING_UP_TIMEOUT_S,
        f"{victim} rejoining",
    )


def report(baseline: Loss, noticed: Loss, date: str) -> str:
    rows = [
        ("no notice (power-off at once): until unschedulable", baseline.unschedulable_s),
        ("no notice: until the GCS lists the node dead", baseline.dead_s),
        (f"notice {noticed.notice_s:.0f} s: until unschedulable (drained)", noticed.unschedulable_s),
        (f"notice {noticed.notice_s:.0f} s: until dead (after the power-off)", noticed.dead_s),
    ]
    lines = [f"Ray seeing a preempted slice, simulator: head VM + 2 x v5litepod-8 Spot (tpu-vm), {date}"]
    lines += [f"{label:58} {seconds:7.1f} s" for label, seconds in rows]
    ratio = baseline.unschedulable_s / noticed.unschedulable_s
    lines.append(f"{'loss seen (unschedulable), no notice / notice':58} {ratio:7.1f} x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--notice-s", type=float, default=names.PREEMPTION_NOTICE_S)
    parser.add_argument("--state-dir", type=Path, help="preempt one slice of this running simulation")
    parser.add_argument("--slice", help="with --state-dir: the slice to preempt")
    args = parser.parse_args(argv)
    if args.state_dir is not None:
        sim = Simulation.open(args.state_dir)
        print(json.dumps(dataclasses.asdict(preempt(sim, Gcs(sim), args.slice, args.notice_s))))
        return 0
    spec = spec_module.load(dict(SPEC), require_zone=False)
    victim = spec.slice_name(1)
    with tempfile.TemporaryDirectory(prefix="rayslice-bench-") as tmp:
        sim = Simulation.create(spec, Path(tmp) / "sim")
        try:
            sim.boot_all()
            total = spec.total_hosts + 1  # and the head VM
            wait(lambda: len(_alive_all(sim)) == total, BRING_UP_TIMEOUT_S, "bring-up")
            gcs = Gcs(sim)
            first = gcs.alive({h.ip for h in sim.plan.hosts})
            baseline = preempt(sim, gcs, victim, 0)
            rejoined(sim, gcs, victim, first)
            noticed = preempt(sim, gcs, victim, args.notice_s)
        finally:
            sim.destroy()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(report(baseline, noticed, date))
    return 0


def _alive_all(sim: Simulation) -> list[object]:
    try:
        return list(sim.ray_nodes())
    except (OSError, ValueError, KeyError):
        return []


if __name__ == "__main__":
    sys.exit(main())
