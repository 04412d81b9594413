"""`rayslice status` against the emulated cloud, with real (emulator-issued) credentials."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from rayslice import cli, names
from rayslice.cloud.rest import COMPUTE_ENDPOINT_ENV, TPU_ENDPOINT_ENV
from rayslice.errors import EXIT_NO_CLUSTER, NoCredentials
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery import commands as commands_module
from rayslice.recovery.cloud import CloudClient
from rayslice.recovery.commands import render_text
from tests import serving
from tests.imports import imported_modules
from tests.recovery.conftest import (
    CLUSTER,
    LOCATION,
    PROJECT,
    ZONE,
    hosts_made,
    make_controller,
    mig_fields,
    queued_body,
    seed,
    seed_flex,
)

ARGS = ["--set", f"project={PROJECT}", "--set", f"zone={ZONE}", "--set", "capacity=spot", "--set", "slices=2"]
SLICE0, SLICE1 = names.slice_name(CLUSTER, 0), names.slice_name(CLUSTER, 1)


def _publish_states(cloud: CloudApiEmulator, platform: str) -> None:
    ns = names.GUEST_ATTRIBUTE_NAMESPACE
    for index, slice_name in enumerate((SLICE0, SLICE1)):
        for worker in range(4):
            value = names.STATE_JOINED if (index, worker) != (1, 3) else names.STATE_WAITING_PREFIX + "head"
            if platform == "compute":
                cloud.guest[names.host_name(slice_name, worker)] = {ns: {names.STATE_KEY: value}}
            else:
                cloud.tpu_guest[(slice_name, worker)] = {ns: {names.STATE_KEY: value}}


@pytest.mark.parametrize("platform", ["compute", "tpu-vm"])
def test_status_shows_slices_hosts_and_the_recovery_events(
    cloud: CloudApiEmulator,
    client: CloudClient,
    controller_metadata: MetadataServer,
    capsys: pytest.CaptureFixture[str],
    platform: str,
) -> None:
    seed(cloud, platform)
    _publish_states(cloud, platform)
    ns = names.GUEST_ATTRIBUTE_NAMESPACE
    cloud.guest[names.head_name(CLUSTER)] = {ns: {names.STATE_KEY: names.STATE_JOINED}}
    controller_metadata.guest[ns] = {names.STATE_KEY: names.STATE_WATCHING}
    controller, _ = make_controller(client, platform, controller_metadata)
    controller.step()
    cloud.preempt(PROJECT, ZONE, SLICE1)
    controller.step()  # recreates slice 1 and publishes one event on the controller VM
    _publish_states(cloud, platform)  # the new hosts boot and publish again
    capsys.readouterr()

    assert cli.main(["status", *ARGS, "--set", f"platform={platform}", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cluster"] == CLUSTER and data["platform"] == platform
    assert data["head"] == {"name": names.head_name(CLUSTER), "boot": names.STATE_JOINED}
    assert data["controller"] == {"name": names.controller_name(CLUSTER), "boot": names.STATE_WATCHING}
    assert [s["name"] for s in data["slices"]] == [SLICE0, SLICE1]
    ready = "READY"
    assert [s["state"] for s in data["slices"]] == [ready, ready]
    boots = [h["boot"] for h in data["slices"][1]["hosts"]]
    assert boots == [names.STATE_JOINED] * 3 + ["waiting: head"]
    if platform == "compute":
        assert [h["name"] for h in data["slices"][0]["hosts"]] == [
            names.host_name(SLICE0, w) for w in range(4)
        ]
    assert len(data["events"]) == 1
    event = data["events"][0]
    assert (event["slice"], event["action"], event["outcome"]) == (SLICE1, "recreate", "recreated")

    assert cli.main(["status", *ARGS, "--set", f"platform={platform}"]) == 0
    text = capsys.readouterr().out
    assert f"slice {SLICE1}: READY" in text
    assert f"{SLICE1}: saw {event['seen']}; recreate -> recreated" in text
    assert "waiting: head" in text
    assert f"controller VM {names.controller_name(CLUSTER)}: watching" in text


def test_status_shows_a_preempted_slice_before_recovery(
    cloud: CloudApiEmulator, adc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(cloud, "tpu-vm")
    cloud.preempt(PROJECT, ZONE, SLICE0)
    del cloud.state.nodes[(PROJECT, ZONE, SLICE1)]
    assert cli.main(["status", *ARGS, "--set", "platform=tpu-vm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["state"] for s in data["slices"]] == ["PREEMPTED", "MISSING"]
    assert data["events"] == [] and data["head"]["boot"].startswith("unknown")
    assert data["controller"]["boot"].startswith("unknown")
    assert cloud.mutations() == []  # status only reads


def test_status_lists_a_slices_hosts_by_the_worker_numbers_their_names_give(
    cloud: CloudApiEmulator, adc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Not by the names as text ("-w10" sorts before "-w2"), nor by the order the MIG lists them
    # (creation order); a name the MIG made itself comes last.
    seed(cloud, "compute")
    cloud.state.delete_mig(PROJECT, ZONE, SLICE0)  # made again below, with other names
    own = f"{SLICE0}-x7k2"
    listed = [names.host_name(SLICE0, w) for w in (10, 2, 9)] + [own, names.host_name(SLICE0, 0)]
    cloud.add_mig(PROJECT, ZONE, SLICE0, listed, **mig_fields(SLICE0))
    assert cli.main(["status", *ARGS, "--set", "platform=compute", "--json"]) == 0
    hosts = json.loads(capsys.readouterr().out)["slices"][0]["hosts"]
    assert [(h["worker"], h["name"]) for h in hosts] == [
        *((w, names.host_name(SLICE0, w)) for w in (0, 2, 9, 10)),
        (4, own),
    ]


def test_status_without_credentials_exits_3_with_the_fix(
    cloud: CloudApiEmulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no gcloud ADC file there
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # not on a GCE VM
    for key, value in cloud.environment().items():
        monkeypatch.setenv(key, value)
    assert cli.main(["status", *ARGS]) == EXIT_NO_CLUSTER
    captured = capsys.readouterr()
    assert "gcloud auth application-default login" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert cloud.calls == []


def test_a_request_without_a_token_is_refused_by_the_emulation_as_by_google(cloud: CloudApiEmulator) -> None:
    session = requests.Session()  # no Authorization header, as with anonymous credentials
    client = CloudClient(session, LOCATION, tpu_base=cloud.url + "/", compute_base=cloud.url + "/compute/v1/")
    with pytest.raises(NoCredentials, match="HTTP 401"):
        client.get_node(SLICE0)
    assert [c.status for c in cloud.calls] == [401]


def test_status_refuses_a_spec_without_project(adc: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--set", f"zone={ZONE}"]) == 2
    assert "needs the project" in capsys.readouterr().err


# ---- the API failing: one line naming the call and its status, exit 3, never a traceback -------


class _Failing(BaseHTTPRequestHandler):
    """An API that answers every call with one error status, in Google's error shape."""

    status = 500

    def _fail(self) -> None:
        body = json.dumps({"error": {"code": self.status, "message": f"emulated failure {self.status}"}})
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    do_GET = do_POST = _fail

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def failing_api(adc: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Failing]]:
    """Credentials from the emulation (its token endpoint), API calls to a server that fails them."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    serving.start(server)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv(TPU_ENDPOINT_ENV, f"{url}/")
    monkeypatch.setenv(COMPUTE_ENDPOINT_ENV, f"{url}/compute/v1/")
    yield _Failing
    serving.stop(server)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("status", [500, 429, 400])
@pytest.mark.parametrize("platform", ["tpu-vm", "compute"])
def test_status_when_the_api_answers_an_error_exits_3_with_one_line_naming_the_call(
    failing_api: type[_Failing], capsys: pytest.CaptureFixture[str], platform: str, status: int
) -> None:
    failing_api.status = status
    capsys.readouterr()
    assert cli.main(["status", *ARGS, "--set", f"platform={platform}"]) == EXIT_NO_CLUSTER
    captured = capsys.readouterr()
    resource = "/nodes/" if platform == "tpu-vm" else "/instanceGroupManagers/"
    [line] = captured.err.splitlines()
    assert line.startswith("rayslice: GET http://127.0.0.1:") and f"{resource}{SLICE0} failed" in line
    assert f"HTTP {status}: emulated failure {status}" in line
    assert "Traceback" not in captured.err and captured.out == ""


def test_status_when_the_api_refuses_the_connection_exits_3_with_one_line_naming_the_call(
    cloud: CloudApiEmulator, adc: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv(TPU_ENDPOINT_ENV, f"{url}/")
    assert cli.main(["status", *ARGS, "--set", "platform=tpu-vm"]) == EXIT_NO_CLUSTER
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    node = f"{url}/v2/projects/{PROJECT}/locations/{ZONE}/nodes/{SLICE0}"
    assert line.startswith(f"rayslice: GET {node} failed")
    assert line.endswith("no answer: Connection refused")
    assert "Traceback" not in captured.err and captured.out == ""
    assert cloud.calls == []  # only the emulation's token endpoint was asked, not its API


def test_status_text_shows_escape_sequences_and_line_breaks_from_guest_attributes_escaped() -> None:
    """Guest attributes are written by whatever runs on a host: a value must not drive the
    terminal (ESC), overwrite the line (CR) or forge a line of its own (newline)."""

    forged = "joined\x1b[2J\r\nslice other: joined\u202e"
    data = {
        "cluster": CLUSTER,
        "platform": "compute",
        "project": PROJECT,
        "zone": ZONE,
        "head": {"name": "head", "boot": forged},
        "controller": {"name": "controller", "boot": forged},
        "slices": [
            {"name": SLICE0, "state": "READY", "hosts": [{"worker": 0, "name": "h0", "boot": forged}]}
        ],
        "recovery": True,
        "events": [{"time": "t", "slice": SLICE0, "seen": forged, "action": "recreate", "outcome": forged}],
    }
    text = render_text(data)
    assert not any(c in text for c in "\x1b\r\u202e")
    # cluster, head, controller, slice, worker, "recovery events:", one event
    assert len(text.splitlines()) == 7
    assert "joined\\x1b[2J\\r\\nslice other: joined\\u202e" in text


def test_status_shows_a_flex_start_slice_waiting_then_its_hosts_joining(
    cloud: CloudApiEmulator, adc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """D1 (issue 40): a flex-start slice is a bulk MIG that waits with its target size set."""
    cloud.state.set_capacity(ZONE, "", 0)  # an empty zone (the seeded MIGs' hosts count as "")
    seed_flex(cloud)
    where = ["--set", f"project={PROJECT}", "--set", f"zone={ZONE}", "--set", "slices=2"]
    flex = ["status", *where, "--set", "platform=compute", "--set", "capacity=flex-start"]
    assert cli.main([*flex, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["state"] for s in data["slices"]] == ["REQUEST WAITING_FOR_RESOURCES"] * 2
    request = data["slices"][0]["request"]
    assert (request["kind"], request["name"], request["hosts_asked"], request["hosts_joined"]) == (
        "bulk MIG",
        SLICE0,
        4,
        0,
    )
    # Google's reason, where the MIG's bulk instance operation gives one (lastProgressCheck).
    assert request["deadline"] is None
    assert request["reason"] is None or request["reason"].startswith("ZONE_RESOURCE_POOL_EXHAUSTED")
    assert cli.main(flex) == 0
    text = capsys.readouterr().out
    assert f"slice {SLICE0}: REQUEST WAITING_FOR_RESOURCES" in text
    assert "waiting for capacity since" in text and "0 of 4 hosts joined" in text

    cloud.state.set_capacity(ZONE, "", 4)  # enough for the first slice only, in order
    hosts = hosts_made(cloud, SLICE0)
    ns = names.GUEST_ATTRIBUTE_NAMESPACE
    for host in hosts[:3]:
        cloud.guest[host] = {ns: {names.STATE_KEY: names.STATE_JOINED}}
    assert cli.main([*flex, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["state"] for s in data["slices"]] == ["READY", "REQUEST WAITING_FOR_RESOURCES"]
    first = data["slices"][0]
    assert first["request"]["state"] == "ACTIVE" and first["request"]["hosts_joined"] == 3
    assert sorted(h["name"] for h in first["hosts"]) == sorted(hosts)
    assert cloud.mutations() == []  # status only reads


def test_status_shows_a_reserved_bulk_slice_waiting_for_its_reservation_not_degraded(
    cloud: CloudApiEmulator, adc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """D4 (issue 40): a reserved slice's bulk MIG after its one createInstances, before the
    reservation holds every host, has its target size set and no host: it waits (bulk mode makes
    them all at once), where status said 'DEGRADED (0 of 4 hosts running)'."""
    cloud.state.set_capacity(ZONE, "", 0)
    seed_flex(cloud, slices=1)  # the same bulk MIG shape, its target size set, no host yet
    reserved = ["status", "--set", f"project={PROJECT}", "--set", f"zone={ZONE}", "--set", "slices=1"]
    reserved += ["--set", "platform=compute", "--set", "capacity=reserved", "--set", "reservation=r1"]
    assert cli.main([*reserved, "--json"]) == 0
    [slice0] = json.loads(capsys.readouterr().out)["slices"]
    assert slice0["state"] == "REQUEST WAITING_FOR_RESOURCES"
    assert (slice0["request"]["kind"], slice0["request"]["hosts_asked"]) == ("bulk MIG", 4)
    assert cloud.mutations() == []


def test_status_shows_a_queued_slice_waiting_with_its_deadline_then_failed_with_the_reason(
    cloud: CloudApiEmulator, adc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = [2_000_000_000.0]  # 2033-05-18T03:33:20Z
    cloud.state.clock = lambda: now[0]
    cloud.state.set_capacity(ZONE, "v6e", 0)
    for index in range(2):
        slice_name = names.slice_name(CLUSTER, index)
        body = queued_body(slice_name, queueingPolicy={"validUntilDuration": "7200s"})
        cloud.state.create_queued_resource(PROJECT, ZONE, names.request_name(slice_name), body)
    where = ["--set", f"project={PROJECT}", "--set", f"zone={ZONE}", "--set", "slices=2"]
    queued = ["status", *where, "--set", "platform=tpu-vm", "--set", "queued=true", "--set", "capacity=spot"]
    assert cli.main([*queued, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["state"] for s in data["slices"]] == ["REQUEST WAITING_FOR_RESOURCES"] * 2
    request = data["slices"][0]["request"]
    assert request == {
        "kind": "queued resource",
        "name": names.request_name(SLICE0),
        "state": "WAITING_FOR_RESOURCES",
        "since": "2033-05-18T03:33:20Z",
        "deadline": "2033-05-18T05:33:20Z",
        "run_hours": None,
        "hosts_asked": 4,
        "hosts_joined": 0,
        "reason": None,
    }
    assert cli.main(queued) == 0
    text = capsys.readouterr().out
    assert (
        f"queued resource {names.request_name(SLICE0)}: WAITING_FOR_RESOURCES, waiting for capacity since "
        "2033-05-18T03:33:20Z (fails at 2033-05-18T05:33:20Z if still waiting); 0 of 4 hosts joined"
    ) in text

    cloud.state.set_capacity(ZONE, "v6e", 4)  # the first request's node, whole
    ns = names.GUEST_ATTRIBUTE_NAMESPACE
    for worker in range(4):
        cloud.tpu_guest[(SLICE0, worker)] = {ns: {names.STATE_KEY: names.STATE_JOINED}}
    now[0] += 7200  # the second one's deadline passes
    assert cli.main([*queued, "--json"]) == 0
    first, second = json.loads(capsys.readouterr().out)["slices"]
    assert first["state"] == "READY" and first["request"]["state"] == "ACTIVE"
    assert first["request"]["hosts_joined"] == 4 and len(first["hosts"]) == 4
    assert second["state"] == "REQUEST FAILED" and second["hosts"] == []
    assert second["request"]["reason"].startswith("4: the queued resource could not be provisioned in time")
    assert cli.main(queued) == 0
    assert f"queued resource {names.request_name(SLICE1)}: FAILED, failed: 4: " in capsys.readouterr().out
    assert cloud.mutations() == []  # status only reads


def test_status_shows_an_elastic_clusters_slice_without_hosts_as_empty_not_degraded(
    cloud: CloudApiEmulator, adc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(cloud, "compute", slices=1)
    cloud.add_mig(PROJECT, ZONE, SLICE1, [], **mig_fields(SLICE1))  # declared empty: the controller's
    elastic = ["status", "--set", f"project={PROJECT}", "--set", f"zone={ZONE}", "--set", "platform=compute"]
    elastic += ["--set", "slices=2", "--set", "minSlices=1"]
    assert cli.main([*elastic, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(s["name"], s["state"]) for s in data["slices"]] == [(SLICE0, "READY"), (SLICE1, "EMPTY")]
    assert data["slices"][1]["hosts"] == []
    assert cli.main(elastic) == 0
    assert f"slice {SLICE1}: EMPTY" in capsys.readouterr().out


def test_status_takes_googles_state_names_from_their_module_not_the_emulator() -> None:
    """Issue 40, item 4: `rayslice status` (recovery/commands.py) reads Google's state names from
    `rayslice.cloud.states`, never from the cloud twin."""
    path = Path(commands_module.__file__)
    imported = {name for _, name in imported_modules(path.read_text(), commands_module.__name__, False)}
    assert "rayslice.cloud.twin" not in imported and "rayslice.cloud.states" in imported
