"""Who may call the cloud API emulation, and how much it keeps: the machine itself and the admitted
clients (the recovery controller's host) only, whatever token another caller holds; a bound token
only what its role bindings, conditions included, allow; admin calls from the machine only;
bodies, recorded calls and hosts' guest attributes bounded."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from rayslice import names, spec
from rayslice.errors import SimulatorError
from rayslice.local.google import metadata_server
from rayslice.local.google.cloud_api import emulator as emulator_module
from rayslice.local.google.cloud_api.emulator import ADMIN_HEADER, ADMIN_PREFIX, CloudApiEmulator
from rayslice.local.google.cloud_api.iam import EmulatedIam
from rayslice.local.google.cloud_api.routes import ApiError
from rayslice.local.google.metadata_server import FLAVOR, FLAVOR_HEADER, MetadataServer
from rayslice.local.simulation import cloud_bridge
from tests import serving

GCE = "https://www.googleapis.com/compute/v1"
OTHER_HOST = "127.0.0.2"  # a loopback address of this machine that is not the emulation's own
NODE = "/v2/projects/p/locations/z/nodes/n"


def _serve(clients: tuple[str, ...] = ()) -> CloudApiEmulator:
    server = CloudApiEmulator(("127.0.0.1", 0), clients=clients)
    serving.start(server)
    server.add_node("p", "z", "n")
    server.tokens.add("t")
    return server


@pytest.fixture
def cloud() -> Iterator[CloudApiEmulator]:
    server = _serve()
    yield server
    serving.stop(server)


def _call(
    server: CloudApiEmulator,
    method: str,
    path: str,
    *,
    source: str = "127.0.0.1",
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(str(host), port, timeout=10, source_address=(source, 0))
    try:
        connection.request(method, path, body=body, headers={"Authorization": "Bearer t", **(headers or {})})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def test_a_caller_that_is_neither_the_machine_nor_admitted_is_refused_whatever_its_token(cloud):
    assert _call(cloud, "GET", NODE)[0] == 200  # the machine, with a token the emulation issued
    status, answer = _call(cloud, "GET", NODE, source=OTHER_HOST)
    assert status == 403 and answer["error"]["status"] == "PERMISSION_DENIED"
    assert OTHER_HOST in answer["error"]["message"]
    token = _call(cloud, "POST", "/token", source=OTHER_HOST, body=b"grant_type=x")
    assert token[0] == 403  # nor may it ask for a token
    assert [c.status for c in cloud.calls] == [200, 403, 403]


def test_an_admitted_client_calls_the_api_but_never_the_admin_endpoint():
    server = _serve(clients=(OTHER_HOST,))
    server.admin_token = "admin"
    server.admin_preempt = lambda name, notice_s: [name]
    try:
        assert _call(server, "GET", NODE, source=OTHER_HOST)[0] == 200
        admin = {ADMIN_HEADER: "admin"}
        assert _call(server, "POST", f"{ADMIN_PREFIX}n", source=OTHER_HOST, headers=admin)[0] == 403
        assert _call(server, "POST", f"{ADMIN_PREFIX}n", headers=admin) == (
            200,
            {"preempted": "n", "hosts": ["n"]},
        )
    finally:
        serving.stop(server)


def test_a_hook_that_fails_is_answered_as_googles_500_with_its_cause_and_the_emulation_goes_on(capsys):
    """A simulator hook that raises (a new host that would not boot) must not end the connection
    without an answer: `rayslice local capacity` would show a bare RemoteDisconnected."""
    server = _serve()
    server.admin_token = "admin"

    def fails(name: str, notice_s: float) -> list[str]:
        raise SimulatorError(f"host {name}-w0 did not start")

    server.admin_preempt = fails
    try:
        status, answer = _call(server, "POST", f"{ADMIN_PREFIX}n", headers={ADMIN_HEADER: "admin"})
        assert status == 500 and answer["error"]["status"] == "INTERNAL"
        assert answer["error"]["message"] == "the emulation failed: SimulatorError: host n-w0 did not start"
        assert "Traceback" in capsys.readouterr().err  # the emulation's log keeps where it failed
        assert _call(server, "GET", NODE)[0] == 200
    finally:
        serving.stop(server)


def test_a_body_over_the_bound_is_refused_unread(cloud, monkeypatch):
    monkeypatch.setattr(emulator_module, "MAX_BODY", 100)
    status, _ = _call(cloud, "POST", NODE.rsplit("/", 1)[0] + "?nodeId=m", body=b"{" + b" " * 200 + b"}")
    assert status == 413
    assert cloud.calls == []  # nothing of it was kept


def test_recorded_calls_keep_only_the_latest_within_their_bounds(cloud, monkeypatch):
    monkeypatch.setattr(emulator_module, "MAX_CALLS", 3)
    for _ in range(5):
        _call(cloud, "GET", NODE)
    assert len(cloud.calls) == 3
    monkeypatch.setattr(emulator_module, "MAX_CALLS", 100)
    monkeypatch.setattr(emulator_module, "MAX_STORED_BYTES", 250)
    for size in (100, 100, 100):
        _call(cloud, "POST", "/compute/v1/x", body=b"x" * size)  # not a route: recorded as 404
    assert [c.method for c in cloud.calls] == ["POST", "POST"]  # the oldest bodies made room


def _put(server: MetadataServer, key: str, value: bytes) -> int:
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(str(host), port, timeout=10)
    try:
        connection.request(
            "PUT",
            f"/computeMetadata/v1/instance/guest-attributes/ns/{key}",
            body=value,
            headers={FLAVOR_HEADER: FLAVOR},
        )
        return connection.getresponse().status
    finally:
        connection.close()


def test_a_host_cannot_grow_its_guest_attributes_without_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(metadata_server, "MAX_GUEST_VALUE", 64)
    monkeypatch.setattr(metadata_server, "MAX_GUEST_ENTRIES", 3)
    monkeypatch.setattr(metadata_server, "MAX_GUEST_BYTES", 150)
    server = MetadataServer(("127.0.0.1", 0), {"instance": {}}, guest_file=tmp_path / "guest.json")
    serving.start(server)
    try:
        assert _put(server, "big", b"x" * 65) == 413
        assert [_put(server, f"k{i}", b"x" * 40) for i in range(4)] == [200, 200, 200, 413]  # 3 entries
        assert _put(server, "k0", b"y" * 40) == 200  # replacing one keeps the count
        assert _put(server, "k1", b"y" * 64) == 413  # over the total bytes
        assert set(json.loads((tmp_path / "guest.json").read_text())["ns"]) == {"k0", "k1", "k2"}
    finally:
        serving.stop(server)


def test_the_controllers_conditioned_grants_refuse_every_other_instance_and_template():
    """The role bindings the Pulumi program gives an elastic cluster's recovery controller, bound
    to its token as the simulator binds them (`cloud_bridge.controller_grants`): it reads the
    head VM's guest attributes (Ray's demand), and no other instance's; it may use this cluster's
    slice templates, and no other cluster's (IAM Conditions on resource.name)."""
    cluster = spec.load(
        {"acceleratorType": "v6e-16", "platform": "compute", "slices": 2, "minSlices": 1, "capacity": "spot"},
        require_zone=False,
    )
    server = _serve()
    try:
        deployment = cloud_bridge.deploy_spec(server, cluster)
        conditioned = [g for g in deployment.controller_grants if g.condition is not None]
        assert len(conditioned) == 2  # the head VM's demand, the slices' templates
        for grant in deployment.controller_grants:
            server.bind("controller", grant.permissions, grant.condition)
        server.tokens.add("controller")
        project, zone = cloud_bridge.project_of(cluster), str(cluster.zone)
        head, host = names.head_name(cluster.name), names.host_name(cluster.slice_name(0), 1)
        for name in (head, host):
            server.guest[name] = {"rayslice": {"demand": "{}"}}

        def read(name: str) -> tuple[int, Any]:
            path = f"/compute/v1/projects/{project}/zones/{zone}/instances/{name}/getGuestAttributes"
            return _call(server, "GET", path, headers={"Authorization": "Bearer controller"})

        assert read(head)[0] == 200
        status, answer = read(host)
        assert status == 403 and answer["error"]["status"] == "PERMISSION_DENIED"
        assert f"projects/{project}/zones/{zone}/instances/{host}" in answer["error"]["message"]

        # Recreating slice 1 with the MIG the program made (its template reference, as the provider
        # sends it, carries a query): allowed. The same with another cluster's or slice 10's: refused.
        mig = server.twin.migs[(project, zone, cluster.slice_name(1))]
        params = {"project": project, "zone": zone}
        server.authorize("controller", "compute.instanceGroupManagers.insert", mig, params)
        for other in (f"other-{cluster.slice_name(1)}-1", f"{cluster.slice_name(1)}0-1"):
            template = f"{GCE}/projects/{project}/global/instanceTemplates/{other}?uniqueId=7"
            with pytest.raises(ApiError) as refused:
                server.authorize(
                    "controller",
                    "compute.instanceGroupManagers.insert",
                    {**mig, "versions": [{"instanceTemplate": template}]},
                    params,
                )
            assert refused.value.code == 403
    finally:
        serving.stop(server)


@pytest.mark.parametrize(
    "expression",
    [
        'resource.type == "compute.googleapis.com/Instance"',
        'resource.name.endsWith("x")',
        'request.time < timestamp("2030-01-01T00:00:00Z")',
    ],
)
def test_a_condition_the_emulation_cannot_evaluate_is_refused_when_bound(expression):
    with pytest.raises(ValueError, match=r"evaluates only resource\.name"):
        EmulatedIam().bind("t", ["compute.instances.getGuestAttributes"], expression)
