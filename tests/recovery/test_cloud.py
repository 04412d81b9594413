"""Endpoint overrides, and the controller's own entry point run once against the emulation."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import requests

from rayslice import names
from rayslice.errors import EXIT_NO_CLUSTER, CloudError, InvalidInput, RaysliceError
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.recovery import cloud as cloud_module
from rayslice.recovery import controller
from rayslice.recovery.cloud import (
    COMPUTE_DEFAULT,
    COMPUTE_ENDPOINT_ENV,
    TPU_DEFAULT,
    TPU_ENDPOINT_ENV,
    CloudClient,
    endpoint,
)
from tests.recovery.conftest import CLUSTER, LOCATION, PROJECT, ZONE, seed


def test_endpoints_default_to_googles_and_follow_gclouds_override_variables() -> None:
    assert endpoint(TPU_ENDPOINT_ENV, TPU_DEFAULT, {}) == "https://tpu.googleapis.com/"
    assert endpoint(COMPUTE_ENDPOINT_ENV, COMPUTE_DEFAULT, {}) == "https://compute.googleapis.com/compute/v1/"
    env = {COMPUTE_ENDPOINT_ENV: "https://compute.example.internal/compute/v1"}
    assert (
        endpoint(COMPUTE_ENDPOINT_ENV, COMPUTE_DEFAULT, env) == "https://compute.example.internal/compute/v1/"
    )
    for allowed in ("http://127.0.0.1:9000/", "http://10.88.0.1:8080/", "http://100.71.76.1:8780/"):
        assert endpoint(TPU_ENDPOINT_ENV, TPU_DEFAULT, {TPU_ENDPOINT_ENV: allowed}) == allowed


@pytest.mark.parametrize(
    "value", ["http://tpu.example.com/", "http://8.8.8.8/", "http://100.128.0.1/", "ftp://10.0.0.1/", "tpu"]
)
def test_an_override_that_would_send_the_token_in_clear_over_the_internet_is_refused(value: str) -> None:
    with pytest.raises(InvalidInput, match=TPU_ENDPOINT_ENV):
        endpoint(TPU_ENDPOINT_ENV, TPU_DEFAULT, {TPU_ENDPOINT_ENV: value})


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


def test_a_call_that_gets_no_answer_in_time_is_a_cloud_error_naming_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cloud_module, "REQUEST_TIMEOUT_S", 0.3)
    with socket.socket() as silent:  # accepts the connection (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        base = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        client = CloudClient(requests.Session(), LOCATION, tpu_base=base, compute_base=base)
        with pytest.raises(CloudError) as caught:
            client.list_nodes()
    error = caught.value
    assert isinstance(error, RaysliceError) and error.exit_code == EXIT_NO_CLUSTER
    assert error.status is None and error.call == f"GET {base}v2/projects/{PROJECT}/locations/{ZONE}/nodes"
    assert str(error) == f"{error.call} failed: no answer: no answer within 0.3 s"


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
