"""The emulation wired to a simulated cluster's plan: the plan's hosts are what the Pulumi program
deployed to the emulation's twin, preempt powers the slice off, the controller's recreation boots
the same hosts again, guest attributes come from the hosts. No root needed: the simulation is a
recording stand-in with the real plan."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from rayslice import names
from rayslice import spec as spec_module
from rayslice.cloud.rest import default_session
from rayslice.cloud.rules import Violation
from rayslice.cloud.twin import CloudTwin
from rayslice.cloud.twin.state import CloudRuleError
from rayslice.errors import EXIT_INVALID, InvalidInput, SimulatorError
from rayslice.infra.controller_vm import CONTROLLER_MACHINE_TYPE
from rayslice.infra.preview import deploy, stack_config
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.host.private_files import write_private
from rayslice.local.simulation import cloud_bridge
from rayslice.local.simulation.state import (
    ROLE_CONTROLLER_VM,
    ROLE_HEAD,
    ROLE_HEAD_VM,
    HostRecord,
    Plan,
    SimulationState,
    check_state,
    extend_plan,
    make_plan,
    read_deployed,
    write_deployed,
)
from rayslice.recovery.cloud import CloudClient, Location
from rayslice.recovery.commands import gather
from rayslice.recovery.controller import Controller, Target
from rayslice.recovery.events import Recorder
from tests import serving


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

    def set_preempted(self, name: str, notice: bool) -> bool:
        self.actions.append(("notice" if notice else "clear", name))
        return True

    def add_hosts(self, records: Sequence[HostRecord]) -> list[str]:
        spec = spec_module.load(self.plan.config, require_zone=False)
        self.plan = extend_plan(self.plan, spec, records)
        self.actions += [("add", r.name) for r in records]
        self.guest.update({r.name: {"state": "joined"} for r in records})
        return [r.name for r in records]


NETWORK = ipaddress.IPv4Network("10.77.0.0/24")  # the simulation's network, the twin's addresses


def deployed(cloud: CloudApiEmulator, spec: spec_module.ClusterSpec, run_id: str) -> Recording:
    """What `local up` simulates: the hosts the program deployed to `cloud`'s twin, placed."""
    return Recording(
        make_plan(spec, run_id=run_id, network=NETWORK, hosts=cloud_bridge.deploy_spec(cloud, spec).hosts)
    )


@pytest.fixture
def cloud() -> Iterator[CloudApiEmulator]:
    server = CloudApiEmulator(op_polls=1, address_range=str(NETWORK))
    serving.start(server)
    yield server
    serving.stop(server)


def use_the_emulation(cloud: CloudApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Send this process's Google clients to the emulation: Application Default Credentials
    from a key file whose token endpoint is the emulation's, and its endpoint overrides."""
    adc = tmp_path / "adc.json"
    adc.write_text(json.dumps(cloud.service_account_info()))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    for key, value in cloud.environment().items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("platform", ["compute", "tpu-vm"])
def test_preempt_then_recovery_powers_off_and_boots_exactly_that_slices_hosts(
    cloud: CloudApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, platform: str
) -> None:
    spec = spec_module.load(
        {"slices": 2, "capacity": "spot", "platform": platform, "acceleratorType": "v6e-16"},
        require_zone=False,
    )
    sim = deployed(cloud, spec, "b1c2d3")
    cloud_bridge.attach(cloud, sim, spec)
    use_the_emulation(cloud, tmp_path, monkeypatch)
    location = Location(cloud_bridge.project_of(spec), str(spec.zone))
    client = CloudClient(default_session(), location, sleep=lambda _: None, poll_interval_s=0)
    target = Target(spec.name, platform, spec.slices, location)
    controller = Controller(client, target, Recorder([]))
    controller.step()
    for mig in cloud.state.migs.values():  # the program's shape (rayslice/infra/compute)
        assert "targetSizePolicy" not in mig and mig["targetSize"] == 4
        assert mig["instanceLifecyclePolicy"] == {"defaultActionOnFailure": "DO_NOTHING"}

    victims = cloud_bridge.preempt(cloud, sim, spec, "rayslice-slice-1")
    # The program creates a slice's hosts in parallel, so the twin's order of them (its worker
    # numbers) is the order they happened to be created in; `status` lists them by name.
    hosts = [f"rayslice-slice-1-w{i}" for i in range(4)]
    assert sorted(victims) == hosts and sim.actions == [("off", h) for h in victims]
    with pytest.raises(KeyError, match="slices: rayslice-slice-0, rayslice-slice-1"):
        cloud_bridge.preempt(cloud, sim, spec, "rayslice-slice-2")
    data = gather(client, spec)
    if platform == "compute":  # stopped per Spot's termination action, left by DO_NOTHING
        assert data["slices"][1]["state"] == "DEGRADED (0 of 4 hosts running)"
        assert [(h["name"], h["instance"]) for h in data["slices"][1]["hosts"]] == [
            (h, "TERMINATED") for h in hosts
        ]
    else:
        assert data["slices"][1]["state"] == "PREEMPTED"

    controller.step()
    offs, boots = sim.actions[:8], sim.actions[8:]  # the preemption's and the recreate's, then boots
    assert sorted(offs) == sorted([("off", h) for h in hosts] * 2)
    assert sorted(boots) == [("boot", h) for h in hosts]
    assert [e.outcome for e in controller.recorder.events] == ["recreated"]
    data = gather(client, spec)
    assert [s["state"] for s in data["slices"]] == ["READY", "READY"]
    assert {h["boot"] for s in data["slices"] for h in s["hosts"]} == {"joined"}
    if platform == "compute":
        assert [h["name"] for h in data["slices"][1]["hosts"]] == hosts


def test_scale_down_powers_the_slices_hosts_off_and_scale_up_boots_the_same_ones(
    cloud: CloudApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An elastic slice removed (deleteInstances, the MIG stays), added again under the same
    names (createInstances of its recorded configs), and removed again: exactly its hosts power
    off and boot, each time."""
    spec = spec_module.load(
        {"slices": 2, "platform": "compute", "acceleratorType": "v6e-16"}, require_zone=False
    )
    sim = deployed(cloud, spec, "d1e2f3")
    cloud_bridge.attach(cloud, sim, spec)
    use_the_emulation(cloud, tmp_path, monkeypatch)
    client = CloudClient(
        default_session(),
        Location(cloud_bridge.project_of(spec), str(spec.zone)),
        sleep=lambda _: None,
        poll_interval_s=0,
    )
    name, allowed = names.slice_name(spec.name, 0), [names.slice_name(spec.name, i) for i in range(2)]
    hosts = cloud_bridge.slice_hosts(sim.plan, 0)  # by the twin's worker numbers: creation order
    assert sorted(hosts) == names.slice_host_names(name, 4)
    recorded = [
        {k: c[k] for k in ("name", "preservedState") if k in c}
        for c in client.list_per_instance_configs(name)
    ]
    before = [(h.name, h.worker, h.ip) for h in cloud.state.hosts() if h.group == name]
    for _ in range(2):
        sim.actions.clear()
        client.wait_zone_operation(client.delete_instances(name, hosts, allowed), 30)
        assert sim.actions == [("off", h) for h in hosts]
        sim.actions.clear()
        client.wait_zone_operation(client.create_instances(name, recorded, allowed), 30)
        assert sim.actions == [("boot", h) for h in hosts]
    # Back under the same names, worker numbers and reserved addresses as the simulated hosts.
    assert [(h.name, h.worker, h.ip) for h in cloud.state.hosts() if h.group == name] == before


def test_local_preempt_reaches_the_running_emulation_only_with_its_admin_token(
    cloud: CloudApiEmulator, tmp_path: Path
) -> None:
    spec = spec_module.load({"slices": 2, "capacity": "spot", "platform": "compute"}, require_zone=False)
    sim = deployed(cloud, spec, "c1d2e3")
    cloud_bridge.attach(cloud, sim, spec)
    cloud.admin_token = "s3cret-admin"
    cloud.admin_preempt = lambda name, notice_s: cloud_bridge.preempt(cloud, sim, spec, name, notice_s)
    endpoint = tmp_path / cloud_bridge.ENDPOINT_FILE

    with pytest.raises(SimulatorError, match="no cloud API emulation runs"):
        cloud_bridge.request_preempt(tmp_path, "rayslice-slice-0", 0)
    write_private(endpoint, json.dumps({"url": cloud.url, "admin_token": "guess"}))
    with pytest.raises(SimulatorError, match="not the simulator"):
        cloud_bridge.request_preempt(tmp_path, "rayslice-slice-0", 0)
    assert sim.actions == []

    write_private(endpoint, json.dumps({"url": cloud.url, "admin_token": "s3cret-admin"}))
    with pytest.raises(SimulatorError, match="no slice 'other-slice-0'"):
        cloud_bridge.request_preempt(tmp_path, "other-slice-0", 0)
    with pytest.raises(SimulatorError, match="notice_s must be a number of seconds from 0 to 3600"):
        cloud_bridge.request_preempt(tmp_path, "rayslice-slice-0", 3601)
    assert sim.actions == []
    # The notice first, to every host of the slice, then (the window over) the power-off.
    # The power-offs come in the twin's order, which is the order the hosts were created in.
    hosts = cloud_bridge.request_preempt(tmp_path, "rayslice-slice-0", 0.1)
    planned = cloud_bridge.slice_hosts(sim.plan, 0)
    assert sorted(hosts) == sorted(planned)
    assert sim.actions == [("notice", h) for h in planned] + [("off", h) for h in hosts]
    # A Spot preemption with termination action STOP leaves the hosts behind, stopped
    # (TERMINATED is how Compute Engine reports a stopped instance), and nothing repairs them.
    instances = cloud.state.instances[(cloud_bridge.LOCAL_PROJECT, str(spec.zone), "rayslice-slice-0")]
    stopped = sorted((i["name"], i["instanceStatus"]) for i in instances)
    assert stopped == [(h, "TERMINATED") for h in sorted(planned)]
    assert endpoint.stat().st_mode & 0o777 == 0o600


def test_rayslice_local_preempt_command(
    cloud: CloudApiEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rayslice import cli

    spec = spec_module.load({"slices": 2, "capacity": "spot", "platform": "tpu-vm"}, require_zone=False)
    sim = deployed(cloud, spec, "d1e2f3")
    cloud_bridge.attach(cloud, sim, spec)
    cloud.admin_token = "t0ken"
    cloud.admin_preempt = lambda name, notice_s: cloud_bridge.preempt(cloud, sim, spec, name, notice_s)
    write_private(
        tmp_path / cloud_bridge.ENDPOINT_FILE, json.dumps({"url": cloud.url, "admin_token": "t0ken"})
    )
    preempt = ["local", "preempt", "--state-dir", str(tmp_path), "--notice-s", "0.5", "rayslice-slice-1"]
    assert cli.main(preempt) == 0
    hosts = cloud_bridge.slice_hosts(sim.plan, 1)
    assert capsys.readouterr().out.strip() == (
        f"preempted rayslice-slice-1: notice, then after 0.5 s powered off {', '.join(hosts)}"
    )
    assert sim.actions == [("notice", h) for h in hosts] + [("off", h) for h in hosts]
    node = cloud.state.nodes[(cloud_bridge.LOCAL_PROJECT, str(spec.zone), "rayslice-slice-1")]
    assert node["state"] == "PREEMPTED"
    assert (
        cli.main(["local", "preempt", "--state-dir", str(tmp_path), "--notice-s", "0", "rayslice-slice-9"])
        == 2
    )
    assert "no slice 'rayslice-slice-9'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "config, accelerator, hosts",
    [
        ({"acceleratorType": "tpu7x-16", "capacity": "spot", "zone": "us-central1-c"}, "v7x-16", 2),
        ({"acceleratorType": "v6e-16", "slices": 2, "zone": "us-east5-b"}, "v6e-16", 4),
        # Reserved: bulk MIGs whose hosts come from one createInstances each (SliceHosts).
        (
            {
                "acceleratorType": "v6e-16",
                "capacity": "reserved",
                "reservation": "r1",
                "head": "vm",
                "zone": "us-east5-b",
            },
            "v6e-16",
            4,
        ),
    ],
)
def test_a_plan_from_what_the_program_deployed_to_the_twin(config, accelerator, hosts, tmp_path) -> None:
    """`local up`'s hosts through the twin: exactly the topology's hosts per slice plus the head
    VM, named as the program names them, on the simulation's network, each with the metadata and
    machine type a Compute Engine TPU host has (accelerator-type as the host reports it: v7x-16
    on TPU7x); they reach `create` through the state dir unchanged."""
    config = {**config, "platform": "compute", "project": "my-project-1"}
    cluster = spec_module.load(config)
    twin = CloudTwin(address_range=str(NETWORK))
    deploy(stack_config(None, [f"{k}={v}" for k, v in config.items()]), twin)
    write_deployed(tmp_path, cloud_bridge.deployed_hosts(twin))
    records = read_deployed(tmp_path)
    assert records == cloud_bridge.deployed_hosts(twin)
    plan = make_plan(cluster, run_id="f1e2d3", network=NETWORK, hosts=records)
    assert cluster.runs_recovery  # so the program declares the controller's VM too
    assert len(plan.machines) == cluster.slices * hosts + 2 == len(twin.hosts())
    assert plan.head.name == names.head_name(cluster.name) and plan.head.role == ROLE_HEAD_VM
    assert plan.controller is not None and plan.controller.name == names.controller_name(cluster.name)
    assert plan.controller.role == ROLE_CONTROLLER_VM
    assert {r.machine_type for r in records} == {
        cluster.head_machine_type,
        cluster.tpu.machine_type,
        CONTROLLER_MACHINE_TYPE,
    }
    for index in range(cluster.slices):
        # Worker order is creation order, which Pulumi leaves open: the names, in some order.
        assert sorted(cloud_bridge.slice_hosts(plan, index)) == [
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


@pytest.mark.parametrize("order", ["created", "reversed"])
def test_a_compute_slices_head_is_the_host_at_w0s_address_whichever_worker_google_numbers_0(order) -> None:
    """head=slice on compute: the program writes `-w0`'s reserved address as the head address
    (no source says Google numbers that host worker 0), and the plan's head is the host at that
    address, as the boot script's is, also when the worker numbers run the other way."""
    config = {
        "acceleratorType": "v6e-16",
        "platform": "compute",
        "project": "my-project-1",
        "zone": "us-east5-b",
    }
    cluster = spec_module.load(config)
    assert cluster.head == "slice"
    twin = CloudTwin(address_range=str(NETWORK))
    deploy(stack_config(None, [f"{k}={v}" for k, v in config.items()]), twin)
    records = cloud_bridge.deployed_hosts(twin)
    if order == "reversed":
        by_worker = sorted(records, key=lambda r: r.worker)
        records = [replace(r, worker=len(records) - 1 - r.worker) for r in by_worker]
    plan = make_plan(cluster, run_id="f1e2d5", network=NETWORK, hosts=records)
    w0 = names.host_name(cluster.slice_name(0), 0)
    assert {(r.metadata or {})[names.ATTR_HEAD_ADDRESS] for r in records} == {plan.host(w0).ip}
    # The address `head_internal_ip` exports (tests/infra/test_infra_examples.py checks that).
    assert plan.head.name == w0 and plan.head.ip == twin.addresses[names.address_name(w0)]
    assert [h.name for h in plan.hosts if h.role == ROLE_HEAD] == [w0]


def test_a_program_that_doubles_a_slice_gives_twice_the_simulated_hosts() -> None:
    """The simulator boots what the twin holds, not what the spec says: had the program created
    a MIG of target size N and then N per-instance configs (defect 1 of issue 19, which the
    provider turns into createInstances), the twin holds 2N hosts and so does the plan."""
    cluster = spec_module.load({"acceleratorType": "v6e-16", "platform": "compute"}, require_zone=False)
    cloud = CloudApiEmulator(address_range=str(NETWORK))
    try:
        records = cloud_bridge.deploy_spec(cloud, cluster).hosts
        n = cluster.tpu.hosts
        assert len(records) == n
        name = cluster.slice_name(0)
        mig = cloud.twin.migs[(cloud_bridge.project_of(cluster), str(cluster.zone), name)]
        cloud.twin.create_instances(
            cloud_bridge.project_of(cluster),
            str(cluster.zone),
            mig,
            [{"name": names.host_name(name, w)} for w in range(n, 2 * n)],
        )
        plan = make_plan(
            cluster, run_id="f1e2d4", network=NETWORK, hosts=cloud_bridge.deployed_hosts(cloud.twin)
        )
    finally:
        cloud.server_close()
    assert len(plan.hosts) == 2 * n
    # The program's n hosts in the order Pulumi created them (left open), then the n added ones.
    hosts, expected = cloud_bridge.slice_hosts(plan, 0), names.slice_host_names(name, 2 * n)
    assert sorted(hosts[:n]) == sorted(expected[:n]) and hosts[n:] == expected[n:]
    assert len({h.ip for h in plan.hosts}) == 2 * n


def test_a_refused_program_reaches_create_as_one_line_naming_the_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emulation runs the program first; when the twin refuses it, it writes the refusal for
    `create` (which removes the simulation and exits 2 with it) instead of any host, and exits 2."""
    cluster = spec_module.load({"acceleratorType": "v6e-4"}, require_zone=False)
    state_dir = tmp_path / "sim"
    state_dir.mkdir(mode=0o700)
    plan = make_plan(cluster, run_id="a9b8c7", network=ipaddress.IPv4Network("127.79.0.0/24"), hosts=())
    SimulationState(plan=plan, state_dir=str(state_dir)).save()
    refused = [
        Violation("urn:a", "mig-a", "bulk-provisioning-model", "BULK with SPOT", "https://a"),
        Violation("urn:b", "mig-b", "spot-tpu-stop", "DELETE on Spot", "https://b"),
    ]

    def deploy_refused(emulator: CloudApiEmulator, spec: spec_module.ClusterSpec) -> list:
        pool = emulator.twin.address_pool  # the twin hands out the simulation's addresses
        assert pool is not None and str(pool.network) == plan.network
        raise CloudRuleError(refused)

    monkeypatch.setattr(cloud_bridge, "deploy_spec", deploy_refused)
    with pytest.raises(SystemExit) as exited:
        cloud_bridge.serve(state_dir)
    assert exited.value.code == EXIT_INVALID
    with pytest.raises(InvalidInput) as error:
        read_deployed(state_dir)
    message = str(error.value)
    assert "\n" not in message and "nothing was created" in message
    assert all(f"{v.resource}: {v.message} [rule {v.rule}; source: {v.source}]" in message for v in refused)
    assert not (state_dir / cloud_bridge.ENDPOINT_FILE).exists()  # it never served


def test_local_capacity_fulfils_a_waiting_flex_start_request_which_status_then_shows(
    cloud: CloudApiEmulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Acceptance at the emulation's level: a flex-start slice in a zone with no capacity is
    deployed (the program returns) and its bulk MIG waits; status shows it waiting; `rayslice local
    capacity` gives the zone room, the request is fulfilled whole and the twin's hooks fire for
    every new host; status shows it fulfilled. A direct create in the empty zone fails with
    Google's error."""
    from rayslice import cli

    spec = spec_module.load({"platform": "compute", "capacity": "flex-start"}, require_zone=False)
    kind = cloud_bridge.capacity_kind(spec)
    assert kind == spec.tpu.machine_type == "ct6e-standard-4t"
    cloud.twin.set_capacity(str(spec.zone), kind, 0)
    sim = deployed(cloud, spec, "e1f2a3")  # returns: the request was accepted and waits
    slice_name = spec.slice_name(0)
    assert not [h for h in sim.plan.hosts if h.slice_index == 0]  # no host of the slice yet
    cloud_bridge.attach(cloud, sim, spec)
    cloud.admin_token = "t0ken"
    cloud.admin_capacity = lambda hosts, zone, kind: cloud_bridge.set_capacity(cloud, spec, hosts, zone, kind)
    write_private(
        tmp_path / cloud_bridge.ENDPOINT_FILE, json.dumps({"url": cloud.url, "admin_token": "t0ken"})
    )
    use_the_emulation(cloud, tmp_path, monkeypatch)
    client = CloudClient(default_session(), Location(cloud_bridge.project_of(spec), str(spec.zone)))
    booted: list[str] = []
    up = cloud.twin.on_host_up
    cloud.twin.on_host_up = lambda host: (booted.append(host.name), up and up(host))

    [waiting] = gather(client, spec)["slices"]
    assert waiting["state"] == "REQUEST WAITING_FOR_RESOURCES" and waiting["request"]["hosts_asked"] == 4

    capacity = ["local", "capacity", "--state-dir", str(tmp_path)]
    assert cli.main([*capacity, "3"]) == 0  # too few: nothing is created
    assert capsys.readouterr().out.strip() == (
        f"zone {spec.zone}: 3 free {kind} host(s); requests still waiting: {slice_name}/bulk"
    )
    assert booted == []
    assert cli.main([*capacity, "--zone", str(spec.zone), "--type", kind, "4"]) == 0
    assert (
        capsys.readouterr()
        .out.strip()
        .endswith("0 free ct6e-standard-4t host(s); requests still waiting: none")
    )
    [active] = gather(client, spec)["slices"]
    assert active["request"]["state"] == "ACTIVE" and len(active["hosts"]) == 4
    new = sorted(h["name"] for h in active["hosts"])
    assert sorted(booted) == new and all(h.startswith(f"{slice_name}-") for h in new)
    assert {h["instance"] for h in active["hosts"]} == {"RUNNING"}
    assert active["request"]["hosts_joined"] == 4  # their guest attributes: joined
    # Each new host was made in the simulation, then booted, once all four existed (each one's
    # attributes list every peer).
    assert sorted(name for action, name in sim.actions if action == "add") == new
    assert [a for a, _ in sim.actions] == ["add", "boot"] * 4
    added = [h for h in sim.plan.hosts if h.name in new]
    assert sorted(h.worker for h in added) == [0, 1, 2, 3] and {h.slice_index for h in added} == {0}
    for host in added:
        attributes = cloud.twin.host(host.name).metadata
        assert len(attributes["worker-network-endpoints"].split(",")) == 4
    check_state(SimulationState(plan=sim.plan, state_dir=str(tmp_path)))  # `local down` accepts it

    # One more host on the bulk MIG, whose target size is above 0: bulk mode refuses it (D8).
    operation = client.create_instances(slice_name, [{"name": "extra"}], {slice_name})
    done = client.wait_zone_operation(operation, 10)
    assert "bulk mode" in done["error"]["errors"][0]["message"]
    assert cli.main([*capacity, "-1"]) == 2  # click refuses a negative count
    with pytest.raises(SimulatorError, match="hosts must be a whole number of hosts, 0 or more"):
        cloud_bridge.request_capacity(tmp_path, -1, None, None)  # and so does the emulation
    write_private(
        tmp_path / cloud_bridge.ENDPOINT_FILE, json.dumps({"url": cloud.url, "admin_token": "guess"})
    )
    with pytest.raises(SimulatorError, match="not the simulator"):
        cloud_bridge.request_capacity(tmp_path, 9, None, None)
