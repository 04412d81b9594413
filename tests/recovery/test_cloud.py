"""The controller's own entry point run once against the emulation, and what it does when the
API cannot be reached (the endpoints and the error mapping: tests/cloud/test_rest.py)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from rayslice import names
from rayslice.cloud.rest import TPU_ENDPOINT_ENV
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.recovery import controller
from tests.recovery.conftest import CLUSTER, PROJECT, ZONE, seed


def test_the_service_entry_point_recovers_once_and_logs_json_lines(
    cloud: CloudApiEmulator, adc: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(cloud, "tpu-vm")
    cloud.preempt(PROJECT, ZONE, names.slice_name(CLUSTER, 0))
    cloud.op_polls = 0
    log = tmp_path / "recovery.jsonl"
    args = [
        "--project",
        PROJECT,
        "--zone",
        ZONE,
        "--cluster",
        CLUSTER,
        "--platform",
        "tpu-vm",
        "--slices",
        "2",
    ]
    args += ["--state-dir", str(tmp_path / "state")]
    code = controller.main([*args, "--once", "--event-log", str(log), "--no-guest-attributes"])
    assert code == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == [json.loads(line) for line in log.read_text().splitlines()]
    # Never seen whole by this fresh process, so it has only the preempted node's own spec.
    assert [(e["slice"], e["action"], e["outcome"]) for e in printed] == [
        (names.slice_name(CLUSTER, 0), "recreate", "recreated")
    ]
    assert log.stat().st_mode & 0o777 == 0o600
    kept = tmp_path / "state" / f"{names.slice_name(CLUSTER, 0)}.json"
    assert json.loads(kept.read_text())["recreation"] is None and kept.stat().st_mode & 0o777 == 0o600


# ---- failures leave the client as rayslice errors (the CLI's exit 3), translated once -----------


def test_a_refused_connection_is_a_transient_failure_for_the_controller(
    cloud: CloudApiEmulator,
    adc: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The controller reads an API it cannot reach as nothing seen: it records nothing and goes on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/"
    monkeypatch.setenv(TPU_ENDPOINT_ENV, closed)
    args = [f"--project={PROJECT}", f"--zone={ZONE}", f"--cluster={CLUSTER}", "--platform=tpu-vm"]
    args += ["--slices=2", f"--state-dir={tmp_path}"]
    assert controller.main([*args, "--once", "--no-guest-attributes"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # no event
    lines = captured.err.splitlines()
    assert [line.split(": GET")[0] for line in lines] == [
        f"rayslice-recovery: could not read {names.slice_name(CLUSTER, i)}" for i in range(2)
    ]
    assert all(line.endswith("failed: no answer: Connection refused") for line in lines)
