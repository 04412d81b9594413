"""Hostile records: every shape of damaged or crafted record a job (or a broken disk) can leave,
read by `rayslice history`, `rayslice goodput` and what `rayslice local down` reads
(`recording.collect`). Each gives a clean result or exit 2 with one line, never a traceback, and
nothing a job wrote reaches the terminal as a control character."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from rayslice import cli
from rayslice.local.simulation import recording
from rayslice.observability import record
from tests.observability.test_commands import PREFIX, make_record

OSC52 = "\x1b]52;c;cm0gLXJmIH4=\x07"  # a terminal clipboard write
JOB = "jobs/raysubmit_1"
DEEP = b"[" * 100_000 + b"]" * 100_000


def _put(root: Path, key: str, data: bytes) -> None:
    """Write (or replace) a file of the record as a job or a damaged disk would: no rules."""
    path = root / PREFIX / key
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    path.write_bytes(data)


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


def _log_lines(*lines: bytes) -> Callable[[Path], None]:
    return lambda root: _put(root, f"{JOB}/log-000099.jsonl", b"\n".join(lines) + b"\n")


def _fifo(key: str) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        path = root / PREFIX / key
        path.unlink()
        os.mkfifo(path)

    return make


def _link(key: str, target: str) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        path = root / PREFIX / key
        if path.is_dir() and not path.is_symlink():
            path.rename(path.with_name(path.name + "-moved"))
        else:
            path.unlink()
        path.symlink_to(target)

    return make


def _event(value: object) -> Callable[[Path], None]:
    data = value if isinstance(value, bytes) else _json(value) + b"\n"
    return lambda root: _put(root, record.chunk_key("events/ctl", 0, len(data), "0a1b2c3d"), data)


SHAPES: dict[str, Callable[[Path], None]] = {
    "cluster.json bad UTF-8": lambda r: _put(r, "cluster.json", b'{"cluster": "\xff\xfe", "started": 1.0}'),
    "cluster.json not JSON": lambda r: _put(r, "cluster.json", b"{not json"),
    "cluster.json a list": lambda r: _put(r, "cluster.json", b"[1, 2]"),
    "cluster.json 100,000 deep": lambda r: _put(r, "cluster.json", DEEP),
    "cluster.json 2 MiB": lambda r: _put(r, "cluster.json", _json({"summary": "x" * 2_000_000})),
    "started 1e300": lambda r: _put(r, "cluster.json", b'{"started": 1e300}'),
    "started a list": lambda r: _put(r, "cluster.json", _json({"started": [1, 2]})),
    "started a word": lambda r: _put(r, "cluster.json", _json({"started": "yesterday"})),
    "started NaN": lambda r: _put(r, "cluster.json", b'{"started": NaN}'),
    "started -5": lambda r: _put(r, "cluster.json", b'{"started": -5}'),
    "started true": lambda r: _put(r, "cluster.json", b'{"started": true}'),
    "started 5000 digits": lambda r: _put(r, "cluster.json", b'{"started": ' + b"9" * 5000 + b"}"),
    "summary escapes": lambda r: _put(r, "cluster.json", _json({"started": 1.0, "summary": OSC52})),
    "cluster.json a FIFO": _fifo("cluster.json"),
    "cluster.json links to environ": _link("cluster.json", "/proc/self/environ"),
    "ended.json not JSON": lambda r: _put(r, "ended.json", b"\x00\x01"),
    "ended a dict": lambda r: _put(r, "ended.json", _json({"ended": {"a": 1}})),
    "submitted bad UTF-8": lambda r: _put(r, f"{JOB}/submitted.json", b'{"job_id": "raysubmit_1\xff"}'),
    "submitted not JSON": lambda r: _put(r, f"{JOB}/submitted.json", b"]]"),
    "submitted deep": lambda r: _put(r, f"{JOB}/submitted.json", DEEP),
    "submitted a list": lambda r: _put(
        r, f"{JOB}/submitted.json", _json({"job_id": "raysubmit_1", "submitted": []})
    ),
    "submitted names another job": lambda r: _put(
        r, f"{JOB}/submitted.json", _json({"job_id": "raysubmit_2"})
    ),
    "entrypoint a dict": lambda r: _put(
        r, f"{JOB}/submitted.json", _json({"job_id": "raysubmit_1", "entrypoint": {"x": 1}, "submitted": 1.0})
    ),
    "entrypoint escapes": lambda r: _put(
        r, f"{JOB}/submitted.json", _json({"job_id": "raysubmit_1", "entrypoint": OSC52, "submitted": 1.0})
    ),
    "restart_of a list": lambda r: _put(
        r, f"{JOB}/submitted.json", _json({"job_id": "raysubmit_1", "restart_of": ["x"], "submitted": 1.0})
    ),
    "restart_of a path": lambda r: _put(
        r, f"{JOB}/submitted.json", _json({"job_id": "raysubmit_1", "restart_of": "../x", "submitted": 1.0})
    ),
    "status a list": lambda r: _put(r, f"{JOB}/ended.json", _json({"status": ["FAILED"], "ended": 1.0})),
    "job ended 1e300": lambda r: _put(r, f"{JOB}/ended.json", b'{"status": "FAILED", "ended": 1e300}'),
    "job ended.json a FIFO": _fifo(f"{JOB}/ended.json"),
    "jobs folder a link": _link("jobs", "/etc"),
    "a job with only its end": lambda r: _put(r, "jobs/raysubmit_9/ended.json", _json({"status": "X"})),
    "log line not JSON": _log_lines(b"not json"),
    "log line bad UTF-8": _log_lines(b'{"t": 5000.0, "line": "\xff\xfe"}'),
    "log line a list": _log_lines(b"[1, 2]"),
    "log time a list": _log_lines(_json({"t": [1], "line": "x"})),
    "log time 1e300": _log_lines(b'{"t": 1e300, "line": "step 99  loss 1"}'),
    "log line a dict": _log_lines(_json({"t": 5000.0, "line": {"a": 1}})),
    "log line deep": _log_lines(DEEP),
    "log line escapes": _log_lines(_json({"t": 1099.5, "line": f"step  21  loss 0.1 {OSC52}"})),
    "log empty": _log_lines(b""),
    "mark a word": lambda r: _put(r, f"{JOB}/mark-node_died.json", _json({"node_died": "soon"})),
    "mark not JSON": lambda r: _put(r, f"{JOB}/mark-whole_again.json", b"{"),
    "event not JSON": _event(b"not json\n"),
    "event bad UTF-8": _event(b'{"time": "\xff"}\n'),
    "event time a number": _event({"time": 5, "slice": "s"}),
    "event time not a date": _event({"time": "9999-99-99", "slice": "s"}),
    "event time overflows": _event({"time": "0001-01-01T00:00:00+23:59", "slice": "s"}),
    "event slice a dict": _event({"time": "1970-01-01T00:17:25+00:00", "slice": {"x": [1]}}),
    "event escapes": _event({"time": "1970-01-01T00:17:25+00:00", "slice": OSC52, "outcome": OSC52}),
    "event piece lies about its length": lambda r: _put(
        r, record.chunk_key("events/ctl", 0, 999_999_999_999), b'{"time": "9"}\n'
    ),
    "events a link to /proc": _link("events", "/proc/self"),
    "a driver log named with escapes": lambda r: _put(
        r, f"hosts/rayslice-head/ray/session_2/job-driver-x{OSC52}.log/000000000000-000000000003", b"hi\n"
    ),
    "a host file named with a space": lambda r: _put(r, "hosts/rayslice-head/boot.log/a b", b"x\n"),
    "a job folder named with escapes": lambda r: _put(
        r, f"jobs/{OSC52}/submitted.json", _json({"job_id": OSC52})
    ),
}
COMMANDS = (
    ("history",),
    ("history", "ab12cd"),
    ("history", "--job", "raysubmit_1"),
    ("history", "--json", "ab12cd"),
    ("goodput",),
    ("goodput", "raysubmit_1"),
)


def _no_control_characters(text: str) -> bool:
    return not any(ord(c) < 32 and c != "\n" for c in text) and "\x7f" not in text


@pytest.mark.parametrize("shape", SHAPES)
def test_a_hostile_record_gives_a_clean_result_or_one_line(
    shape: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_record(tmp_path)
    SHAPES[shape](tmp_path)
    for args in COMMANDS:
        code = cli.main([args[0], "--record", str(tmp_path), *args[1:]])
        out, err = capsys.readouterr()
        assert code in (0, 2), (args, code, out, err)
        errors = [line for line in err.splitlines() if not line.startswith("rayslice: skipped ")]
        if code == 2:
            assert len(errors) == 1 and errors[0].startswith("rayslice: "), (args, err)
        else:
            assert errors == [], (args, err)
        assert _no_control_characters(out) and _no_control_characters(err), (args, out, err)
    assert "\x1b" not in out


class _Simulation(SimpleNamespace):
    """What `recording.collect` asks of a simulation, for one whose hosts are off already."""

    def power_off_all(self, names: object) -> None:
        self.powered_off = list(names)  # type: ignore[call-overload]

    def spec(self) -> SimpleNamespace:
        return SimpleNamespace(name="rayslice", accelerator_type="v5litepod-8", slices=1, platform="tpu-vm")

    def paths(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(console=self.state_dir / f"{name}.console")

    def dashboard_url(self) -> str:
        return "http://127.0.0.1:9"  # nothing listens: the head is down


@pytest.mark.parametrize("shape", SHAPES)
def test_local_down_collects_a_hostile_record_without_failing(shape: str, tmp_path: Path) -> None:
    state_dir = tmp_path / "local"
    state_dir.mkdir(mode=0o700)
    root = recording.record_root(state_dir)
    make_record(root)
    SHAPES[shape](root)
    machines = [SimpleNamespace(name="rayslice-head")]
    sim = _Simulation(
        state_dir=state_dir,
        token_file=state_dir / "ray-token",
        plan=SimpleNamespace(run_id="ab12cd", machines=machines, head=machines[0], config={}),
    )
    assert recording.collect(sim) == str(root / PREFIX)  # type: ignore[arg-type]
    assert sim.powered_off == ["rayslice-head"]  # before anything of the record was read
    assert record.CLUSTER_ENDED in os.listdir(root / PREFIX) or shape.startswith("ended")
