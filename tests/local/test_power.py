"""Powering a simulated host off: what a wait for its processes says when they outlive it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from rayslice.errors import SimulatorError
from rayslice.local.simulation import power


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
