"""`rayslice status` against the emulated cloud, with real (emulator-issued) credentials."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from rayslice import cli, names
from rayslice.errors import EXIT_NO_CLUSTER, NoCredentials
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery.cloud import CloudClient
from tests.recovery.conftest import CLUSTER, LOCATION, PROJECT, ZONE, make_controller, seed

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
    head_metadata: MetadataServer,
    capsys: pytest.CaptureFixture[str],
    platform: str,
) -> None:
    seed(cloud, platform)
    _publish_states(cloud, platform)
    head_metadata.guest[names.GUEST_ATTRIBUTE_NAMESPACE] = {names.STATE_KEY: names.STATE_JOINED}
    controller, _ = make_controller(client, platform, head_metadata)
    controller.step()
    cloud.preempt(PROJECT, ZONE, SLICE1)
    controller.step()  # recreates slice 1 and publishes one event on the head VM
    _publish_states(cloud, platform)  # the new hosts boot and publish again
    capsys.readouterr()

    assert cli.main(["status", *ARGS, "--set", f"platform={platform}", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cluster"] == CLUSTER and data["platform"] == platform
    assert data["head"] == {"name": names.head_name(CLUSTER), "boot": names.STATE_JOINED}
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
    assert cloud.mutations() == []  # status only reads


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
