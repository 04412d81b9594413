"""The emulation wired to a simulated cluster's plan: preempt powers the slice off, the controller's
recreation boots the same hosts again, guest attributes come from the hosts. No root needed: the
simulation is a recording stand-in with the real plan."""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayslice import names
from rayslice import spec as spec_module
from rayslice.cloud.twin import CloudTwin
from rayslice.errors import SimulatorError
from rayslice.infra.network import SUBNET_CIDR
from rayslice.infra.preview import deploy, stack_config
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.host.private_files import write_private
from rayslice.local.simulation import cloud_bridge
from rayslice.local.simulation.state import Plan, make_plan
from rayslice.recovery.cloud import CloudClient, Location, default_session
from rayslice.recovery.commands import gather
from rayslice.recovery.controller import Controller, Target
from rayslice.recovery.events import Recorder


class Recording:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.actions: list[tuple[str, str]] = []
        self.guest = {h.name: {"state": "joined"} for h in plan.machines}  # the controller VM too

    def guest_attributes(self, name: str) -> dict[str, str]:
        return self.guest[name]

    def power_off(self, name: str) -> None:
        self.actions.append(("off", name))

    def boot(self, name: str) -> None:
        self.actions.append(("boot", name))


@pytest.fixture
def cloud() -> Iterator[CloudApiEmulator]:
    server = CloudApiEmulator(op_polls=1)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("platform", ["compute", "tpu-vm"])
def test_preempt_then_recovery_powers_off_and_boots_exactly_that_slices_hosts(
    cloud: CloudApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, platform: str
) -> None:
    spec = spec_module.load(
        {"slices": 2, "capacity": "spot", "platform": platform, "acceleratorType": "v6e-16"},
        require_zone=False,
    )
    sim = Recording(make_plan(spec, run_id="b1c2d3", network=ipaddress.IPv4Network("10.77.0.0/24")))
    cloud_bridge.attach(cloud, sim, spec)
    adc = tmp_path / "adc.json"
    adc.write_text(json.dumps(cloud.service_account_info()))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    for key, value in cloud.environment().items():
        monkeypatch.setenv(key, value)
    location = Location(cloud_bridge.project_of(spec), str(spec.zone))
    client = CloudClient(default_session(), location, sleep=lambda _: None, poll_interval_s=0)
    target = Target(spec.name, platform, spec.slices, location)
    controller = Controller(client, target, Recorder([]))
    controller.step()
    for mig in cloud.state.migs.values():  # the program's shape (rayslice/infra/compute)
        assert "targetSizePolicy" not in mig and mig["targetSize"] == 4
        assert mig["instanceLifecyclePolicy"] == {"defaultActionOnFailure": "DO_NOTHING"}

    victims = cloud_bridge.preempt(cloud, sim, spec, "rayslice-slice-1")
    assert len(victims) == 4 and sim.actions == [("off", h) for h in victims]
    with pytest.raises(KeyError, match="slices: rayslice-slice-0, rayslice-slice-1"):
        cloud_bridge.preempt(cloud, sim, spec, "rayslice-slice-2")
    data = gather(client, spec)
    if platform == "compute":  # stopped per Spot's termination action, left by DO_NOTHING
        assert data["slices"][1]["state"] == "DEGRADED (0 of 4 hosts running)"
        assert [(h["name"], h["instance"]) for h in data["slices"][1]["hosts"]] == [
            (h, "TERMINATED") for h in victims
        ]
    else:
        assert data["slices"][1]["state"] == "PREEMPTED"

    controller.step()
    assert sim.actions == [("off", h) for h in victims] * 2 + [("boot", h) for h in victims]
    assert [e.outcome for e in controller.recorder.events] == ["recreated"]
    data = gather(client, spec)
    assert [s["state"] for s in data["slices"]] == ["READY", "READY"]
    assert {h["boot"] for s in data["slices"] for h in s["hosts"]} == {"joined"}
    if platform == "compute":
        assert [h["name"] for h in data["slices"][1]["hosts"]] == victims


def test_local_preempt_reaches_the_running_emulation_only_with_its_admin_token(
    cloud: CloudApiEmulator, tmp_path: Path
) -> None:
    spec = spec_module.load({"slices": 2, "capacity": "spot", "platform": "compute"}, require_zone=False)
    sim = Recording(make_plan(spec, run_id="c1d2e3", network=ipaddress.IPv4Network("10.78.0.0/24")))
    cloud_bridge.attach(cloud, sim, spec)
    cloud.admin_token = "s3cret-admin"
    cloud.admin_preempt = lambda name: cloud_bridge.preempt(cloud, sim, spec, name)
    endpoint = tmp_path / cloud_bridge.ENDPOINT_FILE

    with pytest.raises(SimulatorError, match="no cloud API emulation runs"):
        cloud_bridge.request_preempt(tmp_path, "rayslice-slice-0")
    write_private(endpoint, json.dumps({"url": cloud.url, "admin_token": "guess"}))
    with pytest.raises(SimulatorError, match="not the simulator"):
        cloud_bridge.request_preempt(tmp_path, "rayslice-slice-0")
    assert sim.actions == []

    write_private(endpoint, json.dumps({"url": cloud.url, "admin_token": "s3cret-admin"}))
    with pytest.raises(SimulatorError, match="no slice 'other-slice-0'"):
        cloud_bridge.request_preempt(tmp_path, "other-slice-0")
    hosts = cloud_bridge.request_preempt(tmp_path, "rayslice-slice-0")
    assert hosts == cloud_bridge.slice_hosts(sim.plan, 0) and sim.actions == [("off", h) for h in hosts]
    # A Spot preemption with termination action STOP leaves the hosts behind, stopped
    # (TERMINATED is how Compute Engine reports a stopped instance), and nothing repairs them.
    instances = cloud.state.instances[(cloud_bridge.LOCAL_PROJECT, str(spec.zone), "rayslice-slice-0")]
    assert [(i["name"], i["instanceStatus"]) for i in instances] == [(h, "TERMINATED") for h in hosts]
    assert endpoint.stat().st_mode & 0o777 == 0o600


def test_rayslice_local_preempt_command(
    cloud: CloudApiEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rayslice import cli

    spec = spec_module.load({"slices": 2, "capacity": "spot", "platform": "tpu-vm"}, require_zone=False)
    sim = Recording(make_plan(spec, run_id="d1e2f3", network=ipaddress.IPv4Network("10.79.0.0/24")))
    cloud_bridge.attach(cloud, sim, spec)
    cloud.admin_token = "t0ken"
    cloud.admin_preempt = lambda name: cloud_bridge.preempt(cloud, sim, spec, name)
    write_private(
        tmp_path / cloud_bridge.ENDPOINT_FILE, json.dumps({"url": cloud.url, "admin_token": "t0ken"})
    )
    assert cli.main(["local", "preempt", "--state-dir", str(tmp_path), "rayslice-slice-1"]) == 0
    hosts = cloud_bridge.slice_hosts(sim.plan, 1)
    assert capsys.readouterr().out.strip() == f"preempted rayslice-slice-1: powered off {', '.join(hosts)}"
    node = cloud.state.nodes[(cloud_bridge.LOCAL_PROJECT, str(spec.zone), "rayslice-slice-1")]
    assert node["state"] == "PREEMPTED"
    assert cli.main(["local", "preempt", "--state-dir", str(tmp_path), "rayslice-slice-9"]) == 2
    assert "no slice 'rayslice-slice-9'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "config, accelerator, hosts",
    [
        ({"acceleratorType": "tpu7x-16", "capacity": "spot", "zone": "us-central1-c"}, "v7x-16", 2),
        ({"acceleratorType": "v6e-16", "slices": 2, "zone": "us-east5-b"}, "v6e-16", 4),
    ],
)
def test_a_plan_from_what_the_program_deployed_to_the_twin(config, accelerator, hosts) -> None:
    """`local up`'s hosts through the twin: exactly the topology's hosts per slice plus the head
    VM, named as the program names them, each with the metadata a Compute Engine TPU host serves
    (accelerator-type as the host reports it: v7x-16 on TPU7x)."""
    config = {**config, "platform": "compute", "project": "my-project-1"}
    cluster = spec_module.load(config)
    twin = CloudTwin()
    deploy(stack_config(None, [f"{k}={v}" for k, v in config.items()]), twin)
    records = cloud_bridge.deployed_hosts(twin)
    plan = make_plan(cluster, run_id="f1e2d3", network=ipaddress.IPv4Network(SUBNET_CIDR), hosts=records)
    assert cluster.runs_recovery  # so the program declares the controller's VM too
    assert len(plan.machines) == cluster.slices * hosts + 2 == len(twin.hosts())
    assert plan.head.name == names.head_name(cluster.name)
    assert plan.controller is not None and plan.controller.name == names.controller_name(cluster.name)
    for index in range(cluster.slices):
        assert cloud_bridge.slice_hosts(plan, index) == [
            names.host_name(cluster.slice_name(index), w) for w in range(hosts)
        ]
    by_name = {r.name: r for r in records}
    for host in plan.machines:
        assert host.ip == by_name[host.name].ip  # the twin's address, kept
        metadata = by_name[host.name].metadata or {}
        if host.slice_index >= 0:
            assert metadata["accelerator-type"] == accelerator
            assert metadata["worker-id"] == str(host.worker)
            assert metadata["worker-network-endpoints"].split(",")[host.worker].endswith(host.ip)
            assert f"ACCELERATOR_TYPE: '{accelerator}'" in metadata["tpu-env"]
