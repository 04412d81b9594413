"""What a simulation reports about its hosts, read from their files and its recorded processes:
no host runs here, so nothing needs root."""

from __future__ import annotations

import ipaddress
import subprocess
import sys

from rayslice import spec
from rayslice.local.host.processes import process_ref
from rayslice.local.simulation.progress import HostProgress
from rayslice.local.simulation.recorded import boot_process
from rayslice.local.simulation.state import SimulationState, make_plan


def _progress(tmp_path, processes=None):
    plan = make_plan(
        spec.load({"acceleratorType": "v6e-4"}, require_zone=False),
        run_id="a1b2c3",
        network=ipaddress.IPv4Network("100.64.9.0/24"),
    )
    progress = HostProgress(SimulationState(plan=plan, state_dir=str(tmp_path), processes=processes or {}))
    [host] = plan.hosts
    progress.paths(host.name).dir.mkdir(parents=True)
    return progress, host.name


def test_a_dead_pid_1_without_an_exit_status_reads_as_failed_and_its_console_is_reported(tmp_path):
    """A boot that breaks before the script runs writes no exit status and publishes nothing; without
    this, a wait for the host ran out its timeout on a state of '' and said nothing of why."""
    dead = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    ref = process_ref(dead.pid)  # taken while it runs: a PID 1 recorded at boot
    dead.communicate()
    assert ref is not None
    progress, host = _progress(tmp_path, {boot_process("ignored"): ref})
    assert progress.states() == {host: ""}  # another host's record says nothing of this one

    progress, host = _progress(tmp_path / "second", {boot_process(host): ref})
    progress.paths(host).console.write_text("Traceback (most recent call last):\nCalledProcessError: mount\n")
    [state] = progress.states().values()
    assert state.startswith("failed: host stopped before its startup-script ended")
    report = progress.report()
    assert "PID 1 gone" in report and "CalledProcessError: mount" in report and "boot log: (none)" in report


def test_a_running_host_without_an_exit_status_is_still_booting(tmp_path):
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ref = process_ref(alive.pid)
        assert ref is not None
        progress, host = _progress(tmp_path)
        progress.state.processes[boot_process(host)] = ref
        assert progress.states() == {host: ""}
        progress.paths(host).exit_file.write_text("1\n")
        assert progress.states() == {host: "failed: startup-script exited 1"}
        assert "PID 1 gone" not in progress.report()
    finally:
        alive.kill()
        alive.wait()
