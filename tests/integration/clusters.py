"""Simulated clusters for the integration tests: short Ray timeouts, waits on state, shared clusters.

Tests that only read a cluster share one per shape and platform (`SHARED`). A test names its
shape with `on(shape)`, which passes it to the session-scoped `cluster` fixture (conftest.py) as
an indirect parameter: pytest then runs every test of that shape together, whatever its module,
boots the cluster once before the first and removes it after the last.

Hosts that tests boot get `SHORT_WAITS` in their environment: how soon the head's GCS declares a
powered-off node dead, how soon a worker's raylet gives up on a GCS that went away, and the
recovery controller's interval, shortened so that a preemption or a head restart settles in
seconds. The production defaults stay in the boot script and in `rayslice local up`, which the
README's slice runs on (test_readme.py checks that its Ray runs without these overrides,
test_faults.py that the overrides reach Ray).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from rayslice import spec as spec_module
from rayslice.local.host import netns
from rayslice.local.simulation.simulator import Simulation
from rayslice.names import STATE_JOINED

RAYSLICE = str(Path(sys.executable).with_name("rayslice"))
RECOVERY_INTERVAL_S = 2
SHORT_WAITS = {
    # The GCS marks a node that stopped answering dead after period x threshold (default 3 s x 5).
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    # A head restart: a worker's raylet exits once the GCS has been unreachable this long, and its
    # supervisor starts Ray again against the new head. With the default (60 s) the raylet notices
    # only then, even when the GCS came back sooner as a new cluster. A head's Ray is away longer
    # than 5 s whenever it restarts (`ray stop`, the supervisor's delay, `ray start`). Measured
    # with Ray 2.60 on a v5p-16: its worker rejoined 73 s after the restart by default, 37 s so.
    "RAY_gcs_rpc_server_reconnect_timeout_s": "5",
    # Metrics no test reads: by default each node's raylet and workers collect and report them
    # every 10 s and its dashboard agent's reporter sweeps the node's processes every 5 s (Ray
    # 2.60), CPU the 2-core machine's other hosts and jobs need.
    "RAY_enable_metrics_collection": "0",
    "RAY_metrics_report_interval_ms": "60000",
    "REPORTER_UPDATE_INTERVAL_MS": "60000",
    # Each node's log monitor lists the node's log files on every turn of its 0.1 s loop while it
    # watches fewer than this many, else at most every 0.5 s (Ray 2.60, ray/_private/log_monitor.py).
    # An idle head's log monitor used 0.26 CPU-s in 30 s with the default (1000), 0.18 with 0.
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    # How often the recovery controller looks (the simulator's own default is 5 s, the cloud's
    # 30 s); only the controller VM's script reads it.
    "RAYSLICE_RECOVERY_INTERVAL_S": str(RECOVERY_INTERVAL_S),
    # How often an elastic cluster's head publishes Ray's demand (the default is 5 s); only the
    # head's demand publisher reads it.
    "RAYSLICE_DEMAND_INTERVAL_S": "2",
}

SHARED: dict[str, dict[str, object]] = {
    # One host, 4 chips, its own head: the smallest cluster a job runs on.
    "v6e-4": {"acceleratorType": "v6e-4"},
    # The smallest multi-host slice on TPU VMs: 2 hosts x 4 chips, the head on worker 0.
    "v5p-16 tpu-vm": {"acceleratorType": "v5p-16", "platform": "tpu-vm"},
    # Multislice behind a CPU head VM, on Spot (so the head runs the recovery controller): the
    # cluster of the recovery acceptance test, which leaves it whole again. Two slices of the
    # smallest multi-host shape Compute Engine offers (TPU7x, 2 hosts each): every test on it needs
    # two multi-host slices, none four hosts to a slice (Ray's subslice placement, which does, runs
    # on test_faults.py's v6e-16). Two v6e-16 slices (8 hosts) cost the suite about 120 CPU-s more.
    "2 x tpu7x-16 spot": {
        "platform": "compute",
        "acceleratorType": "tpu7x-16",
        "slices": 2,
        "capacity": "spot",
    },
}


# Ray's own metrics, on the one shared cluster whose test reads them: each node's Ray exports its
# gauges (the tpu_* ones its agent fills from the host's TPU metrics endpoint) at the node's
# metrics export port, which test_tpu_runtime.py scrapes while `jax_train` runs (issue 42's first
# done-when). The agent's reporter then reads the endpoint every 2 s instead of every minute.
RAY_METRICS_ON = {
    "RAY_enable_metrics_collection": "1",
    "RAY_metrics_report_interval_ms": "2000",
    "REPORTER_UPDATE_INTERVAL_MS": "2000",
}
SHARED_ENVIRONMENT: dict[str, dict[str, str]] = {"v6e-4": RAY_METRICS_ON}


def _environment(sim: Simulation) -> dict[str, str]:
    """`SHORT_WAITS`, and what `SHARED_ENVIRONMENT` adds when `sim` is that shared cluster."""
    for shape, extra in SHARED_ENVIRONMENT.items():
        if spec_module.load(SHARED[shape], require_zone=False).as_config() == sim.plan.config:
            return {**SHORT_WAITS, **extra}
    return SHORT_WAITS


def on(shape: str) -> pytest.MarkDecorator:
    """Run the test on the shared cluster `shape` (a key of `SHARED`), given as `cluster`."""
    assert shape in SHARED, shape
    return pytest.mark.parametrize("cluster", [shape], indirect=True)


def boot(sim: Simulation, names: Collection[str] | None = None) -> None:
    """Power on `names` (default: every machine, the controller VM too) with `SHORT_WAITS` (and,
    on a shared cluster, what `SHARED_ENVIRONMENT` adds)."""
    env = _environment(sim)
    for name in names if names is not None else [h.name for h in sim.plan.machines]:
        sim.boot(name, env=env)


def tpu_nodes(sim: Simulation) -> list[dict[str, Any]]:
    """The alive Ray nodes with TPU chips; none while the head does not answer."""
    try:
        return [n for n in sim.ray_nodes() if n["resources"].get("TPU")]
    except OSError:
        return []


def wait_nodes(
    sim: Simulation, ips: Collection[str], timeout: float, avoid: Collection[str] = ()
) -> list[dict[str, Any]]:
    """Wait until the alive TPU nodes are one per address in `ips`, none with an id in `avoid`."""
    deadline = time.monotonic() + timeout
    nodes: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        nodes = tpu_nodes(sim)
        if sorted(n["ip"] for n in nodes) == sorted(ips) and not set(avoid) & {n["id"] for n in nodes}:
            return nodes
        time.sleep(1)
    raise AssertionError(
        f"expected nodes {sorted(ips)}, saw {[(n['ip'], n['id'][:8]) for n in nodes]}\n{sim.report()}"
    )


def bring_up(sim: Simulation, timeout: float = 600) -> None:
    """Boot every host, wait until all joined and the head lists each one as an alive Ray node."""
    boot(sim)
    sim.wait_for(lambda states: all(s == STATE_JOINED for s in states.values()), timeout=timeout)
    deadline = time.monotonic() + 120
    while len(_alive(sim)) != len(sim.plan.hosts):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"alive Ray nodes: {_alive(sim)}; hosts: {[h.ip for h in sim.plan.hosts]}\n{sim.report()}"
            )
        time.sleep(1)


def raylet_environment(sim: Simulation, host: str) -> dict[str, str]:
    """The environment of the raylet running on `host` (found in the host's network namespace)."""
    for pid in netns.netns_pids(sim.plan.host(host).netns):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if Path(argv[0].decode()).name == "raylet":
                environ = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
                return dict(e.split("=", 1) for e in environ if "=" in e)
        except OSError:
            continue
    raise AssertionError(f"no raylet runs on {host}")


def _alive(sim: Simulation) -> list[str]:
    try:
        return [n["ip"] for n in sim.ray_nodes()]
    except OSError:
        return []


def run_command(sim: Simulation, target: str, *job_args: str) -> tuple[list[str], dict[str, str]]:
    """`rayslice run TARGET --address URL [--token-file F] [-- JOB_ARGS]`, as a user types it, and
    the plain environment it runs in (PYTHONPATH only when the tests run another checkout than the
    venv's editable install, a worktree, so that `rayslice run` ships that checkout's workloads)."""
    argv = [RAYSLICE, "run", target, "--address", sim.dashboard_url()]
    if sim.token_file.exists():
        argv += ["--token-file", str(sim.token_file)]
    argv += ["--", *job_args] if job_args else []
    env = {"PATH": str(Path(sys.executable).parent), "HOME": os.environ.get("HOME", "/root")}
    env |= {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}
    return argv, env


def rayslice_run(
    sim: Simulation, target: str, *job_args: str, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`run_command`, run to its end."""
    argv, env = run_command(sim, target, *job_args)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    print(result.stdout[-5000:], result.stderr[-3000:])  # shown when a test fails
    return result
