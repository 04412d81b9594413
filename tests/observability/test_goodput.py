"""The goodput model on recorded sequences: a jax_train run restarted after a preemption
(`rayslice run --max-restarts`), and an elastic jax_trainer run that shrinks and grows back."""

from __future__ import annotations

import pytest

from rayslice.observability import goodput
from rayslice.observability.goodput import Attempt, ControllerEvent, Line
from rayslice.workloads import jax_train
from tests.bench import load

bench = load("train_preemption")


def step(t: float, i: int) -> Line:
    return Line(t, goodput_line(i))


def goodput_line(i: int) -> str:
    return jax_train.step_line(i, 0.5)  # the very line both training jobs print


def restarted_run() -> tuple[list[Attempt], list[ControllerEvent]]:
    """jax_train: steps 0-24 (a checkpoint after step 19), a preemption, then a restart that
    resumes from step 20 and ends at step 29."""
    first = Attempt(
        "raysubmit_1",
        submitted=0.0,
        ended=40.0,
        status="FAILED",
        lines=(Line(2.0, "slice rayslice-slice-1 (v5litepod-8)"), *(step(6.0 + i, i) for i in range(25))),
        node_died=41.0,
        whole_again=90.0,
    )
    second = Attempt(
        "raysubmit_2",
        submitted=95.0,
        ended=114.0,
        status="SUCCEEDED",
        lines=(
            Line(97.0, "slice rayslice-slice-1 (v5litepod-8)"),
            Line(100.0, "resumed from step 20"),
            *(step(103.0 + i - 20, i) for i in range(20, 30)),
        ),
    )
    events = [
        ControllerEvent(45.0, "rayslice-slice-1", "node state PREEMPTED", "recreate", "recreated"),
        ControllerEvent(500.0, "rayslice-slice-0", "node state PREEMPTED", "recreate", "recreated"),  # later
    ]
    return [first, second], events


def test_a_restarted_run_splits_its_time_into_the_librarys_buckets() -> None:
    attempts, events = restarted_run()
    report = goodput.compute(attempts, events)
    assert report.wall_s == 114.0
    assert report.productive_s == pytest.approx(28.0)  # steps 1-19 and 21-29
    assert report.badput_s[goodput.PROGRAM_STARTUP] == pytest.approx(2 + 4 + 2 + 3)
    assert report.badput_s[goodput.TRAINING_PREP] == pytest.approx(3.0)  # restore, before "resumed"
    assert report.badput_s[goodput.WASTED_PROGRESS_FROM_DISRUPTION] == pytest.approx(5.0)
    assert report.badput_s[goodput.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION] == pytest.approx(65.0)
    # The recovery, split where the controller and `rayslice run` saw its stages.
    assert report.recovery_parts_s == pytest.approx(
        {goodput.RECREATION: 15.0, goodput.REJOIN: 45.0, goodput.RESUBMISSION: 5.0}
    )
    assert report.unexplained_s == pytest.approx(2.0)  # the last save and exit
    assert report.named_share >= goodput.NAMED_SHARE_WANTED
    assert (report.steps_lost, report.last_step, report.disruptions, report.attempts) == (5, 29, 1, 2)


def test_the_lost_steps_are_the_benchs_figure_for_the_same_log() -> None:
    attempts, events = restarted_run()
    before = [line.text for line in attempts[0].lines]
    assert goodput.compute(attempts, events).steps_lost == bench.steps_lost(before, 20) == 5


def elastic_run() -> Attempt:
    """jax_trainer between one and two slices: 2 workers, a preemption after a checkpoint at
    step 30, 1 worker from step 30, then 2 again from step 50; stopped by the user."""
    lines = [
        Line(1.0, "slices of v5litepod-8 (topology 2x4): 1 to 2"),
        Line(1.5, "run elastic-0 in /shared/train"),
        Line(10.0, "workers 2, devices 16, from step 0"),
        *(step(12.0 + i, i) for i in range(35)),
        Line(60.0, "resumed from step 30"),
        Line(61.0, "workers 1, devices 8, from step 30"),
        *(step(65.0 + i - 30, i) for i in range(30, 50)),
        Line(95.0, "resumed from step 50"),
        Line(96.0, "workers 2, devices 16, from step 50"),
        *(step(100.0 + i - 50, i) for i in range(50, 60)),
    ]
    return Attempt("raysubmit_e", submitted=0.0, ended=112.0, status="STOPPED", lines=tuple(lines))


def test_an_elastic_run_counts_slice_down_scale_up_and_reinitialization() -> None:
    report = goodput.compute([elastic_run()])
    assert report.badput_s[goodput.ELASTIC_SLICE_DOWN] == pytest.approx(14.0)  # last step 34 -> resumed
    assert report.badput_s[goodput.ELASTIC_SCALE_UP] == pytest.approx(11.0)  # last step 49 -> resumed
    assert report.badput_s[goodput.ELASTIC_REINITIALIZATION] == pytest.approx(5.0 + 5.0)
    assert report.badput_s[goodput.TRAINING_PREP] == pytest.approx(9.0)
    assert report.badput_s[goodput.PROGRAM_STARTUP] == pytest.approx(1.0 + 2.0)
    assert report.badput_s[goodput.WASTED_PROGRESS_FROM_DISRUPTION] == pytest.approx(5.0)
    assert report.productive_s == pytest.approx(29 + 19 + 9)
    assert report.unexplained_s == pytest.approx(3.0)
    assert report.steps_lost == 5  # 30-34, trained again on one slice
    assert (report.disruptions, report.attempts) == (1, 1)  # the shrink; the grow-back is none
    assert report.named_share >= goodput.NAMED_SHARE_WANTED


def test_the_elastic_lost_steps_match_the_benchs_reading() -> None:
    lines = [line.text for line in elastic_run().lines]
    shrink = lines.index("resumed from step 30")
    assert goodput.compute([elastic_run()]).steps_lost == bench.steps_lost(lines[:shrink], 30)


def test_every_second_of_the_wall_time_is_in_one_bucket_or_unexplained() -> None:
    for attempts, events in (restarted_run(), ([elastic_run()], [])):
        report = goodput.compute(attempts, events)
        total = report.productive_s + sum(report.badput_s.values()) + report.unexplained_s
        assert total == pytest.approx(report.wall_s)


def test_the_report_names_every_bucket_and_the_unexplained_rest() -> None:
    attempts, events = restarted_run()
    text = goodput.format_report(goodput.compute(attempts, events))
    for bucket in goodput.BADPUT_TYPES:
        assert bucket in text
    assert "unexplained" in text and "steps lost 5" in text
    assert "no line of its own: inside TRAINING_PREP" in text  # TPU_INITIALIZATION
    assert "controller at +45 s: rayslice-slice-1: node state PREEMPTED -> recreate" in text
    assert "+500 s" not in text  # an event after the run is not the run's


def test_a_run_has_an_attempt() -> None:
    with pytest.raises(ValueError):
        goodput.compute([])


def test_the_benchs_log_count_over_every_resumption_matches_the_report() -> None:
    lines = [line.text for line in elastic_run().lines]
    assert bench.lost_at_every_resumption(lines) == goodput.compute([elastic_run()]).steps_lost == 5
    # A grow-back that resumes from a checkpoint before the last step loses steps too.
    regrown = [
        *lines,
        goodput_line(60),
        goodput_line(61),
        "resumed from step 60",
        "workers 1, devices 8, from step 60",
    ]
    report = goodput.compute(
        [Attempt("j", 0.0, 200.0, "STOPPED", tuple(Line(150.0 + i, t) for i, t in enumerate(regrown)))]
    )
    assert bench.lost_at_every_resumption(regrown) == report.steps_lost == 5 + 2


def test_lines_ray_prefixed_with_their_process_count_the_same() -> None:
    """Ray Train's workers print through Ray's log monitor: jax_trainer's lines reach the job's
    log as ``(RayTrainWorker pid=380, ip=100.92.14.3) step   0  loss 1.07171``, coloured."""
    prefix = "\x1b[36m(RayTrainWorker pid=380, ip=100.92.14.3)\x1b[0m "
    plain = elastic_run()
    lines = tuple(Line(line.time, prefix + line.text) for line in plain.lines)
    prefixed = Attempt(plain.job_id, plain.submitted, plain.ended, plain.status, lines)
    assert goodput.compute([prefixed]).as_json() == goodput.compute([plain]).as_json()
