"""The record: nothing secret written through it, objects written once, and a job's journal read back."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rayslice.errors import InvalidInput
from rayslice.observability import history, record
from tests.observability.test_redaction import RAY_TOKEN, SECRET_TEXT, SECRETS


def test_a_record_written_through_a_cluster_record_holds_no_secret(tmp_path: Path) -> None:
    rec = record.ClusterRecord(record.FolderBucket(tmp_path), "clusters/c/r1", known_secrets=(RAY_TOKEN,))
    rec.write_text("hosts/rayslice-head/boot.log", SECRET_TEXT)
    journal = record.open_journal(str(tmp_path / "clusters/c/r2"), "raysubmit_1", None, "python -m x")
    journal.lines(SECRET_TEXT)
    journal.end("SUCCEEDED")
    written = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    for secret in SECRETS[1:]:  # the journal knows no token by value: the patterns alone hold it back
        assert secret not in written
    assert "step  12  loss 0.51234" in written


def test_objects_are_written_once_and_private(tmp_path: Path) -> None:
    bucket = record.FolderBucket(tmp_path)
    bucket.write("clusters/c/r/cluster.json", b"{}")
    with pytest.raises(FileExistsError):
        bucket.write("clusters/c/r/cluster.json", b"{}")
    assert (tmp_path / "clusters/c/r/cluster.json").stat().st_mode & 0o777 == 0o600
    for level in ("clusters", "clusters/c", "clusters/c/r"):  # every folder it made is private too
        assert (tmp_path / level).stat().st_mode & 0o777 == 0o700
    assert bucket.list("clusters") == ["clusters/c/r/cluster.json"]
    assert not list(tmp_path.rglob(".*"))  # no temporary file left behind


@pytest.mark.parametrize("key", ["../x", "a//b", "/etc/passwd", "a/../b", ""])
def test_a_key_never_leaves_the_bucket(tmp_path: Path, key: str) -> None:
    with pytest.raises(InvalidInput):
        record.FolderBucket(tmp_path).write(key, b"x")


def test_a_journal_reads_back_as_the_runs_attempts(tmp_path: Path) -> None:
    where = str(tmp_path / "clusters/c/r")
    first = record.open_journal(where, "raysubmit_1", None, "python -m rayslice.workloads.jax_train", now=0.0)
    first.lines("slice s\nstep   0  loss 1.0\n", now=2.0)
    first.lines("step   1  loss 0.9\n", now=3.0)
    first.mark(record.MARK_NODE_DIED, now=5.0)
    first.end("FAILED", now=4.0)
    first.mark(record.MARK_WHOLE_AGAIN, now=8.0)
    second = record.open_journal(
        where, "raysubmit_2", "raysubmit_1", "python -m rayslice.workloads.jax_train", now=10.0
    )
    second.lines("resumed from step 1\nstep   1  loss 0.9\n", now=12.0)
    second.end("SUCCEEDED", now=13.0)
    bucket = record.FolderBucket(tmp_path / "clusters/c/r")
    [run] = history.training_runs(record.jobs(bucket, ""))
    assert [a.job_id for a in run.attempts] == ["raysubmit_1", "raysubmit_2"] and run.status == "SUCCEEDED"
    attempts = history.attempts(run)
    assert attempts[0].lines[1] == history.goodput.Line(2.0, "step   0  loss 1.0")
    assert (attempts[0].submitted, attempts[1].submitted) == (0.0, 10.0)
    assert (attempts[0].status, attempts[0].node_died, attempts[0].whole_again) == ("FAILED", 5.0, 8.0)
    assert history.run_goodput(run, []).steps_lost == 1


def test_a_journal_whose_folder_is_blocked_by_a_file_says_so_once_and_raises_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    journal = record.open_journal(str(blocked / "clusters/c/r"), "raysubmit_1", None, "x")
    journal.lines("step   0  loss 1.0\n")
    journal.end("SUCCEEDED")
    assert capsys.readouterr().err.count("not recording job raysubmit_1") == 1


def test_a_job_without_a_record_location_gets_the_journal_that_writes_nothing() -> None:
    assert record.open_journal(None, "raysubmit_1", None, "x") is record.NO_JOURNAL


def test_controller_events_are_read_from_every_events_object(tmp_path: Path) -> None:
    bucket = record.FolderBucket(tmp_path)
    late = {
        "time": "2026-12-06T10:00:05+00:00",
        "slice": "s",
        "seen": "x",
        "action": "recreate",
        "outcome": "ok",
    }
    early = late | {"time": "2026-12-06T10:00:01+00:00"}
    bucket.write("c/events/controller.jsonl", (json.dumps(late) + "\nnot json\n").encode())
    bucket.write("c/events/1.json", json.dumps(early).encode())
    found = record.events(bucket, "c")
    assert [e["time"] for e in found] == [early["time"], late["time"]]
    [event, _] = history.controller_events(found)
    assert event.time == history.unix_time("2026-12-06T10:00:01+00:00")


def test_a_piece_counts_only_if_it_holds_what_its_name_claims_and_tiles_the_stream(tmp_path: Path) -> None:
    bucket = record.FolderBucket(tmp_path)
    stream = "c/events/controller"
    real = b'{"time": "2026-12-06T10:00:01+00:00", "action": "recreate"}\n'
    bucket.write(record.chunk_key(stream, 0, len(real), "0a1b2c3d"), real)
    # A job's forgery: one piece claiming the whole stream, and one overlapping the real piece.
    bucket.write(record.chunk_key(stream, 0, 999_999_999_999, "ffffffff"), b'{"time": "9"}\n')
    bucket.write(record.chunk_key(stream, 5, 5 + 14, "eeeeeeee"), b'{"time": "8"}\n')
    assert record.streams(bucket, "c") == {stream: real.decode()}
    assert [e["action"] for e in record.events(bucket, "c")] == ["recreate"]


def test_a_job_whose_submission_names_another_job_is_left_out(tmp_path: Path) -> None:
    bucket = record.FolderBucket(tmp_path)
    bucket.write("c/jobs/raysubmit_1/submitted.json", json.dumps({"job_id": "raysubmit_1"}).encode())
    bucket.write("c/jobs/raysubmit_2/submitted.json", json.dumps({"job_id": "raysubmit_1"}).encode())
    assert [j.job_id for j in record.jobs(bucket, "c")] == ["raysubmit_1"]


def test_cluster_records_are_ordered_by_when_they_were_created_not_by_what_they_say(tmp_path: Path) -> None:
    bucket = record.FolderBucket(tmp_path)
    bucket.write("clusters/c/old/cluster.json", json.dumps({"started": 9e9}).encode())  # claims to be newest
    bucket.write("clusters/c/new/cluster.json", json.dumps({"started": 1.0}).encode())
    os.utime(tmp_path / "clusters/c/old/cluster.json", (1000, 1000))
    os.utime(tmp_path / "clusters/c/new/cluster.json", (2000, 2000))
    assert record.clusters(bucket) == ["clusters/c/old", "clusters/c/new"]


class _CountedKeys(list[str]):
    """A listing that counts how often it is walked."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().__iter__()


def test_jobs_are_indexed_in_one_walk_of_the_listing(tmp_path: Path) -> None:
    """`record.jobs` walks the bucket's listing once, however many jobs it holds (it was once
    walked again for every job: quadratic in the record's size)."""
    bucket = record.FolderBucket(tmp_path)
    for i in range(20):
        bucket.write(
            f"c/jobs/raysubmit_{i}/submitted.json", json.dumps({"job_id": f"raysubmit_{i}"}).encode()
        )

    class Counted(record.FolderBucket):
        def list(self, prefix: str = "") -> list[str]:
            return _CountedKeys(super().list(prefix))

    assert len(record.jobs(Counted(tmp_path), "c")) == 20
    assert _CountedKeys.walks == 1
