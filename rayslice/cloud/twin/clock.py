"""The cloud twin's time: a clock the tests own, and what Google does when time passes.

Google's resources change between calls: capacity arrives, a host that failed is restarted, a
flex-start run ends, a queued request expires. The twin models this with one clock and one
schedule. Every transition the twin knows will happen at a given time (the end of a run, a
restart after a host error, a queued request's deadline) and every event a test injects for a
later time (`CloudTwin.at`, `CloudTwin.schedule_capacity`) is a `TwinEvent` on the schedule;
`CloudTwin.advance(seconds)` moves the clock forward and runs each event that falls due, in time
order (two events due at the same time run in the order they were scheduled), the clock reading
each event's own time while it runs. Nothing sleeps.

The clock reads the wall clock by default, so the simulator (which boots hosts in real time from
the same twin) keeps working unchanged; `TwinClock.manual(start)` is a clock that only moves when
told. Either can be advanced: a wall clock is moved by an offset.

Time only moves forward: advancing by a negative time, or scheduling an event in the past, is
refused with `TwinTimeError` (one line naming the rule), as is any event a Google document rules
out when it runs (`TwinEventError`: a host preempted before it exists, a run ending before it
starts).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rayslice.errors import InvalidInput

KEPT = 10_000  # events `Schedule.done` keeps


class TwinTimeError(InvalidInput):
    """A clock move or a schedule that time does not allow (the past); nothing changed."""

    def __init__(self, rule: str, message: str):
        self.rule = rule
        super().__init__(f"{message} (twin rule {rule})")


class TwinEventError(InvalidInput):
    """An event Google's documents rule out (a host preempted before it exists, a run ending
    before it starts); nothing changed."""

    def __init__(self, rule: str, message: str):
        self.rule = rule
        super().__init__(f"{message} (twin rule {rule})")


class NoSuchResource(TwinEventError, KeyError):
    """An event on a resource the twin does not hold (a host preempted before it exists); a
    `KeyError` too, for callers that look resources up by name."""

    def __str__(self) -> str:
        return Exception.__str__(self)


@dataclass
class Timings:
    """How long the transitions take that Google gives no figure for, in seconds (the twin's
    choices; a test or a timeline sets its own). Each is used where the module that models it
    says so."""

    # A host error on Compute Engine: the instance is restarted (automaticRestart) on healthy
    # hardware this long after. "Failure recovery of TPU instances" gives no figure; the capacity
    # table's repair grace ("slice unavailability of up to a few hours") bounds it.
    restart_after_s: float = 30 * 60
    # An All Capacity reservation's host repaired in place (no relocation): this long after.
    repair_in_place_s: float = 2 * 3600
    # A Cloud TPU node under repair (REPAIRING) ends READY or UNKNOWN this long after.
    node_repair_s: float = 30 * 60
    # A queued resource PROVISIONING before ACTIVE, and SUSPENDING before SUSPENDED (0: at once,
    # the twin's behaviour before it had a clock).
    queued_provisioning_s: float = 0.0
    queued_suspending_s: float = 0.0


class TwinClock:
    """Seconds since the epoch, as a float: the wall clock (`source`, time.time) plus an offset
    that `set` moves, or a fixed start plus that offset (`manual`)."""

    def __init__(self, source: Callable[[], float] | None = time.time, start: float = 0.0) -> None:
        self._source = source
        self._offset = start

    @classmethod
    def manual(cls, start: float = 1_000_000.0) -> TwinClock:
        """A clock that reads `start` until it is moved (the tests' own)."""
        return cls(None, start)

    @property
    def now(self) -> float:
        return (self._source() if self._source is not None else 0.0) + self._offset

    @now.setter
    def now(self, when: float) -> None:
        """Move the clock to `when` without running anything (``clock.now += 600``, as the
        controller's tests move their own clock): what fell due runs at the twin's next
        `catch_up` (the emulated APIs' next request) or `advance`. `TwinTimeError` for the past."""
        if when < self.now:
            back = self.now - when
            raise TwinTimeError("time-moves-forward", f"cannot move the twin's clock back by {back} s")
        self.set(when)

    def __call__(self) -> float:
        """The time now (so code that reads the clock as a callable keeps working)."""
        return self.now

    def set(self, when: float) -> None:
        """The clock reads `when` now (a wall clock keeps running from there)."""
        self._offset += when - self.now


@dataclass(order=True)
class TwinEvent:
    """One transition due at `at` (seconds on the twin's clock): `run` makes it happen. A
    cancelled event (its resource deleted, say) is skipped when it falls due."""

    at: float
    seq: int
    what: str = field(compare=False)
    run: Callable[[], None] = field(compare=False, repr=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class Schedule:
    """The events to come, earliest first; `due(until)` pops each one due by `until`."""

    def __init__(self) -> None:
        self._heap: list[TwinEvent] = []
        self._seq = itertools.count()
        # What ran, in order (for tests), the latest `KEPT` only: a wall-clock twin (the
        # simulator's) runs events for as long as it serves.
        self.done: deque[TwinEvent] = deque(maxlen=KEPT)

    def add(self, at: float, what: str, run: Callable[[], None]) -> TwinEvent:
        event = TwinEvent(at, next(self._seq), what, run)
        heapq.heappush(self._heap, event)
        return event

    def next_due(self, until: float) -> TwinEvent | None:
        """The earliest live event due by `until`, taken off the schedule; None when none is."""
        while self._heap and self._heap[0].at <= until:
            event = heapq.heappop(self._heap)
            if not event.cancelled:
                return event
        return None

    def pending(self) -> list[TwinEvent]:
        """Events still to come, in the order they will run."""
        return sorted(e for e in self._heap if not e.cancelled)
