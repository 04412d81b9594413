"""The twin's capacity: direct creates fail fast in an empty zone, requests wait, are fulfilled
whole when capacity comes, and fail at their deadline."""

from __future__ import annotations

import pytest

from rayslice.cloud.capacity import (
    ACTIVE,
    FAILED,
    WAITING,
    ZONE_RESOURCE_POOL_EXHAUSTED,
    Capacity,
    CapacityExhausted,
    Request,
)
from rayslice.errors import EXIT_NO_CLUSTER

ZONE, KIND = "us-east5-b", "ct6e-standard-4t"


def _request(name: str, hosts: int, created: list[str], deadline: float | None = None) -> Request:
    return Request(name, ZONE, KIND, hosts, deadline, lambda: created.append(name))


def test_a_zone_never_limited_takes_everything():
    capacity = Capacity()
    capacity.take(ZONE, KIND, 1000)
    created: list[str] = []
    assert capacity.submit(_request("r", 64, created)).state == ACTIVE and created == ["r"]


def test_a_direct_create_in_an_empty_zone_fails_with_googles_error_and_names_the_ways_to_wait():
    capacity = Capacity()
    capacity.set(ZONE, KIND, 3)
    with pytest.raises(CapacityExhausted) as err:
        capacity.take(ZONE, KIND, 4)
    assert err.value.code == ZONE_RESOURCE_POOL_EXHAUSTED and err.value.exit_code == EXIT_NO_CLUSTER
    assert str(err.value).startswith(ZONE_RESOURCE_POOL_EXHAUSTED)
    assert "capacity=flex-start" in str(err.value) and "queued=true" in str(err.value)
    assert capacity.free[(ZONE, KIND)] == 3  # nothing taken
    capacity.take(ZONE, KIND, 3)
    assert capacity.free[(ZONE, KIND)] == 0


def test_a_request_waits_and_is_fulfilled_whole_when_capacity_comes():
    capacity = Capacity()
    capacity.set(ZONE, KIND, 0)
    created: list[str] = []
    request = capacity.submit(_request("slice-0", 4, created), now=0)
    assert request.state == WAITING and created == []
    capacity.set(ZONE, KIND, 3, now=10)  # not enough for all four hosts: nothing is created
    assert request.state == WAITING and created == []
    capacity.set(ZONE, KIND, 5, now=20)
    assert request.state == ACTIVE and created == ["slice-0"]
    assert capacity.free[(ZONE, KIND)] == 1


def test_requests_are_served_in_order_and_a_large_one_does_not_block_a_small_one():
    capacity = Capacity()
    capacity.set(ZONE, KIND, 0)
    created: list[str] = []
    big, small, second = (
        capacity.submit(_request(name, hosts, created))
        for name, hosts in (("big", 8), ("small", 2), ("two", 2))
    )
    capacity.set(ZONE, KIND, 3)
    assert (big.state, small.state, second.state) == (WAITING, ACTIVE, WAITING)
    capacity.give_back(ZONE, KIND, 9)  # 1 left + 9 freed: the big one, then the second
    assert (big.state, second.state) == (ACTIVE, ACTIVE) and created == ["small", "big", "two"]


def test_a_request_fails_at_its_deadline_with_the_reason():
    capacity = Capacity()
    capacity.set(ZONE, KIND, 0)
    created: list[str] = []
    request = capacity.submit(_request("slice-0", 4, created, deadline=3600), now=0)
    capacity.advance(now=3599)
    assert request.state == WAITING
    capacity.set(ZONE, KIND, 4, now=3600)  # capacity arrives too late: the deadline is checked first
    assert request.state == FAILED and created == []
    assert "deadline passed" in request.reason and ZONE in request.reason
    assert capacity.free[(ZONE, KIND)] == 4
