"""The Spot hosts' preemption watcher (`rayslice.startup_scripts.preemption_watcher`): it waits on
the simulator's real metadata server as on Google's, survives that server's failures, drains this
host's Ray nodes once on the notice (retrying a GCS that does not answer), stops Ray on the
timeline GCE's notice leaves, and is only shipped in a Spot slice's boot script. Its run against
real Ray nodes is in tests/integration/test_recovery.py.
"""

from __future__ import annotations

import base64
import threading
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayslice import names, spec
from rayslice.local.google.metadata_server import PREEMPTED_PATH, MetadataServer
from rayslice.startup_scripts import preemption_watcher as watcher
from rayslice.startup_scripts import render
from rayslice.startup_scripts.options import RenderOptions
from rayslice.startup_scripts.variables import PREEMPTION_WATCHER, script_variables
from tests import serving
from tests.imports import imported_modules


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    metadata = MetadataServer(("127.0.0.1", 0), {"instance": {"preempted": "FALSE"}}, unavailable_for=1.0)
    serving.start(metadata)
    yield metadata
    serving.stop(metadata)


def test_it_waits_through_the_servers_failures_and_returns_on_the_notice(server: MetadataServer) -> None:
    """The server answers 503 for its first second: logged once, retried; then the request is held
    (FALSE) until the notice turns the key TRUE, and the watcher returns at once."""
    lines: list[str] = []
    done = threading.Event()
    url = f"{server.url}/computeMetadata/v1"
    thread = threading.Thread(
        target=lambda: (
            watcher.wait_for(watcher.TRUE, url, lines.append, wait_s=20, max_delay_s=0.2),
            done.set(),
        )
    )
    thread.start()
    assert not done.wait(2.0)  # past the failures, held on FALSE
    assert [line.split(" (")[0] for line in lines] == [
        "cannot read instance/preempted",
        "instance/preempted readable again",
    ]
    assert "503" in lines[0]
    server.set_value(PREEMPTED_PATH, "TRUE")
    assert done.wait(10)
    thread.join()


def test_every_kind_of_failure_is_retried_with_a_capped_backoff_and_the_etag_kept() -> None:
    """Refused connections, HTTP errors, a dropped answer; then held answers carry the ETag back."""
    answers: list[object] = [
        ConnectionRefusedError("refused"),
        urllib.error.HTTPError("u", 503, "down", None, None),  # type: ignore[arg-type]
        TimeoutError("timed out"),
        ConnectionResetError("reset"),
        ("FALSE", "e1"),
        ("FALSE", "e1"),
        ("TRUE", "e2"),
    ]
    asked: list[str] = []
    slept: list[float] = []

    def read(url: str, etag: str, wait_s: float) -> tuple[str, str]:
        asked.append(etag)
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, tuple)
        return answer

    lines: list[str] = []
    watcher.wait_for(watcher.TRUE, "http://x", lines.append, read=read, sleep=slept.append, max_delay_s=4)
    assert slept == [1, 2, 4, 4]
    assert asked == ["0", "0", "0", "0", "0", "e1", "e1"]
    assert len(lines) == 2  # one line per outage, one when it ends


def test_a_host_without_a_notice_only_waits() -> None:
    """A host that never gets the notice (on-demand hosts get no watcher at all): held answers,
    FALSE each time, and nothing else happens."""
    reads = 0

    def read(url: str, etag: str, wait_s: float) -> tuple[str, str]:
        nonlocal reads
        reads += 1
        if reads > 50:
            raise KeyboardInterrupt  # the test's way out of the endless wait
        return "FALSE", "e"

    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        watcher.wait_for(watcher.TRUE, "http://x", lines.append, read=read, sleep=pytest.fail)
    assert lines == []


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_drain_retries_an_unreachable_gcs_and_a_refusal_and_drains_each_node_once() -> None:
    clock = Clock()
    nodes: list[object] = [RuntimeError("GCS unreachable"), [], ["a", "b"], ["a", "b"], ["a", "b"]]
    verdicts = {"a": [(True, "")], "b": [(False, "busy"), (True, "")]}
    calls: list[tuple[str, int]] = []

    def own_nodes() -> list[str]:
        answer = nodes.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, list)
        return answer

    def drain_node(node: str, deadline_ms: int) -> tuple[bool, str]:
        calls.append((node, deadline_ms))
        return verdicts[node].pop(0)

    lines: list[str] = []
    timeline = watcher.Timeline.from_notice(clock.now, 30)
    drained = watcher.drain(drain_node, own_nodes, timeline, lines.append, now=clock.time, sleep=clock.sleep)
    assert drained == ["a", "b"]
    assert [n for n, _ in calls] == ["a", "b", "b"]
    assert {ms for _, ms in calls} == {int((1000.0 + 30) * 1000)}  # the notice's deadline, absolute
    assert any("GCS unreachable" in line for line in lines)
    assert any("refused: busy" in line for line in lines)


def test_drain_gives_up_when_it_is_time_to_stop_ray() -> None:
    clock = Clock()

    def own_nodes() -> list[str]:
        raise RuntimeError("GCS unreachable")

    lines: list[str] = []
    timeline = watcher.Timeline.from_notice(clock.now, 30)
    drained = watcher.drain(pytest.fail, own_nodes, timeline, lines.append, now=clock.time, sleep=clock.sleep)
    assert drained == [] and clock.now == timeline.stop_ray == 1020
    assert lines[-1] == "time to stop Ray; drained 0 node(s)"


def test_gces_notice_drains_at_once_and_stops_ray_ten_seconds_before_the_vm_stops(tmp_path: Path) -> None:
    """GCE's 30 s and a job that never says its checkpoint is committed: the marker is written
    before anything else (the boot script starts no Ray from then on), the node drained at the
    notice with the VM's deadline, `ray stop` at notice + 20 s with its 5 s grace, so Ray is gone
    from the GCS before the drain's deadline, when Ray Train restarts."""
    clock = Clock()
    marker = tmp_path / "preempted"
    events: list[tuple[float, str]] = []

    def drain_node(node: str, deadline_ms: int) -> tuple[bool, str]:
        assert marker.exists()
        events.append((clock.now, f"drain {node} {deadline_ms}"))
        return True, ""

    def stop_ray() -> int:
        events.append((clock.now, "stop"))
        return 0

    timeline = watcher.Timeline.from_notice(clock.now, names.PREEMPTION_NOTICE_S)
    lines: list[str] = []
    watcher.on_notice(
        drain_node,
        lambda: ["a"],
        lambda node: False,
        timeline,
        marker,
        stop_ray,
        lines.append,
        now=clock.time,
        sleep=clock.sleep,
    )
    assert events == [(1000.0, "drain a 1030000"), (1020.0, "stop")]
    assert marker.exists()
    assert watcher.STOP_GRACE_S == 5 and watcher.STOP_BEFORE_DEADLINE_S == 10
    assert lines[-2:] == ["stopping Ray on this host, 10 s before the VM stops", "ray stop exited 0"]


def test_a_short_notice_stops_ray_at_once_after_the_drain(tmp_path: Path) -> None:
    """A notice shorter than the stop's lead: no waiting, Ray stops right after the drain."""
    clock = Clock()
    timeline = watcher.Timeline.from_notice(clock.now, 5)
    assert timeline.stop_ray == timeline.notice
    stopped: list[float] = []
    watcher.on_notice(
        lambda node, ms: (True, ""),
        lambda: ["a"],
        lambda node: False,
        timeline,
        tmp_path / "preempted",
        lambda: stopped.append(clock.now) or 0,
        lambda line: None,
        now=clock.time,
        sleep=clock.sleep,
    )
    assert stopped == [1000.0]


def test_ray_stops_as_soon_as_the_jobs_checkpoint_is_committed(tmp_path: Path) -> None:
    """The job's workers say when Ray Train has their just-in-time checkpoint (here 4.2 s after
    the notice): Ray stops then, within one poll, not 20 s after the notice. A node that shut
    itself down (drained and idle) is not waited for."""
    clock = Clock()
    committed_at = {"a": 1004.2}
    alive = [["a", "idle"], ["a"]]
    stopped: list[float] = []
    lines: list[str] = []

    def own_nodes() -> list[str]:
        return alive.pop(0) if len(alive) > 1 else alive[0]

    watcher.on_notice(
        lambda node, ms: (True, ""),
        own_nodes,
        lambda node: clock.now >= committed_at.get(node, float("inf")),
        watcher.Timeline.from_notice(clock.now, names.PREEMPTION_NOTICE_S),
        tmp_path / "preempted",
        lambda: stopped.append(clock.now) or 0,
        lines.append,
        now=clock.time,
        sleep=clock.sleep,
    )
    [at] = stopped
    assert 1004.2 <= at <= 1004.2 + watcher.CHECKPOINT_POLL_S + 1e-9
    assert "every job on this host has committed its checkpoint" in lines
    assert lines[-2] == "stopping Ray on this host, 26 s before the VM stops"


def test_waiting_for_the_checkpoints_outlasts_the_gcss_failures_until_the_stop() -> None:
    """An unreachable GCS is logged once and asked again; when the stop's time comes Ray stops
    whatever the keys say."""
    clock = Clock()
    lines: list[str] = []

    def checkpointed(node: str) -> bool:
        raise RuntimeError("GCS unreachable")

    timeline = watcher.Timeline.from_notice(clock.now, 30)
    done = watcher.wait_for_checkpoints(
        lambda: ["a"], checkpointed, timeline, lines.append, now=clock.time, sleep=clock.sleep
    )
    assert not done and clock.now == pytest.approx(timeline.stop_ray)
    assert lines == ["cannot read the checkpoints' keys (GCS unreachable); retrying"]


def test_the_watcher_reads_the_checkpoints_keys_where_the_jobs_put_them() -> None:
    """Its own copy of `names`' key (it runs where rayslice is not installed)."""
    assert watcher.JIT_CHECKPOINT_NAMESPACE == names.JIT_CHECKPOINT_NAMESPACE
    assert watcher.JIT_CHECKPOINT_KEY_PREFIX == names.JIT_CHECKPOINT_KEY_PREFIX


def test_ray_is_stopped_with_the_venvs_ray_and_the_grace_period(tmp_path: Path) -> None:
    """The stopper runs the given `ray` as `ray stop --grace-period=5` and returns its status."""
    fake = tmp_path / "ray"
    record = tmp_path / "argv"
    fake.write_text(f'#!/bin/sh\necho "$@" >{record}\nexit 3\n')
    fake.chmod(0o755)
    assert watcher.ray_stopper(str(fake))() == 3
    assert record.read_text().split() == ["stop", "--grace-period=5"]


def test_only_a_spot_slices_script_carries_the_watcher() -> None:
    """Quoted into the script as one base64 line (the quoting filter refuses newlines), decoded
    back to the module's own text; an on-demand slice's script has none to start."""
    spot = spec.load({"capacity": "spot", "platform": "compute", "slices": 2}, require_zone=False)
    on_demand = spec.load({"platform": "compute"}, require_zone=False)
    shipped = script_variables(spot, RenderOptions())["preemption_watcher"]
    assert isinstance(shipped, str) and base64.b64decode(shipped) == PREEMPTION_WATCHER.read_bytes()
    assert script_variables(on_demand, RenderOptions())["preemption_watcher"] == ""
    assert script_variables(spot, RenderOptions())["preemption_notice_s"] == names.PREEMPTION_NOTICE_S
    assert f"PREEMPTION_WATCHER={shipped}" in render(spot)
    assert "PREEMPTION_WATCHER=''" in render(on_demand)


def test_the_watcher_needs_only_the_standard_library_and_ray() -> None:
    """It runs on hosts that do not install rayslice: no rayslice import, lazy or not."""
    found = imported_modules(PREEMPTION_WATCHER.read_text(), watcher.__name__, is_package=False)
    assert found and {name.split(".")[0] for _, name in found} <= {
        "__future__",
        "argparse",
        "collections",
        "dataclasses",
        "datetime",
        "http",
        "pathlib",
        "subprocess",
        "sys",
        "time",
        "urllib",
        "ray",
    }
