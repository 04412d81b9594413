"""Recovery on real namespaces, with the real boot script on every host: the simulated head VM's
boot script writes the controller from its metadata and runs it as its second supervised service,
as on a cloud VM (Application Default Credentials from the head's metadata server, the API through
the endpoint override, events to the head's log and guest attributes); the cloud API emulation
that `Simulation.create` starts runs beside the simulation on its bridge; `rayslice local preempt`
powers a slice off; the controller notices by itself and recreates it, its hosts boot again and
rejoin Ray; `rayslice status` shows the preemption and the recreation; `rayslice local down`
stops everything and removes the emulation's files.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rayslice import cli, names, spec
from rayslice.local.host.processes import is_alive
from rayslice.local.simulation import cloud_bridge, state
from rayslice.local.simulation.power import LOCAL_RECOVERY_INTERVAL_S
from rayslice.local.simulation.simulator import Simulation
from tests.bench import load


def _boots(sim: Simulation, host: str) -> int:
    """How often the host's startup script ran (its console log, as GCE's serial port shows it)."""
    return sim.paths(host).console.read_text().count("running startup-script")


def _status(sim: Simulation, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """`rayslice status --json` against the simulation, with the owner's credentials for the
    emulation and its endpoint overrides, and every name derived from the spec's --set keys."""
    cluster = sim.spec()
    endpoint = json.loads((sim.state_dir / cloud_bridge.ENDPOINT_FILE).read_text())
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(sim.state_dir / cloud_bridge.CREDENTIALS_FILE))
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    for key, value in endpoint["env"].items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    keys = {
        "project": cloud_bridge.project_of(cluster),
        "zone": str(cluster.zone),
        "platform": cluster.platform,
        "acceleratorType": cluster.accelerator_type,
        "slices": str(cluster.slices),
        "capacity": cluster.capacity,
    }
    sets = [arg for key, value in keys.items() for arg in ("--set", f"{key}={value}")]
    assert cli.main(["status", *sets, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _wait(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.3)


@pytest.mark.parametrize("platform", ["compute", "tpu-vm"])
def test_a_preempted_slice_is_recreated_by_the_controller_on_the_head_vm(
    simulation_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], platform: str
) -> None:
    accelerator = "v6e-8" if platform == "compute" else "v5litepod-8"
    cluster = spec.load(
        {"platform": platform, "acceleratorType": accelerator, "slices": 2, "capacity": "spot"},
        require_zone=False,
    )
    sim = Simulation.create(cluster, simulation_dir)
    sim.boot_all()
    _wait(lambda: all(v == "joined" for v in sim.states().values()), 300)

    bridge = sim.state.processes[state.CLOUD_API_PROCESS]  # started and recorded by `create`
    assert is_alive(bridge)
    head = sim.plan.head.name
    assert head == names.head_name(cluster.name)
    # The head's boot script started the controller as its second service, from the bundle.
    head_root = sim.paths(head).root
    log = head_root / "var/log/rayslice/recovery-events.jsonl"
    _wait(lambda: "recovery: watching 2 slice(s)" in (head_root / "var/log/rayslice/boot.log").read_text())
    assert (head_root / "opt/rayslice/recovery.pyz").read_bytes().startswith(b"PK")

    def events() -> list[dict[str, str]]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    time.sleep(2 * LOCAL_RECOVERY_INTERVAL_S)
    assert events() == []  # healthy: nothing to do, nothing recorded

    victims = cloud_bridge.slice_hosts(sim.plan, 1)
    assert cli.main(["local", "preempt", "--state-dir", str(simulation_dir), "rayslice-slice-1"]) == 0
    assert not any(sim.running(h) for h in victims)
    assert all(sim.running(h) for h in cloud_bridge.slice_hosts(sim.plan, 0))

    # The controller notices on its own, within its interval, and recreates the slice; its hosts
    # boot a second time and rejoin Ray, the other slice's hosts are untouched.
    _wait(lambda: all(_boots(sim, h) == 2 for h in victims), 120)
    _wait(lambda: len(events()) == 1, 60)
    _wait(lambda: sum(1 for n in sim.ray_nodes() if n["resources"].get("TPU")) == 2, 240)
    time.sleep(2 * LOCAL_RECOVERY_INTERVAL_S)  # whole again: no further events
    assert [(e["slice"], e["action"], e["outcome"]) for e in events()] == [
        ("rayslice-slice-1", "recreate", "recreated")
    ]
    assert all(_boots(sim, h) == 1 for h in [head, *cloud_bridge.slice_hosts(sim.plan, 0)])
    stored = [k for k in sim.guest_attributes(head) if k.startswith("recovery-")]
    assert len(stored) == 1  # recorded once, on the head VM, through its metadata server

    data = _status(sim, monkeypatch, capsys)
    assert [s["state"] for s in data["slices"]] == ["READY", "READY"]
    assert {h["boot"] for s in data["slices"] for h in s["hosts"]} == {"joined"}
    assert [(e["slice"], e["outcome"]) for e in data["events"]] == [("rayslice-slice-1", "recreated")]
    assert data["events"][0]["seen"] == events()[0]["seen"]

    # `rayslice local down` stops the emulation by its recorded PID and removes its files.
    assert cli.main(["local", "down", "--state-dir", str(simulation_dir)]) == 0
    assert not is_alive(bridge)
    assert not any((simulation_dir / name).exists() for name in state.CLOUD_API_FILES)
    assert not os.path.exists(simulation_dir / state.STATE_FILE)


def _fresh_loss() -> float:
    """jax_train's loss at step 0 from scratch (one CPU process): what a run that lost its
    checkpoint would start from."""
    code = "from rayslice.workloads.jax_train import train; print(train(steps=2).losses[0])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return float(result.stdout.split()[-1])


def test_acceptance_spot_slices_heal_and_the_training_job_resumes_from_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The recovery issue's acceptance: head VM + 2 x v6e-16 Spot on compute; `rayslice run
    jax_train --max-restarts 2 -- --steps 60 --checkpoint-dir D --checkpoint-every 10` on slice 1;
    `rayslice local preempt` of that slice once step 20 is saved. Nothing else is done by hand."""
    recovery = load("recovery")  # its scenario is this test; the benchmark times it
    checkpoints = Path(tempfile.mkdtemp(prefix="rayslice-checkpoints-", dir="/var/tmp"))  # seen by all hosts
    sim, _ = recovery.bring_up(recovery.cluster_spec("compute"), tmp_path / "sim")
    try:
        trace = recovery.preempt_during_training(sim, checkpoints)
        out = trace.output
        print(out[-5000:], trace.stderr[-5000:])  # shown when the test fails
        assert trace.returncode == 0
        # rayslice run told the node deaths apart, waited for the slice, resubmitted once.
        assert re.search(r"^restart 1 of 2 after .+", out, re.M)
        assert "restart 2 of 2" not in out
        [resumed] = {int(k) for k in recovery.RESUMED.findall(out)}
        assert resumed >= recovery.PREEMPT_AFTER_STEP
        steps = [int(n) for n in re.findall(r"^step +(\d+) +loss", out, re.M)]
        assert steps == list(range(resumed, 60))  # the resumed run's steps, to the end
        curve = [float(x) for x in re.findall(r"^step +\d+ +loss ([0-9.]+)$", out, re.M)]
        assert curve[0] < _fresh_loss()  # it went on from the checkpoint, not from scratch
        assert sum(curve[-3:]) / 3 < curve[0]  # and kept falling
        # The controller recreated exactly the preempted slice, once; status shows it.
        data = _status(sim, monkeypatch, capsys)
        assert [s["state"] for s in data["slices"]] == ["READY", "READY"]
        assert [(e["slice"], e["action"], e["outcome"]) for e in data["events"]] == [
            (trace.victim, "recreate", "recreated")
        ]
        assert data["events"][0]["seen"].startswith("MIG ")
    finally:
        sim.destroy()
        shutil.rmtree(checkpoints, ignore_errors=True)
