"""The controller's journal (`rayslice.recovery.journal`): what a restarted controller reads back."""

from __future__ import annotations

from pathlib import Path

from rayslice.recovery.journal import CREATE_HOSTS, Entry, Journal, Recreation

SPEC = {"mig": {"name": "c-slice-1", "targetSize": 0}, "instances": [{"name": "c-slice-1-w0"}]}


def test_an_entry_is_read_back_by_another_journal_on_the_same_directory(tmp_path: Path) -> None:
    state = tmp_path / "recovery"
    Journal(state).save("c-slice-1", Entry(SPEC, Recreation(CREATE_HOSTS, "MIG missing", 2)))
    assert Journal(state).load("c-slice-1") == Entry(SPEC, Recreation(CREATE_HOSTS, "MIG missing", 2))
    assert Journal(state).load("c-slice-0") == Entry()  # nothing kept of a slice never seen
    # Private: the spec holds the hosts' boot metadata.
    assert state.stat().st_mode & 0o777 == 0o700
    assert (state / "c-slice-1.json").stat().st_mode & 0o777 == 0o600


def test_a_save_replaces_the_entry_whole_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.save("c-slice-1", Entry(SPEC, Recreation(CREATE_HOSTS, "MIG missing")))
    journal.save("c-slice-1", Entry(SPEC))
    assert journal.load("c-slice-1") == Entry(SPEC)
    assert [p.name for p in tmp_path.iterdir()] == ["c-slice-1.json"]


def test_a_damaged_file_reads_as_nothing_kept(tmp_path: Path) -> None:
    (tmp_path / "c-slice-1.json").write_text('{"spec": {"mig"')
    (tmp_path / "c-slice-2.json").write_text('{"spec": null, "recreation": {"step": 1, "bogus": 2}}')
    (tmp_path / "c-slice-3.json").write_text("[1, 2]")
    assert [Journal(tmp_path).load(f"c-slice-{i}") for i in (1, 2, 3)] == [Entry()] * 3


def test_without_a_directory_it_keeps_entries_in_memory() -> None:
    journal = Journal()
    journal.save("c-slice-1", Entry(SPEC))
    assert journal.load("c-slice-1") == Entry(SPEC) and Journal().load("c-slice-1") == Entry()
