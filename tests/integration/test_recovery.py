"""Recovery on real namespaces: the controller runs as the service `Simulation.create` starts in
the simulated head VM's network namespace, as on a cloud VM (Application Default Credentials from
the head's metadata server, the API through the endpoint override, events as the head's guest
attributes); the cloud API emulation that `create` also starts runs beside the simulation on its
bridge; `rayslice local preempt` powers a slice off; the controller notices by itself and
recreates it, its hosts boot again; `rayslice status` shows the preemption and the recreation;
`rayslice local down` stops both processes and removes the emulation's files.

A tiny boot script stands in for the real one (no Ray): what is under test is the path from
preemption to recreated hosts, not Ray's rejoin (see docs/recovery.md, what is left).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rayslice import cli, names, spec
from rayslice.local import cloud_bridge, state
from rayslice.local.processes import is_alive
from rayslice.local.simulator import LOCAL_RECOVERY_INTERVAL_S, Simulation

TINY_SCRIPT = r"""#!/bin/bash
set -euo pipefail
url=http://metadata.google.internal/computeMetadata/v1
md() { curl -sSf --max-time 2 -H 'Metadata-Flavor: Google' "$url/$1"; }
put() {
  curl -sSf -X PUT --data-binary "$2" -H 'Metadata-Flavor: Google' \
    "$url/instance/guest-attributes/rayslice/$1"
}
until md instance/id >/dev/null 2>&1; do sleep 0.2; done
put boots $(( $(md instance/guest-attributes/rayslice/boots 2>/dev/null || echo 0) + 1 ))
put state joined
setsid sleep 1000 </dev/null >/dev/null 2>&1 &
"""


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
    sim = Simulation.create(cluster, simulation_dir, script=TINY_SCRIPT)
    sim.boot_all()
    _wait(lambda: all(v == "joined" for v in sim.states().values()))

    bridge = sim.state.processes[state.CLOUD_API_PROCESS]  # started and recorded by `create`
    assert is_alive(bridge)
    endpoint = json.loads((simulation_dir / cloud_bridge.ENDPOINT_FILE).read_text())
    project, zone = cloud_bridge.project_of(cluster), str(cluster.zone)
    head = sim.plan.head.name
    assert head == names.head_name(cluster.name)
    service = sim.state.processes[f"{state.RECOVERY_KIND}:{head}"]  # the controller, started by `create`
    assert is_alive(service)
    log = sim.paths(head).recovery_log

    def events() -> list[dict[str, str]]:
        return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]

    time.sleep(2 * LOCAL_RECOVERY_INTERVAL_S)
    assert events() == []  # healthy: nothing to do, nothing recorded

    victims = cloud_bridge.slice_hosts(sim.plan, 1)
    assert cli.main(["local", "preempt", "--state-dir", str(simulation_dir), "rayslice-slice-1"]) == 0
    assert not any(sim.running(h) for h in victims)
    assert all(sim.running(h) for h in cloud_bridge.slice_hosts(sim.plan, 0))

    # The controller notices on its own, within its interval, and recreates the slice; its hosts
    # boot a second time, the other slice's hosts are untouched.
    _wait(lambda: all(sim.guest_attributes(h).get("boots") == "2" for h in victims), 120)
    _wait(lambda: len(events()) == 1, 60)
    time.sleep(2 * LOCAL_RECOVERY_INTERVAL_S)  # whole again: no further events
    assert [(e["slice"], e["action"], e["outcome"]) for e in events()] == [
        ("rayslice-slice-1", "recreate", "recreated")
    ]
    assert all(sim.guest_attributes(h)["boots"] == "1" for h in cloud_bridge.slice_hosts(sim.plan, 0))
    stored = [k for k in sim.guest_attributes(head) if k.startswith("recovery-")]
    assert len(stored) == 1  # recorded once, on the head VM, through its metadata server

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(simulation_dir / cloud_bridge.CREDENTIALS_FILE))
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    for key, value in endpoint["env"].items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    status = [
        "status",
        "--set",
        f"project={project}",
        "--set",
        f"zone={zone}",
        "--set",
        f"platform={platform}",
    ]
    config = ["--set", f"acceleratorType={accelerator}", "--set", "slices=2", "--set", "capacity=spot"]
    assert cli.main([*status, *config, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["state"] for s in data["slices"]] == ["READY", "READY"]
    assert {h["boot"] for s in data["slices"] for h in s["hosts"]} == {"joined"}
    assert [(e["slice"], e["outcome"]) for e in data["events"]] == [("rayslice-slice-1", "recreated")]
    assert data["events"][0]["seen"] == events()[0]["seen"]

    # `rayslice local down` stops the emulation by its recorded PID and removes its files.
    assert cli.main(["local", "down", "--state-dir", str(simulation_dir)]) == 0
    assert not is_alive(bridge)
    assert not is_alive(service)
    assert not any((simulation_dir / name).exists() for name in state.CLOUD_API_FILES)
    assert not os.path.exists(simulation_dir / state.STATE_FILE)
