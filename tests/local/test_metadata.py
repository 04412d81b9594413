"""The fake metadata server, proven with the real clients that read it on a TPU VM:
google-auth's compute-engine helpers, Ray's TPU detection and JAX's Cloud TPU cluster detection.
Each server here listens on 127.0.0.1 in-process; no root needed."""

from __future__ import annotations

import ipaddress
import json
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from types import FrameType

import pytest

from rayslice import platforms, spec
from rayslice.local.google.host_metadata import head_vm_attributes, instance_tree, slice_host_attributes
from rayslice.local.google.metadata_server import MetadataServer, dump_tree, load_tree
from rayslice.local.simulation.recorded import wait_until
from rayslice.names import (
    ATTR_HEAD_ADDRESS,
    ATTR_ROLE,
    ATTR_SLICE_HOSTS,
    ATTR_SLICE_INDEX,
    ATTR_SLICE_NAME,
    host_name,
)
from tests import serving

NETWORK = ipaddress.IPv4Network("100.64.7.0/24")
SLICE_IPS = ["100.64.7.2", "100.64.7.3", "100.64.7.4", "100.64.7.5"]
ACCESS_TOKEN = secrets.token_urlsafe(32)  # what the simulator hands each host: random per run


def _serve(tree, **kwargs) -> MetadataServer:
    server = MetadataServer(("127.0.0.1", 0), tree, **kwargs)
    serving.start(server)
    return server


def _tree(worker: int, cluster=None, head_address=None):
    cluster = cluster or spec.load({"platform": "tpu-vm"}, require_zone=False)
    attributes = slice_host_attributes(cluster, 0, worker, SLICE_IPS, head_address)
    return instance_tree(
        cluster,
        hostname=host_name("rayslice-slice-0", worker),
        ip=SLICE_IPS[worker],
        network=NETWORK,
        gateway="100.64.7.1",
        attributes=attributes,
        startup_script="#!/bin/bash\necho hi\n",
        access_token=ACCESS_TOKEN,
    )


@pytest.fixture
def worker0():
    server = _serve(_tree(0))
    yield server
    serving.stop(server)


@pytest.fixture
def worker2():
    server = _serve(_tree(2))
    yield server
    serving.stop(server)


def _get(server, path, flavor=True, method="GET", data=None):
    request = urllib.request.Request(
        server.url + path, method=method, data=data, headers={"Metadata-Flavor": "Google"} if flavor else {}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
    try:
        with opener.open(request, timeout=5) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # the test looks at the 301 itself
        return None


# ---- the protocol -------------------------------------------------------------------------------


def test_flavor_header_is_required_and_always_sent(worker0):
    status, headers, _ = _get(worker0, "/computeMetadata/v1/instance/id", flavor=False)
    assert status == 403
    assert headers["Metadata-Flavor"] == "Google"
    status, headers, body = _get(worker0, "/computeMetadata/v1/instance/id")
    assert status == 200 and headers["Metadata-Flavor"] == "Google" and body.isdigit()


def test_values_listings_recursive_and_alt(worker0):
    v1 = "/computeMetadata/v1/"
    assert _get(worker0, v1 + "instance/attributes/accelerator-type")[2] == "v6e-16"
    assert _get(worker0, v1 + "instance/network-interfaces/0/ip")[2] == SLICE_IPS[0]
    assert _get(worker0, v1 + "instance/zone")[2].endswith("/zones/us-central1-b")
    assert _get(worker0, v1 + "instance/attributes/startup-script")[2] == "#!/bin/bash\necho hi\n"

    status, headers, _ = _get(worker0, v1 + "instance")
    assert status == 301 and headers["Location"].endswith("/computeMetadata/v1/instance/")
    listing = _get(worker0, v1 + "instance/")[2].splitlines()
    assert {"attributes/", "id", "network-interfaces/", "service-accounts/", "zone"} <= set(listing)
    assert _get(worker0, v1 + "instance/network-interfaces/")[2] == "0/\n"

    status, headers, body = _get(worker0, v1 + "instance/?recursive=true")
    data = json.loads(body)
    assert headers["Content-Type"] == "application/json"
    assert data["networkInterfaces"][0]["ip"] == SLICE_IPS[0]  # camelCase keys ...
    assert data["attributes"]["agent-worker-number"] == "0"  # ... except attribute names
    assert "token" not in data["serviceAccounts"]["default"]

    assert json.loads(_get(worker0, v1 + "instance/attributes/instance-id?alt=json")[2]) == "rayslice-slice-0"
    text = _get(worker0, v1 + "instance/attributes/?recursive=true&alt=text")[2]
    assert "agent-worker-number 0\n" in text
    assert _get(worker0, "/")[2] == "computeMetadata/\n"
    assert _get(worker0, v1 + "instance/no-such-thing")[0] == 404


def test_tpu_attributes_look_like_a_tpu_vm(worker2):
    attrs = "/computeMetadata/v1/instance/attributes/"
    assert _get(worker2, attrs + "agent-worker-number")[2] == "2"
    endpoints = _get(worker2, attrs + "worker-network-endpoints")[2].split(",")
    assert [e.split(":")[2] for e in endpoints] == SLICE_IPS
    tpu_env = _get(worker2, attrs + "tpu-env")[2]
    for line in ("ACCELERATOR_TYPE: 'v6e-16'", "TOPOLOGY: '4x4'", "WORKER_ID: '2'", "ZONE: 'us-central1-b'"):
        assert line in tpu_env.splitlines()
    assert _get(worker2, attrs + ATTR_SLICE_INDEX)[2] == "0"
    assert _get(worker2, attrs + ATTR_HEAD_ADDRESS)[0] == 404  # head=slice, slice 0: found via endpoints


def test_head_vm_and_multislice_attributes():
    cluster = spec.load({"slices": 2, "acceleratorType": "v6e-4", "platform": "tpu-vm"}, require_zone=False)
    assert cluster.head == "vm"
    head = head_vm_attributes(cluster)
    assert head[ATTR_ROLE] == "head-vm" and "agent-worker-number" not in head
    worker = slice_host_attributes(cluster, 1, 0, ["100.64.7.9"], "100.64.7.2")
    assert worker[ATTR_HEAD_ADDRESS] == "100.64.7.2" and worker["instance-id"] == "rayslice-slice-1"


def test_guest_attributes_put_get_list_and_file(tmp_path):
    guest_file = tmp_path / "guest.json"
    server = _serve(_tree(0), guest_file=guest_file)
    try:
        assert json.loads(guest_file.read_text()) == {}  # written at start: the owner's "listening" signal
        path = "/computeMetadata/v1/instance/guest-attributes/rayslice/state"
        assert _get(server, path)[0] == 404
        assert _get(server, path, method="PUT", data=b"waiting-for-head")[0] == 200
        assert _get(server, path)[2] == "waiting-for-head"
        assert _get(server, "/computeMetadata/v1/instance/guest-attributes/")[2] == "rayslice/\n"
        assert _get(server, "/computeMetadata/v1/instance/guest-attributes/rayslice/")[2] == "state\n"
        assert json.loads(guest_file.read_text()) == {"rayslice": {"state": "waiting-for-head"}}
        assert _get(server, "/computeMetadata/v1/instance/attributes/foo", method="PUT", data=b"x")[0] == 405
        assert _get(server, path, method="DELETE")[0] == 200
        assert _get(server, path)[0] == 404
        _get(server, path, method="PUT", data=b"joined")
    finally:
        serving.stop(server)
    restarted = _serve(_tree(0), guest_file=guest_file)  # values survive, as across a VM reboot
    try:
        assert _get(restarted, "/computeMetadata/v1/instance/guest-attributes/rayslice/state")[2] == "joined"
    finally:
        serving.stop(restarted)


def test_unavailable_for_answers_503_then_recovers():
    server = _serve(_tree(0), unavailable_for=0.6)
    try:
        assert _get(server, "/computeMetadata/v1/instance/id")[0] == 503
        time.sleep(0.7)
        assert _get(server, "/computeMetadata/v1/instance/id")[0] == 200
    finally:
        serving.stop(server)


# Attributes that only the Cloud TPU API sets: a Compute Engine TPU host must do without them
# (the published TPU7x log in rayslice/platforms.py shows neither on a Compute Engine host).
CLOUD_TPU_API_ONLY = ("instance-id", "agent-worker-number")


def _compute_tree(accelerator_type: str, worker: int) -> dict:
    cluster = spec.load({"platform": "compute", "acceleratorType": accelerator_type}, require_zone=False)
    hosts = cluster.tpu.hosts
    return instance_tree(
        cluster,
        hostname=host_name("rayslice-slice-0", worker),
        ip=SLICE_IPS[worker],
        network=NETWORK,
        gateway="100.64.7.1",
        attributes=slice_host_attributes(cluster, 0, worker, SLICE_IPS[:hosts], None),
        startup_script="#!/bin/bash\n",
        access_token=ACCESS_TOKEN,
        machine_type=cluster.tpu.machine_type,
    )


def test_a_tpu7x_compute_host_reports_its_type_as_a_real_one_does():
    server = _serve(_compute_tree("tpu7x-16", 1))
    try:
        attrs = "/computeMetadata/v1/instance/attributes/"
        assert _get(server, attrs + "accelerator-type")[2] == "v7x-16"
        assert "ACCELERATOR_TYPE: 'v7x-16'" in _get(server, attrs + "tpu-env")[2].splitlines()
        assert _get(server, attrs + "worker-id")[2] == "1"
    finally:
        serving.stop(server)


def test_compute_host_looks_like_a_compute_engine_instance():
    names = [host_name("rayslice-slice-0", w) for w in range(4)]
    server = _serve(_compute_tree("v6e-16", 2))
    try:
        attrs = "/computeMetadata/v1/instance/attributes/"
        listed = _get(server, attrs)[2].split()
        assert not set(CLOUD_TPU_API_ONLY) & set(listed)
        for name in CLOUD_TPU_API_ONLY:
            assert _get(server, attrs + name)[0] == 404
        # Google's attributes of a Compute Engine TPU host, in worker order like rayslice's.
        assert set(platforms.COMPUTE_TPU_ATTRIBUTES) <= set(listed)
        assert _get(server, attrs + "accelerator-type")[2] == "v6e-16"
        assert _get(server, attrs + "worker-id")[2] == "2"
        endpoints = _get(server, attrs + "worker-network-endpoints")[2].split(",")
        assert [e.split(":")[2] for e in endpoints] == SLICE_IPS
        assert "WORKER_ID: '2'" in _get(server, attrs + "tpu-env")[2].splitlines()
        assert _get(server, attrs + ATTR_SLICE_NAME)[2] == "rayslice-slice-0"
        hosts = _get(server, attrs + ATTR_SLICE_HOSTS)[2].split(",")
        own = _get(server, "/computeMetadata/v1/instance/name")[2]
        assert own == "rayslice-slice-0-w2" and hosts == names
        machine = _get(server, "/computeMetadata/v1/instance/machine-type")[2]
        assert machine.startswith("projects/") and machine.endswith("/machineTypes/ct6e-standard-4t")
    finally:
        serving.stop(server)


def test_silent_for_accepts_connections_but_answers_nothing_until_it_ends():
    server = _serve(_tree(0), silent_for=1.5)
    try:
        host, port = server.server_address[:2]
        with socket.create_connection((str(host), port), timeout=5) as conn:  # accepted at once
            conn.sendall(b"GET /computeMetadata/v1/instance/id HTTP/1.1\r\nMetadata-Flavor: Google\r\n\r\n")
            conn.settimeout(0.5)
            with pytest.raises(TimeoutError):
                conn.recv(100)
            conn.settimeout(5)
            assert conn.recv(100).startswith(b"HTTP/1.1 200")
    finally:
        serving.stop(server)


def test_tree_file_round_trip():
    tree = _tree(1)
    assert load_tree(dump_tree(tree)) == tree


# ---- real clients -------------------------------------------------------------------------------

_GOOGLE_AUTH_CLIENT = """
import json, sys
import google.auth.transport.requests as tr
from google.auth.compute_engine import _metadata
request = tr.Request()
print(json.dumps({
    "ping": _metadata.ping(request),
    "project": _metadata.get_project_id(request),
    "worker": _metadata.get(request, "instance/attributes/agent-worker-number"),
    "account": _metadata.get_service_account_info(request),
    "token": _metadata.get_service_account_token(request)[0],
}))
"""


def test_google_auth_metadata_helpers(worker0):
    """google-auth reads GCE_METADATA_HOST / GCE_METADATA_IP at import, so it runs in a fresh process."""
    host = worker0.url.removeprefix("http://")
    env = {"GCE_METADATA_HOST": host, "GCE_METADATA_IP": host, "PATH": "/usr/bin:/bin", "NO_PROXY": "*"}
    out = subprocess.run(
        [sys.executable, "-c", _GOOGLE_AUTH_CLIENT],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    result = json.loads(out)
    assert result["ping"] is True
    assert result["project"] == "rayslice-local"
    assert result["worker"] == "0"
    assert result["account"]["email"].endswith("-compute@developer.gserviceaccount.com")
    assert result["token"] == ACCESS_TOKEN


@pytest.fixture
def ray_via_proxy(monkeypatch):
    """Ray hard-codes metadata.google.internal but honours http_proxy: point it at a server."""

    def use(server):
        for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY"):
            monkeypatch.delenv(name, raising=False)
        for name in ("TPU_ACCELERATOR_TYPE", "TPU_NAME", "TPU_WORKER_ID", "TPU_TOPOLOGY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("http_proxy", server.url)
        from ray._private.accelerators.tpu import TPUAcceleratorManager

        return TPUAcceleratorManager

    return use


def test_ray_tpu_detection_on_worker_0(worker0, ray_via_proxy):
    tpu = ray_via_proxy(worker0)
    assert tpu.get_current_node_tpu_pod_type() == "v6e-16"
    assert tpu.get_current_node_tpu_name() == "rayslice-slice-0"
    assert tpu.get_current_node_tpu_worker_id() == 0
    assert tpu.get_current_node_tpu_topology() == "4x4"
    assert tpu.get_current_node_accelerator_type() == "TPU-V6E"
    assert tpu.get_current_node_additional_resources() == {"rayslice-slice-0": 1, "TPU-v6e-16-head": 1}
    labels = tpu.get_current_node_accelerator_labels()
    assert labels["ray.io/tpu-slice-name"] == "rayslice-slice-0" and labels["ray.io/tpu-worker-id"] == "0"


def test_ray_tpu_detection_on_other_workers(worker2, ray_via_proxy):
    tpu = ray_via_proxy(worker2)
    assert tpu.get_current_node_tpu_worker_id() == 2
    assert tpu.get_current_node_additional_resources() == {"rayslice-slice-0": 1}  # no head resource


def test_jax_cloud_tpu_cluster_detection(worker2, monkeypatch):
    """JAX reads GCE_METADATA_IP at call time; it derives the process layout from metadata alone."""
    from jax._src.clusters.cloud_tpu_cluster import GceTpuCluster, get_metadata, get_tpu_env_value

    monkeypatch.setenv("GCE_METADATA_IP", worker2.url.removeprefix("http://"))
    for name in (
        "no_proxy",
        "NO_PROXY",
        "http_proxy",
        "HTTP_PROXY",
        "TOPOLOGY",
        "MEGASCALE_NUM_SLICES",
        "MEGASCALE_SLICE_ID",
        "MEGASCALE_COORDINATOR_ADDRESS",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "*")
    assert get_metadata("agent-worker-number") == ("2", 200)
    assert GceTpuCluster._get_worker_list_in_slice() == SLICE_IPS
    assert GceTpuCluster._get_process_id_in_slice() == 2
    assert GceTpuCluster.get_process_count() == 4
    assert GceTpuCluster.get_process_id() == 2
    assert get_tpu_env_value("TOPOLOGY") == "4x4"
    assert (
        GceTpuCluster.get_coordinator_address(timeout_secs=5, override_coordinator_port=None)
        == f"{SLICE_IPS[0]}:8482"
    )


def _read(server, query: str) -> tuple[float, str, str]:
    """GET instance/preempted with `query`: (seconds it took, value, ETag)."""
    start = time.monotonic()
    request = urllib.request.Request(
        f"{server.url}/computeMetadata/v1/instance/preempted{query}", headers={"Metadata-Flavor": "Google"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return time.monotonic() - start, response.read().decode(), response.headers["ETag"]


def _holding(server: object) -> set[threading.Thread]:
    """The threads in which `server` holds a wait_for_change request now: in its
    `_wait_for_change`. Not the process's thread count: under pytest-xdist another test's threads
    may start or end meanwhile; and not merely a new request thread, which may not have read its
    request yet."""
    frames = sys._current_frames()

    def holds(frame: FrameType | None) -> bool:
        while frame is not None:
            if frame.f_code.co_name == "_wait_for_change" and frame.f_locals.get("self") is server:
                return True
            frame = frame.f_back
        return False

    return {t for t in threading.enumerate() if holds(frames.get(t.ident or 0))}


def test_a_waiter_that_hangs_up_is_dropped_without_a_traceback(worker0, capfd):
    """A guest that gives up on a held wait_for_change (a watcher stopped, a host powered off)
    resets its connection; the server's answer to the change then fails to send. It drops the
    connection as a real server does: no traceback in the log, and it answers the next guest."""
    _, _, etag = _read(worker0, "")
    before = _holding(worker0)
    host, port = worker0.server_address[:2]
    with socket.create_connection((host, port), timeout=5) as guest:
        guest.sendall(
            f"GET /computeMetadata/v1/instance/preempted?wait_for_change=true&last_etag={etag}"
            f"&timeout_sec=60 HTTP/1.1\r\nHost: metadata\r\nMetadata-Flavor: Google\r\n\r\n".encode()
        )
        guest.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        wait_until(lambda: bool(_holding(worker0) - before), 10, "the server never held the request")
        (held,) = _holding(worker0) - before
    worker0.set_value(("instance", "preempted"), "TRUE")  # the held request answers: to a reset socket
    held.join(10)
    assert not held.is_alive(), "the held request's thread never ended"
    assert _read(worker0, "")[1] == "TRUE"
    assert "Traceback" not in capfd.readouterr().err


def test_preempted_is_false_until_the_notice_and_wait_for_change_answers_it_at_once(worker0):
    """Google's default key: FALSE on a running VM; a wait_for_change request with the value's
    ETag is held until the notice turns it TRUE, and answered then, not at its timeout."""
    _, value, etag = _read(worker0, "")
    assert value == "FALSE"
    # Unchanged: held for timeout_sec, then the same value and ETag.
    took, value, same = _read(worker0, f"?wait_for_change=true&last_etag={etag}&timeout_sec=1")
    assert (value, same) == ("FALSE", etag) and took >= 0.9
    # A last_etag that is not the current one answers at once (how a client starts watching).
    took, value, _ = _read(worker0, "?wait_for_change=true&last_etag=0&timeout_sec=20")
    assert value == "FALSE" and took < 5
    noticed: list[tuple[float, str, str]] = []
    waiter = threading.Thread(
        target=lambda: noticed.append(
            _read(worker0, f"?wait_for_change=true&last_etag={etag}&timeout_sec=20")
        )
    )
    waiter.start()
    time.sleep(0.5)  # the waiter's request is being held
    assert not noticed
    worker0.set_value(("instance", "preempted"), "TRUE")
    waiter.join(timeout=10)
    [(took, value, changed)] = noticed
    assert value == "TRUE" and changed != etag and took < 10
    # Without last_etag: until the next change (here the notice's end, as at the next boot).
    later = threading.Thread(
        target=lambda: noticed.append(_read(worker0, "?wait_for_change=true&timeout_sec=20"))
    )
    later.start()
    time.sleep(0.5)
    worker0.set_value(("instance", "preempted"), "FALSE")
    later.join(timeout=10)
    assert noticed[-1][1] == "FALSE"


def test_the_notice_and_its_end_reach_a_standalone_server_as_signals(tmp_path):
    """What the simulator does (`RecordedSimulation.set_preempted`): SIGUSR1 gives the notice,
    SIGUSR2 clears it, to the server process `python -m ...metadata_server` it started."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "tree.json").write_text(dump_tree(_tree(0)))
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rayslice.local.google.metadata_server",
            "--tree",
            str(tmp_path / "tree.json"),
            "--guest-file",
            str(tmp_path / "guest.json"),
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
        ],
    )

    class Remote:
        url = f"http://127.0.0.1:{port}"

    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "guest.json").exists():
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.1)
        _, value, etag = _read(Remote, "")
        assert value == "FALSE"
        server.send_signal(signal.SIGUSR1)
        assert _read(Remote, f"?wait_for_change=true&last_etag={etag}&timeout_sec=20")[1] == "TRUE"
        server.send_signal(signal.SIGUSR2)
        assert _read(Remote, "?wait_for_change=true&last_etag=0&timeout_sec=20")[1] == "FALSE"
    finally:
        server.terminate()
        server.wait(timeout=10)
