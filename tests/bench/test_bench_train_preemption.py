"""bench/train_preemption.py: its options, how it reads the jobs' output and its report (the
elastic scenario itself runs as tests/integration/test_recovery.py's Ray Train test)."""

from __future__ import annotations

import pytest

from rayslice import names
from tests.bench import load

bench = load("train_preemption")


def test_gces_notice_and_one_repeat_by_default_and_no_fewer_than_one() -> None:
    args = bench.build_parser().parse_args([])
    assert (args.notice_s, args.repeats) == (names.PREEMPTION_NOTICE_S, 1)
    assert bench.build_parser().parse_args(["--notice-s", "5", "--repeats", "3"]).repeats == 3
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--repeats", "0"])


LINES = [
    (1.0, "workers 2, devices 16, from step 0"),
    (2.0, "step   0  loss 1.00000"),
    (3.0, "step  24  loss 0.50000"),
    (4.0, "workers 2, devices 16, from step 20"),  # a restart before the shrink
    (5.0, "workers 1, devices 8, from step 20"),
    (6.0, "resumed from step 20"),
    (7.0, "step  20  loss 0.49000"),
    (9.0, "workers 2, devices 16, from step 30"),
]


def test_an_attempt_counts_from_its_first_step_line() -> None:
    assert bench.first_step_of_attempt(LINES, 1, 2) == (4, 7.0)
    assert bench.first_step_of_attempt(LINES, 2, 2) == (3, 7.0)  # the first 2-worker attempt after 2
    assert bench.first_step_of_attempt(LINES, 2, 5) is None  # began, but no step trained yet


def test_steps_lost_are_those_trained_again_after_the_resume() -> None:
    before = [line for _, line in LINES[:4]]
    assert bench.steps_lost(before, 20) == 5  # steps 20 to 24 again
    assert bench.steps_lost(before, 25) == 0
    assert bench.steps_lost([], 0) == 0


def test_the_watchers_lines_are_read_with_their_times_from_the_preemption_on() -> None:
    log = "\n".join(
        [
            "2026-12-06T16:00:00.000000Z rayslice-preemption: watching instance/preempted",
            "+ ray start --address=10.0.0.1:6379",  # the boot script's own lines
            "2026-12-06T16:05:01.250000Z rayslice-preemption: preemption notice: instance/preempted is TRUE",
            "2026-12-06T16:05:04.500000Z rayslice-preemption: stopping Ray on this host, 26 s before",
        ]
    )
    since = 1796572800.0 + 5 * 60 + 1  # 2026-12-06T16:05:01Z
    found = bench.watcher_lines(log, since)
    assert [(round(t - since, 2), line[:22]) for t, line in found] == [
        (0.25, "preemption notice: ins"),
        (3.5, "stopping Ray on this h"),
    ]


def test_the_report_gives_medians_as_shares_of_the_cold_bring_up_and_the_ratio() -> None:
    phased = bench.Elastic(0, 24.0, 150.0, committed_s=4.0, ray_stopped_s=4.5)
    elastic = [phased, bench.Elastic(2, 26.0, 170.0)]
    restart = [bench.Restart(8, 140.0, 110.0), bench.Restart(6, 160.0, 130.0)]
    lines = bench.report(50.0, elastic, restart, 30, "2026-12-04 18:00 UTC").splitlines()
    assert lines[1].startswith("notice 30 s,") and lines[1].endswith("2 repeat(s), 2026-12-04 18:00 UTC")
    rows = {line[:50].strip(): line[50:].split() for line in lines[3:]}
    assert rows["cold bring-up (create, boot, every host joined)"] == ["50.0", "1.00"]
    assert rows["elastic: preemption -> training on 1 slice"] == ["25.0", "0.50", "(24.0-26.0)"]
    # Phases only the first repeat logged: the median is its own.
    assert rows["elastic: preemption -> checkpoint committed"] == ["4.0", "0.08"]
    assert rows["elastic: preemption -> Ray stopped on its host"] == ["4.5", "0.09"]
    assert rows["elastic: checkpoint committed -> on 1 slice"] == ["20.0", "0.40"]
    assert rows["elastic: preemption -> training on 2 slices"][:2] == ["160.0", "3.20"]
    assert rows["whole-job restart: preemption -> training again"][:2] == ["150.0", "3.00"]
    assert rows["steps lost: elastic / whole-job restart"] == ["1", "/", "7"]
    assert rows["training again: whole-job restart / elastic"] == ["6.0", "x"]
