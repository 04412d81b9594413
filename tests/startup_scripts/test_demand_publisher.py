"""An elastic cluster's demand publisher (`rayslice.startup_scripts.demand_publisher`): what it makes
of the GCS's cluster resource state (the protobuf messages Ray's GCS sends, built here), that the
controller's parser reads it, its retries, its PUT to the simulator's real metadata server, and
that only an elastic cluster's head carries and starts it. Its run against real Ray is in
test_demand_publisher_ray.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.core.generated import autoscaler_pb2, common_pb2

from rayslice import names, spec
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery import demand
from rayslice.startup_scripts import demand_publisher as publisher
from rayslice.startup_scripts import host_attributes, render
from rayslice.startup_scripts.options import RenderOptions
from rayslice.startup_scripts.variables import DEMAND_PUBLISHER, script_variables
from tests.imports import imported_modules
from tests.startup_scripts import sandbox

LABEL = names.SLICE_NAME_LABEL
HEAD = "TPU-v6e-16-head"
ELASTIC = {"acceleratorType": "v6e-16", "platform": "compute", "slices": 2, "minSlices": 0}
FIXED = {key: value for key, value in ELASTIC.items() if key != "minSlices"}


def _request(shape: dict[str, float], pinned: str | None = None) -> autoscaler_pb2.ResourceRequest:
    request = autoscaler_pb2.ResourceRequest(resources_bundle=shape)
    if pinned is not None:
        constraint = common_pb2.LabelSelectorConstraint(
            label_key=LABEL,
            operator=common_pb2.LabelSelectorOperator.Value("LABEL_OPERATOR_IN"),
            label_values=[pinned],
        )
        request.label_selectors.append(common_pb2.LabelSelector(label_constraints=[constraint]))
    return request


def _gang(details: str, *requests: autoscaler_pb2.ResourceRequest, legacy: bool = False) -> Any:
    if legacy:  # a GCS that fills only the old list
        return autoscaler_pb2.GangResourceRequest(details=details, requests=list(requests))
    selector = autoscaler_pb2.BundleSelector(resource_requests=list(requests))
    return autoscaler_pb2.GangResourceRequest(details=details, bundle_selectors=[selector])


def _node(
    status: str,
    total: dict[str, float],
    available: dict[str, float],
    idle_ms: int = 0,
    slice_name: str | None = None,
) -> autoscaler_pb2.NodeState:
    return autoscaler_pb2.NodeState(
        status=autoscaler_pb2.NodeStatus.Value(status),
        total_resources=total,
        available_resources=available,
        idle_duration_ms=idle_ms,
        labels={LABEL: slice_name} if slice_name else {},
    )


def _tpu_host(
    slice_name: str, status: str = "IDLE", idle_ms: int = 0, used: dict[str, float] | None = None
) -> autoscaler_pb2.NodeState:
    """A v6e host's node; the GCS leaves a resource with nothing available out of the available map."""
    total = {"CPU": 8.0, "TPU": 4.0, "memory": 1e9, "node:10.0.0.2": 1.0, "accelerator_type:TPU-V6E": 1.0}
    available = {name: amount - (used or {}).get(name, 0.0) for name, amount in total.items()}
    return _node(status, total, {k: v for k, v in available.items() if v > 0}, idle_ms, slice_name)


def _state(**fields: Any) -> autoscaler_pb2.ClusterResourceState:
    return autoscaler_pb2.ClusterResourceState(**fields)


def test_the_snapshot_is_what_the_controller_reads_and_turns_into_whole_slices() -> None:
    state = _state(
        pending_gang_resource_requests=[
            _gang("aa01:PACK|PENDING", _request({HEAD: 1.0})),
            # slice_placement_group's workers once it holds s-0's head: pinned there.
            _gang("aa02:SPREAD|PENDING", *[_request({"TPU": 4.0}, pinned="s-0") for _ in range(4)]),
            _gang(
                "aa03:STRICT_SPREAD|PENDING",
                *[_request({"TPU": 4.0, "CPU": 1.0}) for _ in range(5)],
                legacy=True,
            ),
        ],
        pending_resource_requests=[
            autoscaler_pb2.ResourceRequestByCount(request=_request({"TPU": 4.0}), count=3),
            autoscaler_pb2.ResourceRequestByCount(request=_request({"CPU": 1.0}), count=40),
        ],
        node_states=[
            _node(
                "RUNNING", {"CPU": 4.0, "node:__internal_head__": 1.0}, {"CPU": 2.0}
            ),  # the head VM: no slice
            _tpu_host("s-0", "IDLE", 30_000),
            _tpu_host("s-0", "IDLE", 12_000),
            _tpu_host("s-1", "RUNNING", used={"TPU": 4.0}),
            _tpu_host("s-1", "IDLE", 50_000),
            _tpu_host("s-2", "DEAD", 99_000),
        ],
    )
    value = publisher.snapshot(state, 1700000000.25, LABEL)
    assert value["pgs"][0] == {"bundles": [{"shape": {HEAD: 1.0}, "count": 1}], "strategy": "PACK"}
    assert value["pgs"][1]["bundles"] == [{"shape": {"TPU": 4.0}, "count": 4, "slice": "s-0"}]
    assert value["pgs"][2] == {
        "bundles": [{"shape": {"CPU": 1.0, "TPU": 4.0}, "count": 5}],
        "strategy": "STRICT_SPREAD",
    }
    assert value["slices"] == {
        "s-0": {"nodes": 2, "busy": False, "idle_s": 12.0},
        "s-1": {"nodes": 2, "busy": True, "idle_s": 0.0},
    }
    parsed = demand.parse(publisher.encode(value).decode())
    assert (parsed.at, parsed.truncated) == (1700000000.25, False)
    # The head reservation: 1; the pinned group: 0; 20 chips: 2; 12 chips of tasks: 1.
    assert demand.slices_wanted(parsed, "v6e-16", 16) == 4
    assert value["asked"] == [] and demand.slices_asked(parsed, "v6e-16", 16) == 0


def test_what_request_resources_asks_is_published_and_read_as_slices_to_hold_in_all() -> None:
    """Ray Train's elastic JaxTrainer asks for its workers with request_resources (the GCS's
    cluster resource constraints), not with a placement group, until they fit."""
    asked = [autoscaler_pb2.ResourceRequestByCount(request=_request({"TPU": 4.0}), count=8)]
    state = _state(
        cluster_resource_constraints=[autoscaler_pb2.ClusterResourceConstraint(resource_requests=asked)],
        node_states=[_tpu_host("s-0", "RUNNING", used={"TPU": 4.0})],
    )
    value = publisher.snapshot(state, 5.0, LABEL)
    assert value["asked"] == [{"shape": {"TPU": 4.0}, "count": 8}] and value["pgs"] == value["tasks"] == []
    parsed = demand.parse(publisher.encode(value).decode())
    assert demand.slices_wanted(parsed, "v6e-16", 16) == 0  # nothing is pending
    assert demand.slices_asked(parsed, "v6e-16", 16) == 2  # 32 chips: two whole slices in all


def test_marker_resources_in_use_do_not_make_a_slice_busy_and_its_head_resource_does() -> None:
    """`node:<ip>` and `accelerator_type:` are asked for only to pin work beside real resources;
    a placement group holding a slice's head has reserved that slice."""
    marked = _tpu_host("s-0", "IDLE", 5_000, used={"node:10.0.0.2": 0.5, "accelerator_type:TPU-V6E": 0.001})
    assert publisher.snapshot(_state(node_states=[marked]), 0, LABEL)["slices"]["s-0"]["busy"] is False
    reserved = _node("IDLE", {"TPU": 4.0, HEAD: 1.0}, {"TPU": 4.0}, 5_000, "s-0")
    assert publisher.snapshot(_state(node_states=[reserved]), 0, LABEL)["slices"]["s-0"] == {
        "nodes": 1,
        "busy": True,
        "idle_s": 0.0,
    }


def test_a_draining_host_is_never_idle() -> None:
    nodes = [_tpu_host("s-0", "IDLE", 60_000), _tpu_host("s-0", "DRAINING", 60_000)]
    assert publisher.snapshot(_state(node_states=nodes), 0, LABEL)["slices"]["s-0"]["idle_s"] == 0.0


def test_long_lists_are_cut_and_say_so() -> None:
    many = [_gang(f"{i:04x}:PACK|PENDING", _request({HEAD: 1.0})) for i in range(publisher.MAX_ITEMS + 6)]
    value = publisher.snapshot(_state(pending_gang_resource_requests=many), 0, LABEL)
    assert len(value["pgs"]) == publisher.MAX_ITEMS and value["truncated"] is True
    parsed = demand.parse(publisher.encode(value).decode())
    assert demand.slices_wanted(parsed, "v6e-16", 16) == publisher.MAX_ITEMS and parsed.truncated
    few = publisher.snapshot(_state(pending_gang_resource_requests=many[:3]), 0, LABEL)
    assert few["truncated"] is False


def test_failures_are_logged_once_per_outage_and_retried_at_every_interval() -> None:
    reads = iter([OSError("GCS down"), OSError("GCS down"), _state(), _state(), _state()])
    written: list[bytes] = []
    put_failures = [RuntimeError("HTTP Error 503")]

    def read() -> Any:
        item = next(reads)
        if isinstance(item, Exception):
            raise item
        return item

    def write(body: bytes) -> None:
        if len(written) == 1 and put_failures:
            raise put_failures.pop()
        written.append(body)

    lines: list[str] = []
    sleeps: list[float] = []
    publisher.run(read, write, LABEL, 5, lines.append, now=lambda: 7.0, sleep=sleeps.append, rounds=5)
    assert [line.split(" (")[0] for line in lines] == [
        "cannot publish the demand",
        "publishing the demand again",
        "cannot publish the demand",
        "publishing the demand again",
    ]
    assert "GCS down" in lines[0] and "503" in lines[2]
    assert sleeps == [5] * 4
    assert [json.loads(body)["at"] for body in written] == [7.0, 7.0]


def test_the_value_is_put_where_getguestattributes_finds_it(metadata: MetadataServer) -> None:
    """The simulator's metadata server refuses a PUT without the Metadata-Flavor header, as Google's does."""
    body = publisher.encode(publisher.snapshot(_state(), 3.0, LABEL))
    namespace, key = names.GUEST_ATTRIBUTE_NAMESPACE, names.DEMAND_KEY
    url = f"{metadata.url}/computeMetadata/v1/instance/guest-attributes/{namespace}/{key}"
    publisher.put(url, body)
    assert metadata.guest[names.GUEST_ATTRIBUTE_NAMESPACE][names.DEMAND_KEY] == body.decode()
    assert demand.parse(metadata.guest[names.GUEST_ATTRIBUTE_NAMESPACE][names.DEMAND_KEY]).at == 3.0


def test_only_an_elastic_clusters_script_carries_the_publisher() -> None:
    elastic = spec.load(ELASTIC, require_zone=False)
    fixed = spec.load(FIXED, require_zone=False)
    shipped = script_variables(elastic, RenderOptions())["demand_publisher"]
    assert isinstance(shipped, str) and base64.b64decode(shipped) == DEMAND_PUBLISHER.read_bytes()
    assert script_variables(fixed, RenderOptions())["demand_publisher"] == ""
    assert f"DEMAND_PUBLISHER={shipped}" in render(elastic)
    assert "DEMAND_PUBLISHER=''" in render(fixed)


def test_the_publisher_needs_only_the_standard_library_and_ray() -> None:
    """It runs on the head, which does not install rayslice: no rayslice import, lazy or not."""
    found = imported_modules(DEMAND_PUBLISHER.read_text(), publisher.__name__, is_package=False)
    assert found and {name.split(".")[0] for _, name in found} <= {
        "__future__",
        "argparse",
        "collections",
        "datetime",
        "json",
        "sys",
        "time",
        "typing",
        "urllib",
        "ray",
    }


def _publisher(box: sandbox.Sandbox) -> tuple[int, list[str]] | None:
    pidfile = box.root / "var/lib/rayslice/rayslice-demand.pid"
    if not pidfile.exists():
        return None
    group = sandbox.group_processes(int(pidfile.read_text()))
    running = [p for p in group if any("demand_publisher.py" in a for a in p[1])]
    return running[0] if running else None


@pytest.mark.parametrize("elastic", [True, False], ids=["elastic", "fixed"])
def test_the_head_vm_of_an_elastic_cluster_starts_the_publisher_under_its_own_supervisor(
    host: list[sandbox.Sandbox], tmp_path: Path, elastic: bool
) -> None:
    """Real bash in the boot sandbox, the head VM of a token-auth cluster: once Ray's venv and the
    token are in place and the GCS port answers, its own supervisor runs the publisher with the
    venv's Python, Ray's token in its environment, and the guest attribute's URL; a fixed
    cluster's head starts none."""
    cluster = spec.load(ELASTIC if elastic else FIXED, require_zone=False)
    attributes = host_attributes(cluster, names.HEAD_VM_SLICE_INDEX, token_secret="ray-token")
    cloud = sandbox.StubCloud(
        sandbox.base_metadata(attributes, name=names.head_name(cluster.name)), {"ray-token": "t0ken"}
    )
    box = sandbox.Sandbox(tmp_path, cloud)
    host.append(box)
    port = sandbox.free_port()
    gcs = socket.create_server(("127.0.0.1", port))  # the stub `ray start` opens no GCS port
    pidfile = box.root / "var/lib/rayslice/rayslice-demand.pid"
    try:
        # The sandbox's venv Python is a bare link to this one, which finds no site-packages there.
        site = str(Path(ray.__file__).parent.parent)
        assert (
            box.boot(box.render(cluster, port), RAYSLICE_DEMAND_INTERVAL_S="1", PYTHONPATH=site).returncode
            == 0
        )
        box.wait(lambda: cloud.state == names.STATE_JOINED)
        if not elastic:
            time.sleep(2)
            assert not pidfile.exists() and "rayslice-demand" not in box.log
            return
        box.wait(lambda: _publisher(box) is not None and "rayslice-demand: publishing" in box.log)
        found = _publisher(box)
        assert found is not None
        pid, argv = found
        assert argv[0] == str(box.root / "opt/rayslice/venv/bin/python")
        assert argv[1:6] == [
            str(box.root / "var/lib/rayslice/demand_publisher.py"),
            f"--gcs-address=127.0.0.1:{port}",
            "--attribute-url=http://metadata.google.internal/computeMetadata/v1/instance/guest-attributes/"
            f"{names.GUEST_ATTRIBUTE_NAMESPACE}/{names.DEMAND_KEY}",
            f"--slice-label={LABEL}",
            "--interval-s=1",
        ]
        environ = dict(
            line.split("=", 1)
            for line in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
            if "=" in line
        )
        assert environ["RAY_AUTH_MODE"] == "token"
        assert environ["RAY_AUTH_TOKEN_PATH"] == str(box.root / "etc/rayslice/ray-token")
        assert (
            box.root / "var/lib/rayslice/demand_publisher.py"
        ).read_bytes() == DEMAND_PUBLISHER.read_bytes()
    finally:
        gcs.close()
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)


def test_what_request_resources_left_for_autoscaler_v1_is_read_as_a_constraint() -> None:
    """A head started with `ray start` runs autoscaler v1: request_resources then writes a JSON
    list of bundles to the internal KV, which the publisher reads beside the GCS's constraints."""
    asked = publisher.requested_v1(json.dumps([{"TPU": 4}] * 8 + [{"CPU": 2}]).encode())
    state = _state(cluster_resource_constraints=[asked])
    value = publisher.snapshot(state, 5.0, LABEL)
    assert value["asked"] == [{"shape": {"TPU": 4.0}, "count": 8}, {"shape": {"CPU": 2.0}, "count": 1}]
    assert demand.slices_asked(demand.parse(publisher.encode(value).decode()), "v6e-16", 16) == 2
    for nothing in (None, b"", b"[]", b"not json", b'{"TPU": 4}', b'[{"TPU": "four"}]'):
        assert publisher.requested_v1(nothing) is None
