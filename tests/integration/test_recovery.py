"""Recovery on real namespaces, with the real boot script on every host: the simulated controller
VM, a machine of its own beside the Ray hosts, boots the controller's script, which writes the
controller from its metadata (its hash checked) and runs it under its supervisor, as on a cloud VM
(Application Default Credentials from the controller VM's metadata server, bound to the
controller's roles in the emulation's IAM, the API through the endpoint override, events to the
controller VM's log and guest attributes); the head VM runs Ray only; the cloud API emulation
that `Simulation.create` starts runs beside the simulation on its bridge; `rayslice local preempt`
powers a slice off; the controller notices by itself and recreates it, its hosts boot again and
rejoin Ray; `rayslice status` shows the preemption and the recreation; `rayslice local down`
stops everything and removes the emulation's files.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rayslice import cli, names, spec
from rayslice.cloud.rest import COMPUTE_ENDPOINT_ENV, TPU_ENDPOINT_ENV
from rayslice.local.host.processes import is_alive
from rayslice.local.simulation import cloud_bridge, state
from rayslice.local.simulation.simulator import Simulation
from rayslice.workloads import jax_trainer
from tests.bench import BENCH, load
from tests.integration.clusters import RECOVERY_INTERVAL_S, bring_up, on, run_command, tpu_nodes, wait_nodes

NOTICE_S = 5  # the preemption notice's window in these tests (Google's is 30 s)
# The acceptance test's training run gets a shorter one: its job (60 steps, preempted at step 20)
# trains its last 40 steps in about 4 s on an idle machine, so a 5 s notice let it finish before the
# power-off, with no node lost and no restart to check. Its hosts' watchers drained their nodes
# within 30 ms of the notice in a traced run, so 1 s still leaves the drain before the power-off.
TRAINING_NOTICE_S = 1


def _boot_log(sim: Simulation, host: str) -> str:
    return (sim.paths(host).root / "var/log/rayslice/boot.log").read_text()


def _boots(sim: Simulation, host: str) -> int:
    """How often the host's startup script ran (its console log, as GCE's serial port shows it)."""
    return sim.paths(host).console.read_text().count("running startup-script")


def _status(sim: Simulation, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """Plain `rayslice status --json`, as a new user types it after `rayslice local up`: no
    environment of the cloud, no --set keys; it finds the simulation in the default state dir."""
    monkeypatch.setenv(state.STATE_DIR_ENV, str(sim.state_dir))
    for variable in ("GOOGLE_APPLICATION_CREDENTIALS", TPU_ENDPOINT_ENV, COMPUTE_ENDPOINT_ENV):
        monkeypatch.delenv(variable, raising=False)
    capsys.readouterr()
    assert cli.main(["status", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _wait(condition: Callable[[], bool], timeout: float = 60, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.3)


def _controller(sim: Simulation) -> str:
    assert sim.plan.controller is not None
    return sim.plan.controller.name


def _events(sim: Simulation) -> list[dict[str, str]]:
    """The controller's events, from the controller VM's event log."""
    log = sim.paths(_controller(sim)).root / "var/log/rayslice/recovery-events.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _watching_since(sim: Simulation) -> float | None:
    """When the controller VM's script started the controller (its log line), as epoch seconds."""
    boot_log = sim.paths(_controller(sim)).root / "var/log/rayslice/boot.log"
    lines = [line for line in boot_log.read_text().splitlines() if "recovery: watching" in line]
    return _epoch(lines[-1].split()[0]) if lines else None


def _epoch(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _controller_started(sim: Simulation, slices: int) -> None:
    """The controller VM's script started the controller from the bundle, on its own VM, and the
    controller has looked at the healthy slices for two intervals without recording anything.
    The head VM runs Ray only: no controller, no bundle there."""
    controller = _controller(sim)
    assert (
        controller == names.controller_name(sim.spec().name) and state.ROLE_CONTROLLER_VM == "controller-vm"
    )
    root = sim.paths(controller).root
    _wait(lambda: f"recovery: watching {slices} slice(s)" in (root / "var/log/rayslice/boot.log").read_text())
    assert (root / "opt/rayslice/recovery.pyz").read_bytes().startswith(b"PK")
    assert sim.guest_attributes(controller)[names.STATE_KEY] == names.STATE_WATCHING
    head_root = sim.paths(sim.plan.head.name).root
    assert not (head_root / "opt/rayslice/recovery.pyz").exists()
    assert "recovery" not in (head_root / "var/log/rayslice/boot.log").read_text()
    since = _watching_since(sim)
    assert since is not None
    _wait(lambda: time.time() - since > 2 * RECOVERY_INTERVAL_S + 1)
    assert _events(sim) == []  # healthy: nothing to do, nothing recorded


def _recorded_once(sim: Simulation, victim: str) -> None:
    """Every host has published `joined` again; exactly one event, a recreation of `victim`, still
    alone two intervals later (whole again: nothing more to do), and stored once on the controller
    VM through its metadata server."""
    sim.wait_for(lambda states: all(s == names.STATE_JOINED for s in states.values()), timeout=120)
    [event] = _events(sim)
    _wait(lambda: time.time() - _epoch(event["time"]) > 2 * RECOVERY_INTERVAL_S + 1)
    assert [(e["slice"], e["action"], e["outcome"]) for e in _events(sim)] == [
        (victim, "recreate", "recreated")
    ]
    stored = [k for k in sim.guest_attributes(_controller(sim)) if k.startswith("recovery-")]
    assert len(stored) == 1


# The tpu-vm test's cluster: two Spot slices of the smallest multi-host shape on TPU VMs, so that
# Ray Train's elastic run through the preemption spans the hosts of a slice as well as slices.
TPU_VM_SPOT = {"platform": "tpu-vm", "acceleratorType": "v5p-16", "slices": 2, "capacity": "spot"}
# jax_trainer's line as each attempt of its worker group starts (Ray Train's rank 0).
ATTEMPT = re.compile(r"workers (\d+), devices (\d+), from step (\d+)$", re.M)
TRAIN_STEP = re.compile(r"step +(\d+) +loss ([0-9.]+)$", re.M)


def _saved_steps(run: Path) -> list[int]:
    """The steps of jax_trainer's committed checkpoints in `run` (orbax renames a finished save to
    its final name; Ray Train keeps the latest two)."""
    return [jax_trainer.checkpoint_step(p.name) for p in run.glob("step_*") if p.name[5:].isdigit()]


def _attempts(text: str) -> list[tuple[int, int, int]]:
    return [(int(w), int(d), int(k)) for w, d, k in ATTEMPT.findall(text)]


class _Run:
    """`rayslice run JOB --address ... -- ARGS` as a user types it, its output collected as it comes."""

    def __init__(self, sim: Simulation, job: str, args: list[str]):
        argv, env = run_command(sim, job, *args)
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def since(self, cut: int = 0) -> str:
        return "".join(self.lines[cut:])

    def wait(self, condition: Callable[[], bool], what: str, timeout: float = 300) -> None:
        """`_wait`, failing at once (not at the timeout) if the job's command ended meanwhile."""

        def seen() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"the job ended (exit {self.process.returncode}) before {what}")
            return condition()

        _wait(seen, timeout, what)


def test_a_preempted_tpu_vm_slice_is_recreated_by_its_controller_while_ray_train_shrinks_and_grows_back(
    simulation_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On TPU VMs (the acceptance test below covers Compute Engine): two multi-host Spot slices.

    Issue 22's scenario rides on the same preemption: `rayslice run jax_trainer`, elastic between
    one and two slices, a checkpoint every 3 steps; once it trains on both slices and step 10 is
    saved, slice 1 is preempted with a notice. Within the same job, without failing it, training
    goes on on slice 0 from its last checkpoint; once the controller (on its own VM) has recreated
    slice 1 and its hosts joined, it grows back to both. The loss goes on from where it was at
    each resize. The job (asked for far more steps) is stopped there."""
    cluster = spec.load(TPU_VM_SPOT, require_zone=False)
    tpu = cluster.tpu
    one, both = (tpu.hosts, tpu.chips), (2 * tpu.hosts, 2 * tpu.chips)  # Ray Train's workers, JAX's devices
    assert tpu.hosts > 1 and cluster.slices == 2
    sim = Simulation.create(cluster, simulation_dir)
    bring_up(sim)

    bridge = sim.state.processes[state.CLOUD_API_PROCESS]  # started and recorded by `create`
    assert is_alive(bridge)
    _controller_started(sim, cluster.slices)

    victims = cloud_bridge.slice_hosts(sim.plan, 1)
    victim_ips = {sim.plan.host(h).ip for h in victims}
    every_ip = {n["ip"] for n in tpu_nodes(sim)}
    storage = Path(tempfile.mkdtemp(prefix="elastic-", dir=sim.plan.shared_dir))
    args = ["--steps", "100000", "--checkpoint-every", "3", "--min-slices", "1", "--max-slices", "2"]
    args += ["--resize-check-s", "5", "--storage-path", str(storage), "--name", "elastic"]
    run = _Run(sim, "jax_trainer", args)
    try:
        run.wait(
            lambda: bool(_attempts(run.since())) and max(_saved_steps(storage / "elastic"), default=0) >= 10,
            "both slices training and step 10 saved",
        )
        saved_before = max(_saved_steps(storage / "elastic"))
        before = {n["id"] for n in tpu_nodes(sim) if n["ip"] in victim_ips}
        cut = len(run.lines)
        # `rayslice local preempt --notice-s 5`, while this test watches the head's GCS: the notice
        # reached Ray before the power-off. The victim's watchers drained their nodes with the
        # preemption reason, so the GCS stopped offering them while the hosts still ran.
        measure = [sys.executable, str(BENCH / "preemption_notice.py"), "--state-dir", str(simulation_dir)]
        measure += ["--slice", cluster.slice_name(1), "--notice-s", str(NOTICE_S)]
        seen = subprocess.run(measure, capture_output=True, text=True, timeout=300)
        assert seen.returncode == 0, seen.stdout + seen.stderr
        loss = json.loads(seen.stdout.splitlines()[-1])
        assert 0 < loss["unschedulable_s"] < loss["off_s"]
        assert not any(sim.running(h) for h in victims)
        assert all(sim.running(h) for h in cloud_bridge.slice_hosts(sim.plan, 0))
        # Shrunk to slice 0 ...
        run.wait(lambda: one in [a[:2] for a in _attempts(run.since(cut))], "training on slice 0 alone")
        # ... the controller noticed on its own and recreated slice 1, its hosts booted a second
        # time and joined Ray, and training grew back.
        wait_nodes(sim, every_ip, timeout=300, avoid=before)

        def grown() -> list[tuple[str, str]]:
            after = run.since(cut)
            shrunk = after.index(f", devices {one[1]},")
            regrown = after.find(f", devices {both[1]},", shrunk)
            return TRAIN_STEP.findall(after[regrown:]) if regrown > 0 else []

        run.wait(lambda: len(grown()) >= 3, "three steps on both slices again")
        assert run.process.poll() is None  # one job throughout: it never failed
    except AssertionError:
        print(sim.report())  # with the job's output below, shown when the test fails
        raise
    finally:
        if run.process.poll() is None:
            load("recovery").stop_job(sim, "jax_trainer")
            run.process.wait(timeout=120)
        run.reader.join(timeout=10)
        shutil.rmtree(storage, ignore_errors=True)
        print(run.since()[-8000:])  # shown when the test fails
    out = run.since()
    before_cut, after = "".join(run.lines[:cut]), run.since(cut)
    assert _attempts(before_cut)[0] == (*both, 0)  # both slices from the start
    shrink = next(a for a in _attempts(after) if a[:2] == one)
    grow = next(a for a in _attempts(after)[_attempts(after).index(shrink) :] if a[:2] == both)
    # Each resize resumed from a checkpoint: no older than the one saved before the preemption,
    # never past the last step trained.
    trained = [int(s) for s, _ in TRAIN_STEP.findall(out)]
    assert saved_before <= shrink[2] <= grow[2] <= max(trained) + 1
    assert f"resumed from step {shrink[2]}" in after and f"resumed from step {grow[2]}" in after
    # The loss goes on: the first step after each resize is about where the run was, far below
    # the fresh model's first loss.
    losses = {int(s): float(x) for s, x in TRAIN_STEP.findall(before_cut)}
    first_after = [float(x) for s, x in TRAIN_STEP.findall(after) if int(s) == shrink[2]]
    assert first_after and first_after[0] < losses[0] / 2
    regrown = [float(x) for s, x in TRAIN_STEP.findall(after) if int(s) == grow[2]]
    assert regrown and regrown[-1] < losses[0] / 2

    # The preemption, as the hosts saw it: the victims' watchers heard the notice and drained
    # their Ray nodes; the other slice's hosts watch and heard nothing; the head VM has no watcher.
    for log in (_boot_log(sim, h) for h in victims):
        assert "rayslice-preemption: preemption notice: instance/preempted is TRUE" in log
        assert re.search(
            r"rayslice-preemption: drained Ray node [0-9a-f]{56} \(DRAIN_NODE_REASON_PREEMPTION", log
        )
    for log in (_boot_log(sim, h) for h in cloud_bridge.slice_hosts(sim.plan, 0)):
        assert "rayslice-preemption: watching instance/preempted" in log
        assert "preemption notice" not in log
    assert "rayslice-preemption" not in _boot_log(sim, sim.plan.head.name)
    # The controller recreated exactly slice 1, once: its hosts booted a second time, the others once.
    assert all(_boots(sim, h) == 2 for h in victims)
    _recorded_once(sim, cluster.slice_name(1))
    assert all(
        _boots(sim, h) == 1
        for h in [sim.plan.head.name, _controller(sim), *cloud_bridge.slice_hosts(sim.plan, 0)]
    )
    # The recreated hosts booted with instance/preempted FALSE again: their watchers watch anew.
    watching = "rayslice-preemption: watching instance/preempted"
    _wait(lambda: all(_boot_log(sim, h).count(watching) == 2 for h in victims))
    assert all(_boot_log(sim, h).count("preemption notice:") == 1 for h in victims)

    data = _status(sim, monkeypatch, capsys)
    assert [s["state"] for s in data["slices"]] == ["READY"] * cluster.slices
    assert {h["boot"] for s in data["slices"] for h in s["hosts"]} == {"joined"}
    assert [(e["slice"], e["outcome"]) for e in data["events"]] == [(cluster.slice_name(1), "recreated")]
    assert data["events"][0]["seen"] == _events(sim)[0]["seen"]

    # `rayslice local down` stops the emulation by its recorded PID and removes its files.
    assert cli.main(["local", "down", "--state-dir", str(simulation_dir)]) == 0
    assert not is_alive(bridge)
    assert not any((simulation_dir / name).exists() for name in state.CLOUD_API_FILES)
    assert not os.path.exists(simulation_dir / state.STATE_FILE)


@on("2 x tpu7x-16 spot")
def test_acceptance_spot_slices_heal_and_the_training_job_resumes_from_its_checkpoint(
    cluster: Simulation, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The recovery issue's acceptance: head VM + two multi-host Spot slices on compute (the shared
    2 x tpu7x-16; the issue named 2 x v6e-16, which doubles the hosts and adds nothing); `rayslice run
    jax_train --max-restarts 2 -- --steps 60 --checkpoint-dir D --checkpoint-every 10` on slice 1;
    `rayslice local preempt` of that slice once step 20 is saved. Nothing else is done by hand.
    The cluster is the shared one, whole again afterwards."""
    sim = cluster
    recovery = load("recovery")  # its scenario is this test; the benchmark times it
    assert sim.spec() == recovery.cluster_spec("compute")
    assert is_alive(sim.state.processes[state.CLOUD_API_PROCESS])
    _controller_started(sim, sim.spec().slices)
    # The simulation's shared folder: every host writes and reads it, as a real slice's hosts share a bucket.
    checkpoints = Path(tempfile.mkdtemp(prefix="checkpoints-", dir=sim.plan.shared_dir))
    try:
        trace = recovery.preempt_during_training(sim, checkpoints, notice_s=TRAINING_NOTICE_S)
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)
    out = trace.output
    print(out[-5000:], trace.stderr[-5000:])  # shown when the test fails
    assert trace.returncode == 0
    # rayslice run told the node deaths apart, waited for the slice, resubmitted once.
    restart = re.search(r"^restart 1 of 2 after .+", out, re.M)
    assert restart
    assert "restart 2 of 2" not in out
    [resumed] = {int(k) for k in recovery.RESUMED.findall(out)}
    assert resumed >= recovery.PREEMPT_AFTER_STEP
    # The first run's steps stream before the restart line; the resumed run's follow it.
    before = out[: restart.start()]
    first = [int(n) for n in re.findall(r"^step +(\d+) +loss", before, re.M)]
    assert first == list(range(len(first))) and len(first) >= recovery.PREEMPT_AFTER_STEP
    [fresh] = re.findall(r"^step +0 +loss ([0-9.]+)$", before, re.M)  # its loss from scratch
    after = out[restart.end() :]
    steps = [int(n) for n in re.findall(r"^step +(\d+) +loss", after, re.M)]
    assert steps == list(range(resumed, 60))  # the resumed run's steps, to the end
    curve = [float(x) for x in re.findall(r"^step +\d+ +loss ([0-9.]+)$", after, re.M)]
    assert curve[0] < float(fresh)  # it went on from the checkpoint, not from scratch
    assert sum(curve[-3:]) / 3 < curve[0]  # and kept falling
    # The controller recreated exactly the preempted slice, once: its hosts booted a second time,
    # the others once; status shows it.
    victims = cloud_bridge.slice_hosts(sim.plan, 1)
    assert all(_boots(sim, h) == 2 for h in victims)
    assert all(
        _boots(sim, h) == 1
        for h in [sim.plan.head.name, _controller(sim), *cloud_bridge.slice_hosts(sim.plan, 0)]
    )
    _recorded_once(sim, trace.victim)
    data = _status(sim, monkeypatch, capsys)
    assert [s["state"] for s in data["slices"]] == ["READY", "READY"]
    assert {h["boot"] for s in data["slices"] for h in s["hosts"]} == {"joined"}
    assert [(e["slice"], e["action"], e["outcome"]) for e in data["events"]] == [
        (trace.victim, "recreate", "recreated")
    ]
    assert data["events"][0]["seen"].startswith("MIG ")
    # The preemption stopped the hosts (Spot's termination action STOP; Compute Engine reports a
    # stopped instance as TERMINATED) and left them for the controller (DO_NOTHING); Compute
    # Engine's compute.instances.preempted operations name them preempted (issue 40, D2).
    seen = data["events"][0]["seen"].removeprefix("MIG ").split(", ")  # in the MIG's order
    assert sorted(seen) == [f"host w{w} preempted" for w in range(len(victims))]
    assert data["events"][0]["seen"] == _events(sim)[0]["seen"]
