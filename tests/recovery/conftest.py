"""The emulated cloud on loopback, a real client with real (emulated-issuer) credentials, and a
real metadata server for the controller VM whose guest attributes the emulation serves back."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rayslice import names
from rayslice.cloud import bodies, rules
from rayslice.cloud.rest import default_session
from rayslice.cloud.twin.clock import TwinClock
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery.cloud import CloudClient, Location
from rayslice.recovery.controller import Controller, Target
from rayslice.recovery.events import GuestAttributeSink, Recorder, StreamSink
from rayslice.recovery.journal import Journal
from tests import serving

PROJECT = "rayslice-test"
ZONE = "us-east5-a"  # a v6e zone that also takes flex-start (catalog.FLEX_START_ZONES)
CLUSTER = "rayslice"
LOCATION = Location(PROJECT, ZONE)


@pytest.fixture
def cloud() -> Iterator[CloudApiEmulator]:
    server = CloudApiEmulator(("127.0.0.1", 0), op_polls=2)
    serving.start(server)
    yield server
    serving.stop(server)


@pytest.fixture
def adc(cloud: CloudApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Application Default Credentials from a service-account key file whose token endpoint is
    the emulation's (google-auth signs a JWT, the emulation checks it); the endpoint overrides
    send the API calls there."""
    path = tmp_path / "adc.json"
    path.write_text(json.dumps(cloud.service_account_info()))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    for key, value in cloud.environment().items():
        monkeypatch.setenv(key, value)
    return path


@pytest.fixture
def client(adc: Path) -> CloudClient:
    return CloudClient(default_session(), LOCATION, sleep=lambda _: None, poll_interval_s=0)


@pytest.fixture
def controller_metadata(cloud: CloudApiEmulator) -> Iterator[MetadataServer]:
    """The controller VM's metadata server (the simulator's own), served to the emulation's
    instances.getGuestAttributes for the controller VM."""
    server = MetadataServer(("127.0.0.1", 0), {})
    serving.start(server)
    controller = names.controller_name(CLUSTER)
    cloud.guest_source = lambda instance: server.guest if instance == controller else None
    yield server
    serving.stop(server)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_controller(
    client: CloudClient,
    platform: str,
    controller_metadata: MetadataServer,
    *,
    slices: int = 2,
    clock: Clock | None = None,
    base: float = 10.0,
    cap: float = 30.0,
    capacity: str | None = None,
    state_dir: Path | None = None,
) -> tuple[Controller, io.StringIO]:
    """A controller of `platform`'s slices whose events go to the returned stream and to the
    controller VM's guest attributes; `state_dir`: its journal's directory (None: in memory)."""
    stream = io.StringIO()
    host = controller_metadata.url.removeprefix("http://")
    recorder = Recorder([StreamSink(stream), GuestAttributeSink(host=host)])
    controller = Controller(
        client,
        Target(CLUSTER, platform, slices, LOCATION, capacity),
        recorder,
        base_backoff_s=base,
        max_backoff_s=cap,
        operation_timeout_s=30,
        clock=clock or Clock(),
        journal=Journal(state_dir),
    )
    return controller, stream


NODE_FIELDS = {
    "acceleratorType": "v6e-16",
    "runtimeVersion": "v2-alpha-tpuv6e",
    "networkConfig": {
        "network": "projects/rayslice-test/global/networks/rayslice",
        "enableExternalIps": False,
    },
    "schedulingConfig": {"spot": True},
    "serviceAccount": {
        "email": "rayslice-hosts@rayslice-test.iam.gserviceaccount.com",
        "scope": [names.CLOUD_PLATFORM_SCOPE],
    },
    "metadata": {"rayslice-slice-index": "1", "startup-script": "#!/bin/bash\necho boot\n"},
    "labels": {"rayslice-cluster": "rayslice"},
    "tags": ["rayslice-tpu"],
    "networkEndpoints": [{"ipAddress": f"10.0.0.{i}"} for i in range(4)],
}


def mig_fields(slice_name: str) -> dict[str, object]:
    """A MIG as Compute Engine answers for the program's shape (rayslice/infra/compute/slice.py):
    declared with target size 0, one host per per-instance config, Spot's DO_NOTHING."""
    return {
        "baseInstanceName": slice_name,
        "instanceTemplate": template_link(slice_name),
        "versions": [{"instanceTemplate": template_link(slice_name)}],
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING", "forceUpdateOnRepair": "NO"},
        "resourcePolicies": {"workloadPolicy": policy_link(slice_name)},
        "updatePolicy": {"type": "PROACTIVE", "minimalAction": "REPLACE", "replacementMethod": "RECREATE"},
    }


def bulk_mig_fields(slice_name: str) -> dict[str, object]:
    """The MIG of a reserved slice as the program makes it: bulk mode, target size 0, its hosts
    from one createInstances (rayslice/infra/compute/bulk_hosts.py)."""
    return {**mig_fields(slice_name), "targetSizePolicy": {"mode": "BULK"}}


def old_mig_fields(slice_name: str) -> dict[str, object]:
    """The same MIG as an earlier rayslice left it: bulk mode, the default action on failure."""
    fields = {k: v for k, v in mig_fields(slice_name).items() if k != "instanceLifecyclePolicy"}
    return {**fields, "targetSizePolicy": {"mode": "BULK"}}


def template_link(slice_name: str) -> str:
    return f"projects/{PROJECT}/global/instanceTemplates/{slice_name}-abc"


def policy_link(slice_name: str) -> str:
    return f"projects/{PROJECT}/regions/us-east5/resourcePolicies/{slice_name}-policy"


# The slice's instance template and workload policy as the program declares them for a Spot
# v6e-16 slice (four ct6e-standard-4t hosts, 4x4), which the controller never reads or sends.
SPOT_TEMPLATE = {
    "properties": {
        "machineType": "ct6e-standard-4t",
        "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"},
        "disks": [{"boot": True, "initializeParams": {"diskType": "hyperdisk-balanced"}}],
    }
}
# The same for a reserved slice: reservation-bound, deleted on termination, one named reservation.
RESERVED_TEMPLATE = {
    "properties": {
        "machineType": "ct6e-standard-4t",
        "scheduling": {"provisioningModel": "RESERVATION_BOUND", "instanceTerminationAction": "DELETE"},
        "reservationAffinity": {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": ["r1"],
        },
        "disks": [{"boot": True, "initializeParams": {"diskType": "hyperdisk-balanced"}}],
    }
}
WORKLOAD_POLICY = {"workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "4x4"}}


def controller_violations(
    insert: dict[str, Any], create: dict[str, Any], template_body: dict[str, Any] = SPOT_TEMPLATE
) -> list[rules.Violation]:
    """Google's rules (`rayslice.cloud.rules`) over the bodies the controller sent for one MIG:
    its insert and its one createInstances (every host in one call, as `bodies.SLICE_HOSTS`
    models it), with the template (`template_body`) and workload policy they refer to."""
    name = str(insert["name"])
    template = rules.Resource(
        bodies.TEMPLATE,
        template_link(name),
        template_link(name),
        bodies.Request(
            "compute", "compute.instanceTemplates.insert", "InstanceTemplate", None, template_body
        ),
    )
    policy = rules.Resource(
        bodies.RESOURCE_POLICY,
        policy_link(name),
        policy_link(name),
        bodies.Request("compute", "compute.resourcePolicies.insert", "ResourcePolicy", None, WORKLOAD_POLICY),
    )
    mig_urn = f"projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/{name}"
    mig = rules.Resource(
        bodies.MIG,
        mig_urn,
        name,
        bodies.Request(
            "compute", "compute.instanceGroupManagers.insert", "InstanceGroupManager", name, insert
        ),
        {"versions": frozenset({template.urn}), "resourcePolicies": frozenset({policy.urn})},
    )
    hosts = rules.Resource(
        bodies.SLICE_HOSTS,
        f"{mig_urn}/createInstances",
        f"{name}-hosts",
        bodies.Request(
            "compute",
            "compute.instanceGroupManagers.createInstances",
            "InstanceGroupManagersCreateInstancesRequest",
            None,
            dict(create),
        ),
        {"instanceGroupManager": frozenset({mig_urn})},
    )
    return rules.check(rules.Stack([template, policy, mig, hosts]))


def seed(
    cloud: CloudApiEmulator,
    platform: str,
    slices: int = 2,
    fields: Callable[[str], dict[str, object]] = mig_fields,
) -> None:
    for index in range(slices):
        slice_name = names.slice_name(CLUSTER, index)
        if platform == "tpu-vm":
            cloud.add_node(PROJECT, ZONE, slice_name, **NODE_FIELDS)
        else:
            hosts = [names.host_name(slice_name, w) for w in range(4)]
            cloud.add_mig(PROJECT, ZONE, slice_name, hosts, **fields(slice_name))
            cloud.state.configs[(PROJECT, ZONE, slice_name)] = [
                {
                    "name": host,
                    "status": "EFFECTIVE",
                    "preservedState": {
                        "internalIPs": {
                            "nic0": {"autoDelete": "NEVER", "ipAddress": {"literal": f"10.1.{index}.{w}"}}
                        }
                    },
                }
                for w, host in enumerate(hosts)
            ]


def seed_flex(cloud: CloudApiEmulator, slices: int = 2) -> None:
    """Flex-start slices as the program makes them: a bulk MIG whose target size is the slice's
    four hosts, created at once (the zone has room) with names the MIG gave."""
    for index in range(slices):
        slice_name = names.slice_name(CLUSTER, index)
        body = {"name": slice_name, **mig_fields(slice_name), "targetSizePolicy": {"mode": "BULK"}}
        cloud.state.insert_mig(PROJECT, ZONE, {**body, "targetSize": 4})


GKE_MACHINE = "ct6e-standard-4t"  # the default v6e-16's GKE node machine type


def gke_pool(name: str, *, flex: bool, hosts: int = 4) -> dict[str, object]:
    """A TPU node pool as the program's NodePool becomes one (`rayslice.cloud.bodies`): a
    flex-start pool starts empty and autoscales to `hosts`, a fixed one asks for `hosts` nodes."""
    config: dict[str, object] = {"machineType": GKE_MACHINE, "flexStart": flex}
    pool: dict[str, object] = {"name": name, "locations": [ZONE], "initialNodeCount": 0 if flex else hosts}
    if flex:
        config["maxRunDuration"] = "86400s"
        pool["autoscaling"] = {
            "enabled": True,
            "totalMinNodeCount": 0,
            "totalMaxNodeCount": hosts,
            "locationPolicy": "ANY",
        }
    return {**pool, "config": config}


def queued_body(slice_name: str, **fields: object) -> dict[str, object]:
    """A queued resource as the program sends it (`rayslice.infra.tpu_vm.queued`): the node under
    the slice's name and `fields` beside it (default: the Spot tier)."""
    node = {k: v for k, v in NODE_FIELDS.items() if k not in ("networkEndpoints", "schedulingConfig")}
    spec = {"parent": f"projects/{PROJECT}/locations/{ZONE}", "nodeId": slice_name, "node": node}
    return {"tpu": {"nodeSpec": [spec]}, **(fields or {"spot": {}})}


def seed_queued(cloud: CloudApiEmulator, slices: int = 2, **fields: object) -> None:
    """Queued slices as the program makes them: one queued resource per slice, fulfilled (the
    zone has room), so each slice's node exists."""
    for index in range(slices):
        slice_name = names.slice_name(CLUSTER, index)
        cloud.state.create_queued_resource(
            PROJECT, ZONE, names.request_name(slice_name), queued_body(slice_name, **fields)
        )


def hosts_made(cloud: CloudApiEmulator, slice_name: str) -> list[str]:
    """The names of slice `slice_name`'s hosts that exist: a bulk MIG that waits lists managed
    instances for the hosts to come, without an instanceStatus (compute v1 ManagedInstance), and
    they are no hosts."""
    records = cloud.state.instances.get((PROJECT, ZONE, slice_name), [])
    return [str(r["name"]) for r in records if r.get("instanceStatus")]


def shared_clock(cloud: CloudApiEmulator, start: float = 1000.0) -> TwinClock:
    """One clock for the twin and the controller (pass it as `make_controller`'s ``clock``):
    ``cloud.state.advance(seconds)`` moves both and runs what Google does meanwhile in time
    order; ``clock.now += seconds`` moves both too, and what fell due runs at the emulated APIs'
    next request (`CloudTwin.catch_up`)."""
    clock = TwinClock.manual(start)
    cloud.state.clock = clock
    return clock
