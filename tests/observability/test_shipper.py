"""The record shipper: a machine's logs into the cluster's record as they grow, whole lines only,
each piece once, secrets filtered, and what it ships read back whole (`record.streams`)."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from rayslice.observability import record, redaction
from rayslice.observability.shipper import Shipper, Sources
from rayslice.startup_scripts import variables
from rayslice.startup_scripts.options import RenderOptions
from tests.imports import closure
from tests.recovery.test_bundle import RUNNER, _mypy  # a zipapp run alone; mypy at the VM's Python

TOKEN = "f3c9a1e5b7d2" * 4  # the cluster's Ray token, as the host's token file holds it
HOST = "demo-slice-0-w0"
BOOT = f"hosts/{HOST}/boot.log"


def _shipper(tmp_path: Path, **sources: Path) -> tuple[Shipper, record.FolderBucket]:
    bucket = record.FolderBucket(tmp_path / "record")
    token = tmp_path / "ray-token"
    token.write_text(TOKEN + "\n")
    shipper = Shipper(
        record.ClusterRecord(bucket, "clusters/demo/run1"),
        Sources(HOST, tmp_path / "boot.log", **sources),
        tmp_path / "offsets.json",
        [token],
    )
    return shipper, bucket


def _streams(bucket: record.FolderBucket) -> dict[str, str]:
    prefix = "clusters/demo/run1"
    return {k.removeprefix(prefix + "/"): v for k, v in record.streams(bucket, prefix).items()}


def test_whole_lines_are_shipped_as_they_come_and_a_restart_goes_on_where_it_stopped(tmp_path: Path) -> None:
    log = tmp_path / "boot.log"
    log.write_text("booting\nhalf a li")
    shipper, bucket = _shipper(tmp_path)
    assert shipper.ship_once() == 1
    assert _streams(bucket) == {BOOT: "booting\n"}  # the cut line waits for its end
    with log.open("a") as out:
        out.write("ne\njoined\n")
    again, _ = _shipper(tmp_path)  # a new shipper (the supervisor restarted it): offsets from its file
    assert again.ship_once() == 1 and again.ship_once() == 0
    assert _streams(bucket) == {BOOT: "booting\nhalf a line\njoined\n"}
    keys = bucket.list("clusters/demo/run1")
    assert keys == [f"clusters/demo/run1/{BOOT}/000000000000-000000000008-{shipper.boot}",
                    f"clusters/demo/run1/{BOOT}/000000000008-000000000027-{again.boot}"]  # fmt: skip
    assert shipper.boot != again.boot  # a random part of its own at each start


def test_a_piece_shipped_again_after_a_lost_offset_is_read_once(tmp_path: Path) -> None:
    log = tmp_path / "boot.log"
    log.write_text("one\n")
    shipper, bucket = _shipper(tmp_path)
    shipper.ship_once()
    log.write_text("one\ntwo\n")
    (tmp_path / "offsets.json").unlink()  # stopped after writing, before noting the offset
    fresh, _ = _shipper(tmp_path)
    assert fresh.ship_once() == 1  # 0-8 now: a second object over the same start
    assert len(bucket.list("clusters/demo/run1")) == 2
    assert _streams(bucket) == {BOOT: "one\ntwo\n"}


def test_no_token_or_credential_reaches_the_record(tmp_path: Path) -> None:
    (tmp_path / "boot.log").write_text(
        f"ray start with {TOKEN} in an error\n"
        f"RAY_AUTH_TOKEN={TOKEN}\n"
        'metadata answered {"access_token": "ya29.a0AfB_secretvalue", "expires_in": 3599}\n'
        "pip: https://builder:hunter2-password@pypi.example.com/simple\n"
    )
    shipper, bucket = _shipper(tmp_path)
    shipper.ship_once()
    text = "".join(_streams(bucket).values())
    for secret in (TOKEN, "ya29.a0AfB_secretvalue", "hunter2-password"):
        assert secret not in text
    raw = b"".join(p.read_bytes() for p in (tmp_path / "record").rglob("*") if p.is_file())
    assert TOKEN.encode() not in raw and b"hunter2" not in raw
    assert text.count(redaction.REDACTED) == 4 and "ray start with" in text


def test_a_private_key_printed_across_two_passes_is_shipped_once_whole_and_redacted(tmp_path: Path) -> None:
    """The BEGIN and half the key are in the log at one pass, the rest and the END at the next:
    the shipper holds the piece back from the BEGIN's line until the END has come, so the block
    is redacted whole and nothing of the key, and nothing around it, is lost."""
    log = tmp_path / "boot.log"
    log.write_text("before\n-----BEGIN PRIVATE KEY-----\nMIIEfirsthalf\n")
    shipper, bucket = _shipper(tmp_path)
    assert shipper.ship_once() == 1
    assert _streams(bucket) == {BOOT: "before\n"}  # the key's lines wait
    with log.open("a") as out:
        out.write("secondhalf==\n-----END PRIVATE KEY-----\nafter\n")
    assert shipper.ship_once() == 1
    assert _streams(bucket) == {BOOT: f"before\n{redaction.REDACTED}\nafter\n"}


def test_the_last_pass_ships_a_key_that_never_ended_redacted_to_its_end(tmp_path: Path) -> None:
    (tmp_path / "boot.log").write_text("before\n-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIcut\n")
    shipper, bucket = _shipper(tmp_path)
    shipper.ship_once()
    assert shipper.ship_once(final=True) == 1
    assert _streams(bucket) == {BOOT: f"before\n{redaction.REDACTED}"}


def test_ray_driver_logs_and_events_and_the_controllers_decisions_are_streams(tmp_path: Path) -> None:
    ray = tmp_path / "ray"
    session = ray / "session_2026-12-06_18-00-00_123456_42"
    (session / "logs/events").mkdir(parents=True)
    (session / "logs/job-driver-raysubmit_abc.log").write_text("step 1 loss 2.0\n")
    (session / "logs/events/event_JOBS.log").write_text('{"event_id": "1"}\n')
    (session / "logs/raylet.out").write_text("not a driver log\n")
    (ray / "session_latest").symlink_to(session)
    (tmp_path / "boot.log").write_text("boot\n")
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"time": "2026-12-06T18:00:01Z", "kind": "preempted"}) + "\n")
    shipper, bucket = _shipper(tmp_path, ray_temp_dir=ray, events_file=events)
    shipper.ship_once()
    found = _streams(bucket)
    assert found == {
        BOOT: "boot\n",
        f"events/{HOST}": events.read_text(),
        f"hosts/{HOST}/ray/{session.name}/job-driver-raysubmit_abc.log": "step 1 loss 2.0\n",
        f"hosts/{HOST}/ray/{session.name}/events/event_JOBS.log": '{"event_id": "1"}\n',
    }
    assert record.events(bucket, "clusters/demo/run1") == [json.loads(events.read_text())]


def test_the_shipper_bundle_holds_its_import_closure_and_runs_alone(tmp_path: Path) -> None:
    """The zipapp the boot script carries is exactly the shipper's closure, and ships a log with
    nothing else of rayslice importable (as on a host, which has no rayslice)."""
    assert closure([variables.RECORD_SHIPPER_ENTRY]) == set(variables.RECORD_SHIPPER_MODULES)
    archive = tmp_path / "record_shipper.pyz"
    carried = variables.record_variables(RenderOptions())["record_shipper"]
    archive.write_bytes(base64.b64decode(str(carried)))
    (tmp_path / "boot.log").write_text("booted\n")
    args = [f"--record={tmp_path / 'record'}", f"--host={HOST}", f"--state-file={tmp_path / 'state.json'}"]
    args += [f"--boot-log={tmp_path / 'boot.log'}", "--interval-s=0.1"]
    process = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(archive), *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    bucket = record.FolderBucket(tmp_path / "record")
    try:
        for _ in range(100):
            if bucket.list():
                break
            subprocess.run(["sleep", "0.1"], check=True)
    finally:
        process.terminate()
        stdout, stderr = process.communicate(timeout=30)
    assert json.loads(stdout.splitlines()[-1]) == {"code": 0, "outside": []}, stderr
    assert record.streams(bucket, "") == {BOOT: "booted\n"}
    assert oct(os.stat(bucket.root / BOOT).st_mode & 0o777) == "0o700"


def test_the_shipper_bundle_type_checks_on_the_controller_vms_python(tmp_path: Path) -> None:
    """The controller's VM runs the shipper with its image's python3 (3.10), where rayslice itself
    needs 3.11: mypy, told that Python, refuses any name that Python lacks."""
    tree = tmp_path / "bundle"
    carried = variables.record_variables(RenderOptions())["record_shipper"]
    zipfile.ZipFile(io.BytesIO(base64.b64decode(str(carried)))).extractall(tree)
    result = _mypy(tree, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_fifo_or_a_link_among_rays_logs_is_never_read(tmp_path: Path) -> None:
    ray = tmp_path / "ray"
    logs = ray / "session_2026-12-06_18-00-00_123456_42/logs"
    logs.mkdir(parents=True)
    os.mkfifo(logs / "job-driver-raysubmit_fifo.log")  # a job's: opened blocking, it would stop the shipper
    (logs / "job-driver-raysubmit_link.log").symlink_to("/proc/self/environ")
    (logs / "job-driver-raysubmit_ok.log").write_text("step 1\n")
    (tmp_path / "boot.log").write_text("boot\n")
    shipper, bucket = _shipper(tmp_path, ray_temp_dir=ray)
    assert shipper.ship_once() == 2
    assert sorted(_streams(bucket)) == [
        BOOT,
        f"hosts/{HOST}/ray/{logs.parent.name}/job-driver-raysubmit_ok.log",
    ]


def test_a_piece_a_job_created_first_under_a_guessed_name_does_not_stop_shipping(tmp_path: Path) -> None:
    (tmp_path / "boot.log").write_text("booted\n")
    shipper, bucket = _shipper(tmp_path)
    taken = f"clusters/demo/run1/{BOOT}/000000000000-000000000007"  # the name the old shipper used
    bucket.write(taken, b"forged\n")
    assert shipper.ship_once() == 1
    assert bucket.list("clusters/demo/run1") == [taken, f"{taken}-{shipper.boot}"]
    assert bucket.read(f"{taken}-{shipper.boot}") == b"booted\n"
