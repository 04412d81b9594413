"""bench/preemption_notice.py: its report (the scenario runs against real Ray in
tests/integration/test_recovery.py's TPU VM test, which checks what the notice does rather than
how soon)."""

from __future__ import annotations

from tests.bench import load

notice = load("preemption_notice")


def test_the_report_gives_both_times_and_the_ratio_of_the_baseline_to_the_notice():
    baseline = notice.Loss(notice_s=0, unschedulable_s=18.0, off_s=1.0, dead_s=18.0)
    noticed = notice.Loss(notice_s=30, unschedulable_s=1.5, off_s=31.0, dead_s=48.0)
    lines = notice.report(baseline, noticed, "2026-12-04 01:00 UTC").splitlines()
    assert lines[0].endswith("2026-12-04 01:00 UTC")
    assert [line.split()[-2] for line in lines[1:]] == ["18.0", "18.0", "1.5", "48.0", "12.0"]
    assert lines[-1].split()[-1] == "x" and "no notice / notice" in lines[-1]
