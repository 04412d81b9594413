"""The twin's clock: time the test owns, events run in time order as it advances, the bill of
what ran meanwhile, and clock moves Google's time does not allow refused in one line."""

from __future__ import annotations

import time

import pytest

from rayslice import catalog
from rayslice.cloud.states import INSTANCE_RUNNING
from rayslice.cloud.twin import CloudTwin
from rayslice.cloud.twin.clock import TwinClock, TwinEventError, TwinTimeError
from rayslice.errors import EXIT_INVALID
from tests.cloud.timeline import PROJECT, V6E_HOST, ZONE, hosts, mig, template, twin_at


def _v6e_host_hour(capacity: str) -> float:
    """The catalog's price of one 4-chip v6e host for an hour in the test zone."""
    per_chip = catalog.chip_hour_price("v6e", catalog.region_of(ZONE), capacity)
    assert per_chip is not None and per_chip > 0
    return per_chip * 4


def test_the_default_clock_is_the_wall_clock_and_a_manual_one_moves_only_when_advanced() -> None:
    twin = CloudTwin()
    before = time.time()
    assert before <= twin.clock.now <= time.time()
    manual, _ = twin_at(5000.0)
    assert manual.clock.now == 5000.0 == manual.clock()
    manual.advance(60)
    assert manual.clock.now == 5060.0
    twin.advance(3600)  # a wall clock moves by an offset, and keeps running
    assert twin.clock.now >= before + 3600


def test_a_callable_clock_set_the_old_way_still_drives_the_twin() -> None:
    twin = CloudTwin()
    now = [7000.0]
    twin.clock = lambda: now[0]
    seen: list[float] = []
    twin.at(7100.0, "mark", lambda: seen.append(twin.clock.now))
    twin.catch_up()
    assert seen == []
    now[0] = 7200.0
    ran = twin.catch_up()  # what the emulated APIs run before each request: late, at the time now
    assert seen == [7200.0] and [e.at for e in ran] == [7100.0]


def test_advance_runs_due_events_in_time_order_each_at_its_own_time() -> None:
    twin, _ = twin_at(0.0)
    seen: list[tuple[str, float]] = []
    twin.at(30.0, "b", lambda: seen.append(("b", twin.clock.now)))
    twin.at(10.0, "a", lambda: seen.append(("a", twin.clock.now)))
    twin.at(30.0, "c", lambda: seen.append(("c", twin.clock.now)))  # same time: scheduling order
    twin.at(100.0, "later", lambda: seen.append(("later", twin.clock.now)))
    ran = twin.advance(50)
    assert seen == [("a", 10.0), ("b", 30.0), ("c", 30.0)] and [e.what for e in ran] == ["a", "b", "c"]
    assert twin.clock.now == 50.0 and [e.what for e in twin.schedule.pending()] == ["later"]


def test_capacity_scheduled_to_arrive_fulfils_a_waiting_bulk_mig_then() -> None:
    twin, booted = twin_at()
    twin.set_capacity(ZONE, V6E_HOST, 0)
    link = template(twin, "flex", provisioningModel="FLEX_START", instanceTerminationAction="DELETE")
    slice_mig = mig(twin, "s", link, bulk=True)
    twin.create_instances(PROJECT, ZONE, slice_mig, hosts(4))
    twin.schedule_capacity(ZONE, V6E_HOST, 2, at=twin.clock.now + 600)
    twin.schedule_capacity(ZONE, V6E_HOST, 4, at=twin.clock.now + 1800)
    twin.advance(1200)
    assert booted == []  # two of four: a bulk MIG waits for all
    twin.advance(600)
    assert sorted(h.name for h in booted) == ["s-w0", "s-w1", "s-w2", "s-w3"]
    assert {v.status for v in twin.vms.values()} == {INSTANCE_RUNNING}


@pytest.mark.parametrize(
    "move, rule",
    [
        (lambda t: t.advance(-1), "time-moves-forward"),
        (lambda t: t.advance_to(t.clock.now - 5), "time-moves-forward"),
        (lambda t: t.schedule_capacity(ZONE, V6E_HOST, 4, at=t.clock.now - 1), "no-event-in-the-past"),
        (lambda t: t.at(t.clock.now - 60, "x", lambda: None), "no-event-in-the-past"),
    ],
)
def test_time_moved_back_or_an_event_in_the_past_is_refused_in_one_line(move, rule) -> None:
    twin, _ = twin_at()
    before = twin.clock.now
    with pytest.raises(TwinTimeError) as caught:
        move(twin)
    assert caught.value.exit_code == EXIT_INVALID and "\n" not in str(caught.value)
    assert f"twin rule {rule}" in str(caught.value) and twin.clock.now == before
    assert twin.schedule.pending() == []


def test_a_negative_number_of_free_hosts_is_refused() -> None:
    twin, _ = twin_at()
    with pytest.raises(TwinEventError, match="capacity-not-negative"):
        twin.schedule_capacity(ZONE, V6E_HOST, -1, at=twin.clock.now + 1)
    with pytest.raises(TwinEventError, match="capacity-not-negative"):
        twin.set_capacity(ZONE, V6E_HOST, -4)


def test_the_bill_charges_running_hosts_at_the_catalogs_price_for_the_time_they_ran() -> None:
    twin, _ = twin_at()
    start = twin.clock.now
    link = template(twin, "od")
    slice_mig = mig(twin, "s", link)
    twin.advance(1800)  # nothing runs yet: nothing billed
    twin.create_instances(PROJECT, ZONE, slice_mig, hosts(4))
    twin.advance(2 * 3600)
    expected = 4 * 2 * _v6e_host_hour("on-demand")
    assert twin.bill.total() == pytest.approx(expected)
    assert twin.bill.host_hours() == pytest.approx(8.0) and twin.bill.wasted() == 0
    assert twin.bill.total(since=start, until=start + 1800) == 0
    [(resource, charge)] = twin.bill.by_resource().items()
    assert resource.endswith("/instanceGroupManagers/s") and charge.usd == pytest.approx(expected)


def test_a_manual_clock_is_its_own_object() -> None:
    assert TwinClock.manual(3.0).now == 3.0


def test_a_clock_moved_by_hand_runs_what_fell_due_at_the_next_catch_up_and_never_goes_back() -> None:
    twin, _ = twin_at(0.0)
    seen: list[float] = []
    twin.at(100.0, "mark", lambda: seen.append(twin.clock.now))
    twin.clock.now += 150  # as the controller's tests move a clock they share with the twin
    assert seen == []
    twin.catch_up()
    assert seen == [150.0]
    with pytest.raises(TwinTimeError, match="time-moves-forward"):
        twin.clock.now -= 1
    assert twin.clock.now == 150.0
