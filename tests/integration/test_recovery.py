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
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rayslice import cli, names, spec
from rayslice.local import cloud_bridge, state
from rayslice.local.processes import is_alive
from rayslice.local.simulator import LOCAL_RECOVERY_INTERVAL_S, Simulation


def _boots(sim: Simulation, host: str) -> int:
    """How often the host's startup script ran (its console log, as GCE's serial port shows it)."""
    return sim.paths(host).console.read_text().count("running startup-script")


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
    endpoint = json.loads((simulation_dir / cloud_bridge.ENDPOINT_FILE).read_text())
    project, zone = cloud_bridge.project_of(cluster), str(cluster.zone)
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
    assert not any((simulation_dir / name).exists() for name in state.CLOUD_API_FILES)
    assert not os.path.exists(simulation_dir / state.STATE_FILE)
