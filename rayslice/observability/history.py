"""Reading a cluster's record back: its training runs, their goodput, and what `rayslice history`
shows (`rayslice.observability.record` writes it)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayslice.observability import goodput, record


@dataclass(frozen=True)
class TrainingRun:
    """What one `rayslice run` started: its first job and the jobs submitted again after it."""

    attempts: tuple[record.JobRecord, ...]

    @property
    def job_id(self) -> str:
        return self.attempts[0].job_id

    @property
    def status(self) -> str:
        return str(self.attempts[-1].info.get("status", "UNKNOWN"))


def training_runs(jobs: Sequence[record.JobRecord]) -> list[TrainingRun]:
    """The jobs grouped by the `rayslice run` that submitted them (``restart_of``), oldest first."""
    groups: dict[str, list[record.JobRecord]] = {}
    for job in jobs:
        first = str(job.info.get("restart_of") or job.job_id)
        groups.setdefault(first, []).append(job)
    return [TrainingRun(tuple(group)) for group in groups.values()]


def unix_time(stamp: str) -> float:
    """An event's ISO 8601 time (`Event.now`) as unix seconds."""
    return datetime.datetime.fromisoformat(stamp).timestamp()


def controller_events(entries: Sequence[dict[str, Any]]) -> list[goodput.ControllerEvent]:
    found = []
    for entry in entries:
        try:
            found.append(
                goodput.ControllerEvent(
                    unix_time(str(entry["time"])),
                    str(entry.get("slice", "")),
                    str(entry.get("seen", "")),
                    str(entry.get("action", "")),
                    str(entry.get("outcome", "")),
                )
            )
        except (KeyError, ValueError, OverflowError, OSError):  # not a time an event can have
            continue
    return found


def attempts(run: TrainingRun) -> list[goodput.Attempt]:
    """The run's attempts as the goodput model takes them; only lines with a time count."""
    found = []
    for job in run.attempts:
        info = job.info
        submitted = float(info.get("submitted") or 0.0)
        timed = tuple(goodput.Line(t, text) for t, text in job.lines if t is not None)
        ended = info.get("ended")
        marks = info.get("marks") or {}
        found.append(
            goodput.Attempt(
                job_id=job.job_id,
                submitted=submitted,
                ended=float(ended)
                if ended is not None
                else max((line.time for line in timed), default=submitted),
                status=str(info.get("status", "UNKNOWN")),
                lines=timed,
                node_died=marks.get("node_died"),
                whole_again=marks.get("whole_again"),
            )
        )
    return found


def run_goodput(run: TrainingRun, events: Sequence[dict[str, Any]]) -> goodput.Report:
    return goodput.compute(attempts(run), controller_events(events))
