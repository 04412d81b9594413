"""Powering a simulated host off: what a wait for its processes says when they outlive it, and
what of the cluster's record each machine gets bound in when it boots."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rayslice.errors import SimulatorError
from rayslice.local.simulation import power, recorded
from rayslice.local.simulation.state import ROLE_CONTROLLER_VM


def test_a_host_whose_processes_outlive_the_wait_names_each_with_its_state(monkeypatch):
    """The wait found processes left after the plug was pulled; the error says which, in what
    state (D: uninterruptible I/O, Z: an unreaped zombie) and under which parent, so that a run
    that hit it can tell a slow exit from a process that escaped the namespace."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monkeypatch.setattr(power, "_left_in", lambda namespace: [sleeper.pid, os.getpid()])
        with pytest.raises(SimulatorError) as left:
            power._wait_gone("pid:[1]", timeout_s=0.2)
    finally:
        sleeper.kill()
        sleeper.wait()
    message = str(left.value)
    assert message.startswith("processes of a powered-off host (pid:[1]) still run after 0 s: ")
    assert re.search(rf"\b{sleeper.pid} python3?[\d.]* state S parent {os.getpid()} waiting in \S+", message)
    assert re.search(rf"\b{os.getpid()} \S+ state R parent {os.getppid()}", message)
    assert power._describe(sleeper.pid) == f"{sleeper.pid} (gone)"


class _Power(power.HostPower):
    """`HostPower` over a plan of two machines, without a state file."""

    def __init__(self, state_dir: Path):
        hosts = {
            "demo-slice-0-w0": SimpleNamespace(name="demo-slice-0-w0", role="tpu-host"),
            "demo-controller": SimpleNamespace(name="demo-controller", role=ROLE_CONTROLLER_VM),
        }
        self.state_dir = state_dir
        self.plan = SimpleNamespace(run_id="ab12cd", root="/run/rayslice/ab12cd", host=hosts.__getitem__)

    def spec(self) -> SimpleNamespace:  # type: ignore[override]
        return SimpleNamespace(name="demo")


def test_each_machine_gets_only_its_own_folders_of_the_record_bound_in(tmp_path):
    """A host sees its hosts/<host>/ only; the controller's VM its events/<host>/ too; nothing
    else of the record (cluster.json, jobs/, other hosts) is bound into any machine."""
    sim = _Power(tmp_path / "local")
    folder = recorded.record_root(sim.state_dir) / "clusters/demo/ab12cd"
    mount = "/run/rayslice/ab12cd-record"
    assert sim.record_mounts("demo-slice-0-w0") == {
        f"{mount}/hosts/demo-slice-0-w0": str(folder / "hosts/demo-slice-0-w0")
    }
    assert sim.record_mounts("demo-controller") == {
        f"{mount}/hosts/demo-controller": str(folder / "hosts/demo-controller"),
        f"{mount}/events/demo-controller": str(folder / "events/demo-controller"),
    }
    made = [p for p in recorded.record_root(sim.state_dir).rglob("*") if p.is_dir()]
    assert all(not p.is_symlink() and p.stat().st_mode & 0o777 == 0o700 for p in made)
