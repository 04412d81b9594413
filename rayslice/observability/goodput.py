"""Goodput and badput of one training run, in ml-goodput-measurement's buckets.

A training run is what one `rayslice run` started: one Ray job, or, with ``--max-restarts``, a
job and the jobs submitted again after a node died (its *attempts*). Its wall time, from the
first submission to the end of the last attempt, is cut into intervals by what was seen, each
with the time it was seen:

- the job's own lines (`rayslice.workloads.jax_train` and `jax_trainer`): the first line of an
  attempt, ``resumed from step K``, ``workers W, devices D, from step K`` (each Ray Train
  attempt of `jax_trainer`), and one ``step N  loss X`` line as each step ends;
- what `rayslice run` saw: each submission, the end of each attempt and its status, the moment
  it found that a node had died and the moment the cluster was whole again;
- the recovery controller's events (`rayslice.recovery.events.Event`): the preempted slice seen
  broken and recreated.

Every interval goes to one bucket of ml-goodput-measurement 0.2.3
(``ml_goodput_measurement/src/goodput_utils.py``, ``BadputType``; the README's "Badput Breakdown
Details" says what each holds), by these rules:

- submission -> the attempt's first line: ``PROGRAM_STARTUP`` (Ray starts the job's driver);
- first line -> the ready line (``resumed from step`` / ``workers ...``): ``TRAINING_PREP``,
  which the library's README says includes checkpoint loading;
- ready (or first line) -> the first step line: ``PROGRAM_STARTUP`` (the first step compiles;
  the library counts the first step's extra time as startup);
- step N-1 -> step N: productive, unless a later attempt resumed from a step <= N: then
  ``WASTED_PROGRESS_FROM_DISRUPTION``; the steps so counted are the run's lost steps;
- a failed attempt's last step -> the next submission: ``INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION``,
  split by what the controller and `rayslice run` saw (recreation, rejoin, resubmission);
- within one Ray Train job, the last step before a new Ray Train attempt -> its first line:
  ``ELASTIC_SLICE_DOWN`` when it has fewer workers, ``ELASTIC_SCALE_UP`` when more,
  ``INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION`` when as many; that line -> its first step:
  ``ELASTIC_REINITIALIZATION`` (restore and compile on the new worker group) when the size
  changed, else ``PROGRAM_STARTUP``.

``TPU_INITIALIZATION`` (inside training prep), ``DATA_LOADING_SYNC`` and
``UNPRODUCTIVE_CHECKPOINT_SAVE_TIME`` (inside the step that makes the batch or saves) have no
line of their own in the bundled jobs, so they read 0 and the report says so. What no rule covers
(the time after a successful last step, while the job saves and exits) is shown as unexplained.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# ml-goodput-measurement 0.2.3, goodput_utils.BadputType: the names as the library's Cloud
# Monitoring export labels them (monitoring.py, `badput_source` = BadputType.name).
TPU_INITIALIZATION = "TPU_INITIALIZATION"
TRAINING_PREP = "TRAINING_PREP"
PROGRAM_STARTUP = "PROGRAM_STARTUP"
DATA_LOADING_SYNC = "DATA_LOADING_SYNC"
UNPRODUCTIVE_CHECKPOINT_SAVE_TIME = "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"
UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME = "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"
WASTED_PROGRESS_FROM_DISRUPTION = "WASTED_PROGRESS_FROM_DISRUPTION"
INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION = "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"
ELASTIC_SLICE_DOWN = "ELASTIC_SLICE_DOWN"
ELASTIC_SCALE_UP = "ELASTIC_SCALE_UP"
ELASTIC_REINITIALIZATION = "ELASTIC_REINITIALIZATION"
BADPUT_TYPES = (
    TPU_INITIALIZATION,
    TRAINING_PREP,
    PROGRAM_STARTUP,
    DATA_LOADING_SYNC,
    UNPRODUCTIVE_CHECKPOINT_SAVE_TIME,
    UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME,
    WASTED_PROGRESS_FROM_DISRUPTION,
    INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION,
    ELASTIC_SLICE_DOWN,
    ELASTIC_SCALE_UP,
    ELASTIC_REINITIALIZATION,
)
# Buckets the bundled jobs print no line for: they stay 0, inside the bucket named here.
NOT_SEEN = {
    TPU_INITIALIZATION: TRAINING_PREP,
    DATA_LOADING_SYNC: "productive steps",
    UNPRODUCTIVE_CHECKPOINT_SAVE_TIME: "productive steps",
    UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME: TRAINING_PREP,
}
# Parts of INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION, as ml-goodput-measurement flattens a nested
# bucket for export (`TYPE.SUBTYPE`, monitoring.py `_flatten_badput_dict`).
# The controller records a recreation once it is done (`Controller.act_on`), so the first part
# holds both the wait for it to see the slice broken and the recreation itself.
RECREATION = "RECREATION"  # the attempt's last step -> the controller's `recreate` event
REJOIN = "REJOIN"  # -> `rayslice run` found the cluster whole again (the hosts booted and joined)
RESUBMISSION = "RESUBMISSION"  # -> the next attempt was submitted
# What Ray puts before a line a task or actor printed, as the job's log shows it: the process
# "(RayTrainWorker pid=380, ip=10.0.0.3) ", in ANSI colour when the driver's stdout was a
# terminal or Ray chose colour (seen in jax_trainer's log under `rayslice run`).
RAY_PREFIX = re.compile(r"^(?:\x1b\[[0-9;]*m)?\([^()]*\)(?:\x1b\[[0-9;]*m)?\s*")
# What the bundled training jobs print (jax_train.step_line, jax_train.train, jax_trainer.train_loop).
STEP_LINE = re.compile(r"^step +(\d+) +loss ")
RESUMED_LINE = re.compile(r"^resumed from step (\d+)")
WORKERS_LINE = re.compile(r"^workers (\d+), devices \d+, from step (\d+)")
# ml-goodput-measurement's own reading of a good report is >= 95 % named (the bar).
NAMED_SHARE_WANTED = 0.95


@dataclass(frozen=True)
class Line:
    """One line of the job's log and when it was seen (unix seconds)."""

    time: float
    text: str


@dataclass(frozen=True)
class Attempt:
    """One Ray job of the run: submitted, its lines, when it ended and how."""

    job_id: str
    submitted: float
    ended: float
    status: str  # Ray's JobStatus value: SUCCEEDED, FAILED, STOPPED, ...
    lines: tuple[Line, ...] = ()
    node_died: float | None = None  # `rayslice run` found a node's death in its failure
    whole_again: float | None = None  # and then the cluster whole again


@dataclass(frozen=True)
class ControllerEvent:
    """A recovery controller event (`rayslice.recovery.events.Event`) with its time in unix seconds."""

    time: float
    slice: str
    seen: str
    action: str
    outcome: str


@dataclass
class Report:
    """Seconds per bucket, the productive seconds, the lost steps and the run's wall time."""

    wall_s: float
    start: float = 0.0  # unix seconds of the first submission
    productive_s: float = 0.0
    badput_s: dict[str, float] = field(default_factory=dict)
    recovery_parts_s: dict[str, float] = field(default_factory=dict)
    unexplained_s: float = 0.0
    steps_lost: int = 0
    last_step: int = -1
    disruptions: int = 0
    attempts: int = 0
    controller_events: tuple[ControllerEvent, ...] = ()

    def add(self, bucket: str | None, seconds: float) -> None:
        """`seconds` into `bucket` (None: productive)."""
        if seconds <= 0:
            return
        if bucket is None:
            self.productive_s += seconds
        else:
            self.badput_s[bucket] = self.badput_s.get(bucket, 0.0) + seconds

    @property
    def goodput(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def named_share(self) -> float:
        """The share of the wall time in a named bucket (goodput included)."""
        return 1.0 - self.unexplained_s / self.wall_s if self.wall_s > 0 else 1.0

    def as_json(self) -> dict[str, object]:
        return {
            "wall_s": self.wall_s,
            "goodput": self.goodput,
            "productive_s": self.productive_s,
            "badput_s": {k: self.badput_s.get(k, 0.0) for k in BADPUT_TYPES},
            "infrastructure_recovery_parts_s": dict(self.recovery_parts_s),
            "unexplained_s": self.unexplained_s,
            "named_share": self.named_share,
            "steps_lost": self.steps_lost,
            "last_step": self.last_step,
            "disruptions": self.disruptions,
            "attempts": self.attempts,
        }


@dataclass(frozen=True)
class _Mark:
    """A line that matters, parsed."""

    time: float
    kind: str  # "first", "resumed", "workers", "step"
    value: int = 0  # the step, or the workers of a Ray Train attempt
    start: int = 0  # a ready line's "from step"


def _marks(attempt: Attempt) -> list[_Mark]:
    marks: list[_Mark] = []
    for line in attempt.lines:
        text = RAY_PREFIX.sub("", line.text.strip())
        if match := STEP_LINE.match(text):
            marks.append(_Mark(line.time, "step", int(match.group(1))))
        elif match := RESUMED_LINE.match(text):
            marks.append(_Mark(line.time, "resumed", start=int(match.group(1))))
        elif match := WORKERS_LINE.match(text):
            marks.append(_Mark(line.time, "workers", int(match.group(1)), int(match.group(2))))
        elif not marks and text:
            marks.append(_Mark(line.time, "first"))
    return marks


def _resume_points(attempts: Sequence[Attempt]) -> list[tuple[float, int]]:
    """(time, step) of every resumption the run made, in order: a later attempt's or a Ray Train
    attempt's ``from step K``."""
    points = []
    for attempt in attempts:
        for mark in _marks(attempt):
            if mark.kind in ("resumed", "workers"):
                points.append((mark.time, mark.start))
    return points


def compute(attempts: Sequence[Attempt], events: Iterable[ControllerEvent] = ()) -> Report:
    """The report of one run's attempts (oldest first) and the controller's events."""
    if not attempts:
        raise ValueError("a run has at least one attempt")
    start, end = attempts[0].submitted, max(a.ended for a in attempts)
    seen = tuple(e for e in events if start <= e.time <= end)
    report = Report(wall_s=end - start, start=start, attempts=len(attempts), controller_events=seen)
    resumes = _resume_points(attempts)
    lost: list[int] = []  # every step trained that a later attempt trains again, once per time
    covered = 0.0
    for index, attempt in enumerate(attempts):
        marks = _marks(attempt)
        covered += _attempt(report, attempt, marks, resumes, lost)
        later = attempts[index + 1] if index + 1 < len(attempts) else None
        last = max((m.time for m in marks), default=attempt.submitted)
        if later is not None:  # a failed attempt: recovery until the next one is submitted
            report.disruptions += 1
            covered += _recovery(report, last, later.submitted, attempt, seen)
        elif attempt.status != "SUCCEEDED" and attempt.status != "STOPPED":
            report.add(INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION, attempt.ended - last)
            covered += max(0.0, attempt.ended - last)
    report.steps_lost = len(lost)
    report.unexplained_s = max(0.0, report.wall_s - covered)
    return report


def _attempt(
    report: Report,
    attempt: Attempt,
    marks: Sequence[_Mark],
    resumes: Sequence[tuple[float, int]],
    lost: list[int],
) -> float:
    """Adds one attempt's intervals, from its submission to its last mark; returns their length."""
    covered = 0.0

    def put(bucket: str | None, since: float, until: float) -> None:
        nonlocal covered
        if until > since:
            report.add(bucket, until - since)
            covered += until - since

    previous = attempt.submitted
    phase = "submitted"
    workers = 0
    for index, mark in enumerate(marks):
        if mark.kind == "first":
            put(PROGRAM_STARTUP, previous, mark.time)
            phase = "started"
        elif mark.kind in ("resumed", "workers"):
            if phase == "stepping":  # a new Ray Train attempt inside the same job
                size = _next_size(marks[index:], workers)
                bucket = _resize_bucket(workers, size)
                put(bucket, previous, mark.time)
                report.disruptions += bucket != ELASTIC_SCALE_UP  # growing back disrupts nothing
                phase = "resized" if size != workers else "restarted"
            elif phase in ("resized", "restarted"):
                put(ELASTIC_REINITIALIZATION if phase == "resized" else PROGRAM_STARTUP, previous, mark.time)
                if mark.kind == "workers" and mark.value != workers:  # a retry came up at another size
                    phase = "resized"
            else:
                put(TRAINING_PREP if phase == "started" else PROGRAM_STARTUP, previous, mark.time)
                phase = "ready"
            if mark.kind == "workers":
                workers = mark.value
        else:  # a step ended
            # Trained again later: a later resumption starts at or before this step.
            if any(t > mark.time and k <= mark.value for t, k in resumes):
                lost.append(mark.value)
                wasted = True
            else:
                wasted = False
            if phase == "stepping":
                put(WASTED_PROGRESS_FROM_DISRUPTION if wasted else None, previous, mark.time)
            else:  # the attempt's first step, which compiled
                put(ELASTIC_REINITIALIZATION if phase == "resized" else PROGRAM_STARTUP, previous, mark.time)
                phase = "stepping"
            report.last_step = max(report.last_step, mark.value)
        previous = mark.time
    if not marks:
        put(PROGRAM_STARTUP, attempt.submitted, attempt.ended)
    return covered


def _next_size(marks: Sequence[_Mark], workers: int) -> int:
    """The workers of the Ray Train attempt that starts at `marks[0]`: its ``workers`` line, which
    follows the ``resumed`` line, before its first step; `workers` (unchanged) if it has none."""
    for mark in marks:
        if mark.kind == "step":
            break
        if mark.kind == "workers":
            return mark.value
    return workers


def _resize_bucket(before: int, after: int) -> str:
    if after < before:
        return ELASTIC_SLICE_DOWN
    if after > before:
        return ELASTIC_SCALE_UP
    return INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION


def _recovery(
    report: Report, since: float, until: float, attempt: Attempt, events: Sequence[ControllerEvent]
) -> float:
    """The recovery after a failed attempt, in parts where the controller and `rayslice run` saw
    its stages; returns its length."""
    if until <= since:
        return 0.0
    report.add(INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION, until - since)
    stages: list[tuple[float, str]] = []
    inside = [e for e in events if since <= e.time <= until]
    recreated = [e for e in inside if e.action == "recreate" and not e.outcome.startswith("failed")]
    if recreated:
        stages.append((recreated[-1].time, RECREATION))
    if attempt.whole_again is not None and since <= attempt.whole_again <= until:
        stages.append((attempt.whole_again, REJOIN))
    stages.append((until, RESUBMISSION))
    previous = since
    for time, part in sorted(stages):
        if time > previous:
            report.recovery_parts_s[part] = report.recovery_parts_s.get(part, 0.0) + time - previous
            previous = time
    return until - since


def format_report(report: Report, title: str = "") -> str:
    """The report as `rayslice goodput` prints it."""

    def row(label: str, seconds: float) -> str:
        share = seconds / report.wall_s * 100 if report.wall_s > 0 else 0.0
        return f"  {label:<44} {seconds:9.1f} s  {share:5.1f} %"

    lines = [title] if title else []
    lines.append(
        f"wall time {report.wall_s:.1f} s over {report.attempts} attempt(s), "
        f"{report.disruptions} disruption(s); last step {report.last_step}, steps lost {report.steps_lost}"
    )
    lines.append(row("goodput (productive steps)", report.productive_s))
    lines.append("badput (ml-goodput-measurement buckets):")
    for bucket in BADPUT_TYPES:
        seconds = report.badput_s.get(bucket, 0.0)
        unseen = bucket in NOT_SEEN and not seconds
        note = f"  (no line of its own: inside {NOT_SEEN[bucket]})" if unseen else ""
        lines.append(row(bucket, seconds) + note)
        if bucket == INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION:
            for part in (RECREATION, REJOIN, RESUBMISSION):
                if part in report.recovery_parts_s:
                    lines.append(row(f"  .{part}", report.recovery_parts_s[part]))
    lines.append(row("unexplained", report.unexplained_s))
    lines.append(f"named buckets hold {report.named_share * 100:.1f} % of the wall time")
    for event in report.controller_events:
        at = event.time - report.start
        lines.append(f"  controller at +{at:.0f} s: {event.slice}: {event.seen} -> {event.action}")
    return "\n".join(lines)
