"""What Google does to resources as the twin's clock runs: Compute Engine restarts a host after a
host error only with automatic restart on, repairs an All Capacity reservation's host in place,
ends flex-start runs; Cloud TPU moves queued resources through their states, expires them, and
ends a failed repair UNKNOWN; and the bill of a Spot slice preempted and made again. Events
Google's documents rule out are refused in one line."""

from __future__ import annotations

from typing import Any

import pytest

from rayslice import catalog
from rayslice.cloud.capacity import ACTIVE, FAILED, PROVISIONING, SUSPENDED, SUSPENDING, WAITING
from rayslice.cloud.states import (
    INSTANCE_RUNNING,
    INSTANCE_TERMINATED,
    NODE_READY,
    NODE_REPAIRING,
    NODE_UNKNOWN,
)
from rayslice.cloud.twin import CloudTwin
from rayslice.cloud.twin.clock import NoSuchResource, TwinEventError
from rayslice.errors import EXIT_INVALID
from tests.cloud.timeline import PROJECT, START, V6E_HOST, ZONE, hosts, mig, template, twin_at


def _statuses(twin: CloudTwin) -> set[str]:
    return {v.status for v in twin.vms.values()}


def _slice(twin: CloudTwin, link: str, *, bulk: bool = False) -> dict[str, Any]:
    """MIG ``s`` of four hosts named by createInstances, its failed hosts left to Google."""
    made = mig(twin, "s", link, bulk=bulk, instanceLifecyclePolicy={"defaultActionOnFailure": "DO_NOTHING"})
    twin.create_instances(PROJECT, ZONE, made, hosts(4))
    return made


def _reserved_slice(twin: CloudTwin, reservation: str) -> None:
    """Bulk MIG ``s`` of four reservation-bound hosts consuming `reservation`."""
    link = template(
        twin,
        reservation,
        reservation=reservation,
        provisioningModel="RESERVATION_BOUND",
        instanceTerminationAction="DELETE",
    )
    _slice(twin, link, bulk=True)


@pytest.mark.parametrize("restart", [True, False])
def test_a_host_error_is_recovered_only_where_automatic_restart_is_on(restart: bool) -> None:
    """Compute v1 discovery, Scheduling.automaticRestart: restarted "if it is terminated by
    Compute Engine"; with it off the instance stays TERMINATED (N3)."""
    twin, _ = twin_at()
    _slice(twin, template(twin, "od", automaticRestart=restart))
    where = {vm.name: vm.physical_host for vm in twin.vms.values()}
    twin.host_error(PROJECT, ZONE, "s")
    assert _statuses(twin) == {INSTANCE_TERMINATED}
    twin.advance(twin.timings.restart_after_s - 1)
    assert _statuses(twin) == {INSTANCE_TERMINATED}
    twin.advance(1)
    if restart:  # all four together, on healthy hardware elsewhere
        assert _statuses(twin) == {INSTANCE_RUNNING}
        assert all(twin.vms[(PROJECT, ZONE, n)].physical_host != h for n, h in where.items())
    else:
        twin.advance(30 * 24 * 3600)
        assert _statuses(twin) == {INSTANCE_TERMINATED} and twin.schedule.pending() == []


def test_an_all_capacity_reservations_host_is_repaired_in_place_never_relocated() -> None:
    """Cloud TPU, "TPU capacity modes": in All Capacity mode "hardware failures are repaired on the
    existing host without automatically relocating instances" (N4)."""
    twin, _ = twin_at()
    twin.all_capacity.add("r1")
    _reserved_slice(twin, "r1")
    where = {vm.name: vm.physical_host for vm in twin.vms.values()}
    twin.host_error(PROJECT, ZONE, "s")
    twin.advance(twin.timings.restart_after_s)  # no relocation after the managed-mode delay
    assert _statuses(twin) == {INSTANCE_TERMINATED}
    twin.advance(twin.timings.repair_in_place_s - twin.timings.restart_after_s)
    assert _statuses(twin) == {INSTANCE_RUNNING}
    assert {vm.name: vm.physical_host for vm in twin.vms.values()} == where  # the same hosts


def test_maintenance_stops_the_hosts_until_it_is_done() -> None:
    twin, _ = twin_at()
    _slice(twin, template(twin, "od"))
    twin.maintenance(PROJECT, ZONE, "s", duration_s=3600)
    twin.advance(3599)
    assert _statuses(twin) == {INSTANCE_TERMINATED}
    twin.advance(1)
    assert _statuses(twin) == {INSTANCE_RUNNING}


def test_a_flex_start_run_ends_at_its_max_run_duration_and_stops_billing() -> None:
    twin, _ = twin_at()
    twin.set_capacity(ZONE, V6E_HOST, 4)
    link = template(
        twin,
        "flex",
        provisioningModel="FLEX_START",
        instanceTerminationAction="DELETE",
        maxRunDuration={"seconds": "7200"},
    )
    _slice(twin, link, bulk=True)
    twin.advance(7199)
    assert len(twin.vms) == 4
    twin.advance(1)
    assert twin.vms == {} and sorted(twin.ended) == ["s-w0", "s-w1", "s-w2", "s-w3"]
    assert twin.capacity.free[(ZONE, V6E_HOST)] == 4  # back to the zone
    twin.advance(3600)
    charge = twin.bill.charge()
    # The catalog publishes no flex-start price: the host-hours are counted, never priced.
    assert catalog.chip_hour_price("v6e", catalog.region_of(ZONE), "flex-start") is None
    assert charge.unpriced_host_hours == pytest.approx(8.0) and charge.usd == 0


def test_a_run_that_ends_before_it_starts_is_refused_before_anything_is_made() -> None:
    twin, _ = twin_at()
    twin.set_capacity(ZONE, "v6e", 4)
    with pytest.raises(TwinEventError, match="run-ends-after-it-starts"):
        _queued(twin, provisioningModel="FLEX_START", runDuration={"maxRunDuration": "0s"})
    assert twin.queued == {} and twin.nodes == {} and twin.capacity.free[(ZONE, "v6e")] == 4


def _queued(twin: CloudTwin, name: str = "q", **fields: Any) -> dict[str, Any]:
    node = {"acceleratorType": "v6e-16", "runtimeVersion": "v2-alpha-tpuv6e"}
    body = {"tpu": {"nodeSpec": [{"nodeId": "n", "node": node}]}, **fields}
    return twin.create_queued_resource(PROJECT, ZONE, name, body)


def _state(twin: CloudTwin, name: str = "q") -> str:
    return str(twin.queued[(PROJECT, ZONE, name)]["state"]["state"])


def test_a_queued_resource_goes_waiting_provisioning_active_then_its_run_ends_suspending_suspended() -> None:
    twin, booted = twin_at()
    twin.timings.queued_provisioning_s = 300
    twin.timings.queued_suspending_s = 60
    twin.set_capacity(ZONE, "v6e", 0)
    _queued(twin, provisioningModel="FLEX_START", runDuration={"maxRunDuration": "3600s"})
    twin.schedule_capacity(ZONE, "v6e", 4, at=START + 600)
    twin.advance(600)
    assert _state(twin) == PROVISIONING and booted == []  # the node is CREATING
    twin.advance(300)
    assert _state(twin) == ACTIVE and twin.nodes[(PROJECT, ZONE, "n")]["state"] == NODE_READY
    assert len(booted) == 4
    twin.advance(3600)  # the run duration, from ACTIVE
    assert _state(twin) == SUSPENDING and (PROJECT, ZONE, "n") not in twin.nodes
    twin.advance(60)
    assert _state(twin) == SUSPENDED


def test_a_queued_resource_expires_at_its_deadline_without_being_read() -> None:
    twin, _ = twin_at()
    twin.set_capacity(ZONE, "v6e", 0)
    _queued(twin, queueingPolicy={"validUntilDuration": "3600s"})
    twin.schedule_capacity(ZONE, "v6e", 4, at=START + 7200)
    twin.advance(3599)
    assert _state(twin) == WAITING
    twin.advance(3601)  # the deadline runs before the capacity comes
    assert _state(twin) == FAILED and twin.nodes == {}


def test_ending_a_run_that_never_started_is_refused_in_one_line() -> None:
    twin, _ = twin_at()
    twin.set_capacity(ZONE, "v6e", 0)
    _queued(twin)
    with pytest.raises(TwinEventError) as refused:
        twin.end_run(PROJECT, ZONE, "q")
    assert "run-ends-after-it-starts" in str(refused.value) and "\n" not in str(refused.value)
    assert refused.value.exit_code == EXIT_INVALID and _state(twin) == WAITING


@pytest.mark.parametrize("repaired, end", [(True, NODE_READY), (False, NODE_UNKNOWN)])
def test_a_tpu_node_under_repair_ends_ready_or_unknown(repaired: bool, end: str) -> None:
    """tpu v2 discovery, Node.state: REPAIRING, then READY, or UNKNOWN "after a failed repair" (U6)."""
    twin, booted = twin_at()
    _queued(twin)
    hosts_up = len(booted)
    twin.node_host_error(PROJECT, ZONE, "n", repaired=repaired, after=1800)
    assert twin.nodes[(PROJECT, ZONE, "n")]["state"] == NODE_REPAIRING
    twin.advance(1800)
    assert twin.nodes[(PROJECT, ZONE, "n")]["state"] == end
    assert len(booted) == hosts_up * (2 if repaired else 1)
    twin.advance(3600)
    # Billed while READY only: nothing under repair, nothing UNKNOWN.
    assert twin.bill.host_hours() == pytest.approx(4 * (1 if repaired else 0))


def test_events_on_resources_that_do_not_exist_are_refused() -> None:
    twin, _ = twin_at()
    for event in (
        lambda: twin.preempt(PROJECT, ZONE, "nothing"),
        lambda: twin.host_error(PROJECT, ZONE, "nothing"),
        lambda: twin.node_host_error(PROJECT, ZONE, "nothing"),
        lambda: twin.end_run(PROJECT, ZONE, "nothing"),
    ):
        with pytest.raises(NoSuchResource) as refused:
            event()
        assert refused.value.exit_code == EXIT_INVALID and "twin rule" in str(refused.value)
    # Scheduled for later, the preemption is refused when it falls due.
    twin.at(START + 60, "preempt a slice never made", lambda: twin.preempt(PROJECT, ZONE, "nothing"))
    with pytest.raises(NoSuchResource, match="preempt-existing-host"):
        twin.advance(60)


def test_the_bill_of_a_spot_slice_preempted_and_made_again() -> None:
    """Billed while RUNNING: two hours, nothing while preempted, one hour of the new slice."""
    twin, _ = twin_at()
    link = template(twin, "spot", provisioningModel="SPOT", instanceTerminationAction="STOP")
    _slice(twin, link)
    twin.at(START + 2 * 3600, "Spot preemption", lambda: twin.preempt(PROJECT, ZONE, "s"))
    twin.advance(2 * 3600 + 1800)
    assert _statuses(twin) == {INSTANCE_TERMINATED}
    twin.delete_mig(PROJECT, ZONE, "s")  # the controller makes it again, whole
    _slice(twin, link)
    twin.advance(3600)
    per_chip = catalog.chip_hour_price("v6e", catalog.region_of(ZONE), "spot")
    assert per_chip is not None
    assert twin.bill.total() == pytest.approx(4 * 4 * 3 * per_chip)  # 4 hosts x 4 chips x 3 h
    assert twin.bill.wasted() == 0  # never partly up
    assert twin.bill.total(since=START + 2 * 3600, until=START + 2 * 3600 + 1800) == 0


def test_a_calendar_reservations_period_ends_its_hosts_when_due() -> None:
    twin, _ = twin_at()
    _reserved_slice(twin, "cal-1")
    twin.at(START + 3 * 3600, "cal-1's period ends", lambda: twin.end_reservation(PROJECT, ZONE, "cal-1"))
    twin.advance(3 * 3600 - 1)
    assert len(twin.vms) == 4
    twin.advance(1)
    assert twin.vms == {} and sorted(twin.ended) == ["s-w0", "s-w1", "s-w2", "s-w3"]
    with pytest.raises(NoSuchResource, match="period-ends-for-existing-hosts"):
        twin.end_reservation(PROJECT, ZONE, "cal-1")


def test_a_preempted_spot_hosts_capacity_is_googles_so_deleting_it_frees_nothing() -> None:
    """Google preempts a Spot host to take its capacity back: once the zone is full, deleting the
    stopped slice leaves no room for a new one (a direct create asks for the zone's free hosts)."""
    twin, _ = twin_at()
    link = template(twin, "spot", provisioningModel="SPOT", instanceTerminationAction="STOP")
    twin.set_capacity(ZONE, V6E_HOST, 4)
    _slice(twin, link)
    twin.preempt(PROJECT, ZONE, "s")
    twin.delete_mig(PROJECT, ZONE, "s")
    assert twin.capacity.free[(ZONE, V6E_HOST)] == 0
    twin.set_capacity(ZONE, V6E_HOST, 4)  # capacity comes back; a slice deleted while running frees its hosts
    _slice(twin, link)
    twin.delete_mig(PROJECT, ZONE, "s")
    assert twin.capacity.free[(ZONE, V6E_HOST)] == 4
