"""The Spot hosts' preemption watcher (`rayslice.startup_scripts.preemption_watcher`): it waits on
the simulator's real metadata server as on Google's, survives that server's failures, drains this
host's Ray nodes once on the notice (retrying a GCS that does not answer), and is only shipped in
a Spot slice's boot script. Its run against real Ray nodes is in tests/integration/test_recovery.py.
"""

from __future__ import annotations

import base64
import threading
import urllib.error
from collections.abc import Iterator

import pytest

from rayslice import names, spec
from rayslice.local.google.metadata_server import PREEMPTED_PATH, MetadataServer
from rayslice.startup_scripts import preemption_watcher as watcher
from rayslice.startup_scripts import render
from rayslice.startup_scripts.options import RenderOptions
from rayslice.startup_scripts.variables import PREEMPTION_WATCHER, script_variables
from tests.imports import imported_modules


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    metadata = MetadataServer(("127.0.0.1", 0), {"instance": {"preempted": "FALSE"}}, unavailable_for=1.0)
    threading.Thread(target=metadata.serve_forever, daemon=True).start()
    yield metadata
    metadata.shutdown()
    metadata.server_close()


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
    drained = watcher.drain(drain_node, own_nodes, 30, lines.append, now=clock.time, sleep=clock.sleep)
    assert drained == ["a", "b"]
    assert [n for n, _ in calls] == ["a", "b", "b"]
    assert {ms for _, ms in calls} == {int((1000.0 + 30) * 1000)}  # the notice's deadline, absolute
    assert any("GCS unreachable" in line for line in lines)
    assert any("refused: busy" in line for line in lines)


def test_drain_gives_up_when_the_notice_deadline_has_passed() -> None:
    clock = Clock()

    def own_nodes() -> list[str]:
        raise RuntimeError("GCS unreachable")

    lines: list[str] = []
    drained = watcher.drain(pytest.fail, own_nodes, 10, lines.append, now=clock.time, sleep=clock.sleep)
    assert drained == [] and clock.now >= 1010
    assert lines[-1] == "notice deadline passed; drained 0 node(s)"


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
        "datetime",
        "http",
        "sys",
        "time",
        "urllib",
        "ray",
    }
