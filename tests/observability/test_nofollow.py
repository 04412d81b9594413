"""The record folder follows no link a machine planted in it: writes stay inside the folder,
reads take regular files only (a FIFO never blocks, a link to /proc/self/environ is never
read), and a listing never enters a linked folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rayslice.observability import nofollow, record

PREFIX = "clusters/c/r"


@pytest.fixture
def bucket(tmp_path: Path) -> record.FolderBucket:
    folder = record.FolderBucket(tmp_path / "record")
    folder.write(f"{PREFIX}/cluster.json", b"{}")
    return folder


def test_a_linked_host_folder_is_never_written_through(bucket: record.FolderBucket, tmp_path: Path) -> None:
    outside = tmp_path / "machine-dir"
    outside.mkdir()
    (bucket.root / PREFIX / "hosts").mkdir()
    (bucket.root / PREFIX / "hosts/h0").symlink_to(outside)  # a job swapped its folder for a link
    with pytest.raises(nofollow.NotPlain):
        bucket.write(f"{PREFIX}/hosts/h0/console.log", b"$(touch /tmp/pwned)")
    assert list(outside.iterdir()) == []


def test_a_link_in_any_part_of_a_key_is_refused(bucket: record.FolderBucket, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    (outside / "raysubmit_1").mkdir(parents=True)
    (bucket.root / PREFIX / "jobs").symlink_to(outside)
    with pytest.raises(nofollow.NotPlain):
        bucket.write(f"{PREFIX}/jobs/raysubmit_1/submitted.json", b"{}")
    with pytest.raises(nofollow.NotPlain):
        bucket.read(f"{PREFIX}/jobs/raysubmit_1/submitted.json")
    assert list((outside / "raysubmit_1").iterdir()) == []


def test_a_link_to_a_file_is_never_read(bucket: record.FolderBucket) -> None:
    (bucket.root / PREFIX / "ended.json").symlink_to("/proc/self/environ")
    with pytest.raises(OSError, match=r"ended\.json"):
        bucket.read(f"{PREFIX}/ended.json")
    assert f"{PREFIX}/ended.json" not in bucket.list(PREFIX)
    assert record.read_json(bucket, f"{PREFIX}/ended.json") == {}  # a reader skips it


def test_an_existing_link_is_never_replaced_or_followed_by_a_write(
    bucket: record.FolderBucket, tmp_path: Path
) -> None:
    target = tmp_path / "target"
    (bucket.root / PREFIX / "goodput.json").symlink_to(target)
    with pytest.raises(FileExistsError):
        bucket.write(f"{PREFIX}/goodput.json", b"{}")
    assert not target.exists()


def test_a_fifo_is_neither_read_nor_listed_and_never_blocks(bucket: record.FolderBucket) -> None:
    os.mkfifo(bucket.root / PREFIX / "ended.json")  # nobody ever writes to it
    with pytest.raises(nofollow.NotPlain):
        bucket.read(f"{PREFIX}/ended.json")
    assert bucket.list(PREFIX) == [f"{PREFIX}/cluster.json"]
    assert record.cluster_info(bucket, PREFIX)["ended"] is None


def test_a_listing_never_enters_a_linked_folder(bucket: record.FolderBucket, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("machine's file")
    (bucket.root / PREFIX / "hosts").mkdir()
    (bucket.root / PREFIX / "hosts/h0").symlink_to(outside)
    assert bucket.list("") == [f"{PREFIX}/cluster.json"]
    assert record.streams(bucket, PREFIX) == {f"{PREFIX}/cluster.json": "{}"}


def test_an_object_past_the_cap_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1001)
    with pytest.raises(OSError, match="more than 1000"):
        nofollow.read_regular(tmp_path, ["big"], cap=1000)
    assert nofollow.read_regular(tmp_path, ["big"], cap=1001) == b"x" * 1001


def test_a_listing_past_its_limit_is_refused(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).write_text(name)
    assert nofollow.regular_files(tmp_path, [], limit=3) == ["a", "b", "c"]
    with pytest.raises(OSError, match="more than 2 objects"):
        nofollow.regular_files(tmp_path, [], limit=2)


def test_a_folder_made_for_a_machine_is_a_real_folder(bucket: record.FolderBucket, tmp_path: Path) -> None:
    made = bucket.folder(f"{PREFIX}/hosts/h1")
    assert made.is_dir() and not made.is_symlink() and made.stat().st_mode & 0o777 == 0o700
    (bucket.root / PREFIX / "events").symlink_to(tmp_path)
    with pytest.raises(nofollow.NotPlain):
        bucket.folder(f"{PREFIX}/events/controller")
