"""bench/recovery.py: its report and how it tells a committed checkpoint (the scenario itself runs
as tests/integration/test_recovery.py's acceptance test)."""

from __future__ import annotations

from pathlib import Path

from tests.bench import load

recovery = load("recovery")


def test_the_report_gives_each_time_as_a_share_of_the_cold_bring_up():
    trace = recovery.Trace(victim="rayslice-slice-1", preempted_at=100.0, rejoined_at=130.0, resumed_at=160.0)
    lines = recovery.report("compute", 40.0, trace, "2026-12-03 07:00 UTC").splitlines()
    assert lines[0] == "recovery on the simulator, compute: head VM + 2 x tpu7x-16 Spot, 2026-12-03 07:00 UTC"
    assert [line.split()[-2:] for line in lines[2:]] == [["40.0", "1.00"], ["30.0", "0.75"], ["60.0", "1.50"]]


def test_only_a_committed_step_at_or_after_the_mark_counts(tmp_path: Path):
    (tmp_path / "10").mkdir()
    (tmp_path / "20.orbax-checkpoint-tmp-1733212800").mkdir()  # orbax's name while it writes
    assert not recovery._checkpointed(tmp_path, 20)
    (tmp_path / "20").mkdir()
    assert recovery._checkpointed(tmp_path, 20)
