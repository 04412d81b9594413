"""Plain `rayslice status` (no environment, no --set key) finds the simulation of the default state
dir, as `rayslice run` does, and shows its slices, hosts and the controller's events; `rayslice
local status` shows the same cloud view. No root: the simulation is the state file `local up`
writes plus the emulation `cloud_bridge` serves, wired to a recording stand-in for the hosts."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rayslice import cli, names
from rayslice import spec as spec_module
from rayslice.cloud.rest import COMPUTE_ENDPOINT_ENV, TPU_ENDPOINT_ENV
from rayslice.errors import EXIT_NO_CLUSTER
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.simulation import cloud_bridge
from rayslice.local.simulation.state import STATE_DIR_ENV, SimulationState, make_plan
from rayslice.recovery.cloud import Location
from rayslice.recovery.commands import client_for
from rayslice.recovery.controller import Controller, Target
from rayslice.recovery.events import EVENT_KEY_PREFIX, Event, Recorder
from tests import serving
from tests.local.test_cloud_bridge import Recording


class ControllerSink:
    """The controller's events, stored on its own VM as guest attributes (as on a real one)."""

    def __init__(self, sim: Recording, vm: str):
        self.sim, self.head, self.count = sim, vm, 0

    def record(self, event: Event) -> None:
        self.count += 1
        self.sim.guest[self.head][f"{EVENT_KEY_PREFIX}1700000000000-{self.count}"] = event.to_json()


@dataclass
class Served:
    spec: spec_module.ClusterSpec
    sim: Recording
    cloud: CloudApiEmulator
    state_dir: Path


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """A compute simulation (head VM + 2 x v6e-16 Spot) in the default state dir with its emulation
    running and published, and none of the user's cloud settings in the environment."""
    spec = spec_module.load(
        {"slices": 2, "capacity": "spot", "platform": "compute", "acceleratorType": "v6e-16"},
        require_zone=False,
    )
    state_dir = tmp_path / "sim"
    state_dir.mkdir(mode=0o700)
    network = ipaddress.IPv4Network("127.78.0.0/24")
    cloud = CloudApiEmulator(op_polls=1, address_range=str(network))
    plan = make_plan(
        spec, run_id="e1f2a3", network=network, hosts=cloud_bridge.deploy_spec(cloud, spec).hosts
    )
    SimulationState(plan=plan, state_dir=str(state_dir)).save()
    sim = Recording(plan)
    serving.start(cloud)
    cloud_bridge.attach(cloud, sim, spec)
    cloud.admin_token = "admin"
    cloud_bridge.publish(cloud, state_dir, spec)
    monkeypatch.setenv(STATE_DIR_ENV, str(state_dir))
    for variable in ("GOOGLE_APPLICATION_CREDENTIALS", TPU_ENDPOINT_ENV, COMPUTE_ENDPOINT_ENV):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no gcloud ADC of the user's
    yield Served(spec, sim, cloud, state_dir)
    serving.stop(cloud)


def _status(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    capsys.readouterr()
    assert cli.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plain_status_finds_the_simulation_and_shows_the_preemption_and_the_recreation(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    spec, sim = served.spec, served.sim
    head, controller_vm = names.head_name(spec.name), names.controller_name(spec.name)
    sim.guest[head] = {"state": "joined"}
    sim.guest[controller_vm] = {"state": names.STATE_WATCHING}
    found = spec_module.load(cloud_bridge.cloud_config(spec))
    access = cloud_bridge.cloud_access(served.state_dir)
    client = client_for(found, access)
    client.poll_interval_s = 0.05  # the emulation's operations finish at the first poll; no 5 s waits
    target = Target(spec.name, spec.platform, spec.slices, Location(str(found.project), str(found.zone)))
    controller = Controller(client, target, Recorder([ControllerSink(sim, controller_vm)]))
    controller.step()  # sees both slices whole

    data = _status(capsys, "status")
    assert (data["cluster"], data["platform"], data["project"]) == (spec.name, "compute", "rayslice-local")
    assert [s["state"] for s in data["slices"]] == ["READY", "READY"]
    # Listed in the order of the names' worker numbers: the twin numbers a MIG's hosts by creation
    # order, which Pulumi's concurrent per-instance configs leave to chance.
    assert [h["name"] for h in data["slices"][1]["hosts"]] == names.slice_host_names(
        spec.slice_name(1), spec.tpu.hosts
    )
    assert data["head"] == {"name": head, "boot": "joined"} and data["events"] == []

    victim = spec.slice_name(1)
    cloud_bridge.preempt(served.cloud, sim, spec, victim)
    data = _status(capsys, "status")
    assert data["slices"][1]["state"].startswith("DEGRADED (0 of")
    assert {h["instance"] for h in data["slices"][1]["hosts"]} == {"TERMINATED"}  # stopped, left behind
    controller.step()  # deletes and recreates the slice, records one event on the controller's VM
    data = _status(capsys, "status")
    assert [s["state"] for s in data["slices"]] == ["READY", "READY"]
    assert [(e["slice"], e["action"], e["outcome"]) for e in data["events"]] == [
        (victim, "recreate", "recreated")
    ]

    capsys.readouterr()
    assert cli.main(["status"]) == 0
    text = capsys.readouterr().out
    assert f"slice {victim}: READY" in text and "recreate -> recreated" in text

    # `rayslice local status` shows the same cloud view beside the hosts.
    local = _status(capsys, "local", "status")
    assert local["cloud"] == data
    capsys.readouterr()
    assert cli.main(["local", "status"]) == 0
    assert f"{victim}: saw {data['events'][0]['seen']}; recreate -> recreated" in capsys.readouterr().out


def test_status_with_set_keys_still_reads_the_cloud_they_name(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Naming a cluster (here its project) means the user's cloud, not the simulation: with no
    credentials in the environment that is exit 3 and the fix, on one line."""
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no gcloud ADC file there
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # not on a GCE VM
    argv = ["status", "--set", "project=my-project", "--set", "zone=us-east5-b"]
    assert cli.main(argv) == EXIT_NO_CLUSTER
    [line] = capsys.readouterr().err.splitlines()
    assert "gcloud auth application-default login" in line
    assert served.cloud.calls == []


def test_status_of_a_simulation_whose_emulation_is_gone_is_one_line_and_exit_3(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    (served.state_dir / cloud_bridge.ENDPOINT_FILE).unlink()
    assert cli.main(["status"]) == EXIT_NO_CLUSTER
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert f"cannot read the cloud state of the simulation in {served.state_dir}" in line
    assert "no cloud API emulation runs" in line and captured.out == ""
    assert "Traceback" not in captured.err
    # `local status` still shows the hosts, and says why the cloud's view is missing.
    assert "no cloud API emulation runs" in _status(capsys, "local", "status")["cloud"]["error"]


def test_without_a_simulation_or_a_stack_status_says_what_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "none"))
    assert cli.main(["status"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "needs a cluster: pass --stack-file" in line and "rayslice local up" in line
