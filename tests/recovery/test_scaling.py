"""Elastic scaling decisions (`rayslice.recovery.scaling.decide`): whole slices from Ray's demand,
within `slices` and the price ceiling, removal only of idle slices the demand does not need."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rayslice.recovery.demand import parse
from rayslice.recovery.scaling import (
    AHEAD_AFTER_S,
    STALE_AFTER_S,
    Decision,
    ScalingPolicy,
    decide,
    instances_of,
)

SLICES = ("c-slice-0", "c-slice-1", "c-slice-2")
NOW = 1_000_000.0
POLICY = ScalingPolicy(
    min_slices=1,
    idle_timeout_s=60.0,
    accelerator_type="v6e-16",
    chips_per_slice=16,
    hosts_per_slice=4,
    head_instance="c-head",
    region="us-east5",
)
HEAD = {"shape": {"TPU-v6e-16-head": 1}, "count": 1}


def _demand(pgs=(), tasks=(), slices=None, at=NOW, asked=()):
    return parse(
        json.dumps(
            {
                "v": 1,
                "at": at,
                "pgs": list(pgs),
                "tasks": list(tasks),
                "slices": slices or {},
                "truncated": False,
                "asked": list(asked),
            }
        )
    )


def _use(busy: bool, idle_s: float = 0.0, nodes: int = 4) -> dict:
    return {"nodes": nodes, "busy": busy, "idle_s": idle_s}


def _pg(*bundles):
    return {"bundles": list(bundles), "strategy": "STRICT_SPREAD"}


def test_a_slice_placement_group_with_every_slice_busy_adds_the_next_slice_on_the_second_reading():
    demand = _demand(pgs=[_pg(HEAD)], slices={"c-slice-0": _use(True)})
    first = decide(POLICY, SLICES, {"c-slice-0"}, demand, NOW, missing_before=False)
    assert (first.add, first.missing, first.wanted) == ((), 1, 1)  # once: maybe a pending second phase
    second = decide(POLICY, SLICES, {"c-slice-0"}, demand, NOW, missing_before=True)
    assert second.add == ("c-slice-1",) and not second.remove and not second.waiting


def test_an_idle_slice_or_one_still_booting_takes_the_demand_instead():
    idle = _demand(pgs=[_pg(HEAD)], slices={"c-slice-0": _use(False, 5)})
    assert decide(POLICY, SLICES, {"c-slice-0"}, idle, NOW, True).add == ()
    booting = _demand(pgs=[_pg(HEAD)], slices={"c-slice-0": _use(True)})  # slice 1 not joined yet
    assert decide(POLICY, SLICES, {"c-slice-0", "c-slice-1"}, booting, NOW, True).add == ()


def test_tasks_and_groups_without_a_head_count_in_whole_slices():
    demand = _demand(
        pgs=[_pg({"shape": {"TPU": 4}, "count": 4})],  # one slice's hosts in one gang
        tasks=[{"shape": {"TPU": 4, "CPU": 1}, "count": 5}],  # 20 chips: two slices, never a host
        slices={"c-slice-0": _use(True)},
    )
    decision = decide(POLICY, SLICES, {"c-slice-0"}, demand, NOW, True)
    assert decision.wanted == 3 and decision.add == ("c-slice-1", "c-slice-2")
    assert decision.waiting == "1 more slice(s) wanted; slices=3 reached"


def test_the_price_ceiling_caps_what_is_added_and_says_so():
    capped = dataclasses.replace(POLICY, price_cap_slices=2, ceiling="maxUsdPerHour=90 ($43.20/h a slice)")
    demand = _demand(pgs=[_pg(HEAD), _pg(HEAD)], slices={"c-slice-0": _use(True)})
    decision = decide(capped, SLICES, {"c-slice-0"}, demand, NOW, True)
    assert decision.add == ("c-slice-1",)
    assert (
        decision.waiting
        == "1 more slice(s) wanted; the price ceiling maxUsdPerHour=90 ($43.20/h a slice) allows 2"
    )


def test_only_the_controllers_slices_idle_past_the_timeout_and_not_needed_are_removed():
    slices = {"c-slice-0": _use(False, 900), "c-slice-1": _use(False, 61), "c-slice-2": _use(False, 59)}
    with_hosts = set(SLICES)
    decision = decide(POLICY, SLICES, with_hosts, _demand(slices=slices), NOW, False)
    assert decision.remove == ("c-slice-1",)  # slice 0 is minSlices'; slice 2 not idle long enough
    # Three slices wanted and three free (none busy): every idle slice is needed.
    wanted = _demand(pgs=[_pg(HEAD)] * 3, slices=slices)
    assert decide(POLICY, SLICES, with_hosts, wanted, NOW, False).remove == ()


@pytest.mark.parametrize(
    "use",
    [
        _use(True),  # a running job: busy whatever the time
        _use(False, 900, nodes=3),  # a host not joined (booting or gone): not idle
    ],
)
def test_a_busy_or_partly_joined_slice_is_never_removed(use):
    demand = _demand(slices={"c-slice-0": _use(True), "c-slice-1": use})
    assert decide(POLICY, SLICES, set(SLICES[:2]), demand, NOW, False).remove == ()


def test_no_reading_or_a_stale_one_changes_nothing():
    none = decide(POLICY, SLICES, {"c-slice-1"}, None, NOW, True)
    assert (none.add, none.remove, none.waiting) == ((), (), "no recent demand from the head")
    stale = _demand(pgs=[_pg(HEAD)], slices={"c-slice-1": _use(False, 900)}, at=NOW - STALE_AFTER_S - 1)
    assert decide(POLICY, SLICES, {"c-slice-1"}, stale, NOW, True) == Decision()


def test_a_reading_from_the_future_changes_nothing_and_says_so():
    """A forged ``at`` far ahead would never go stale: it is not believed, and the wait says why."""
    ahead = _demand(pgs=[_pg(HEAD)] * 2, slices={"c-slice-1": _use(False, 900)}, at=NOW + 86400)
    decision = decide(POLICY, SLICES, {"c-slice-1"}, ahead, NOW, True)
    assert (decision.add, decision.remove, decision.cancel) == ((), (), ())
    assert decision.waiting.startswith("the head's demand is stamped 86400s ahead of this controller's clock")
    # A clock a little behind the head's is no forgery: the reading counts.
    near = _demand(pgs=[_pg(HEAD)], slices={"c-slice-0": _use(True)}, at=NOW + AHEAD_AFTER_S)
    assert decide(POLICY, SLICES, {"c-slice-0"}, near, NOW, True).add == ("c-slice-1",)


def test_added_hosts_carry_the_names_and_reserved_addresses_infra_gave_them():
    [first, _] = instances_of(POLICY, "proj", ["c-slice-1-w0", "c-slice-1-w1"])
    assert first == {
        "name": "c-slice-1-w0",
        "preservedState": {
            "internalIPs": {
                "nic0": {
                    "autoDelete": "NEVER",
                    "ipAddress": {"address": "projects/proj/regions/us-east5/addresses/c-slice-1-w0-ip"},
                }
            }
        },
    }


def test_the_policy_survives_its_trip_through_metadata():
    assert ScalingPolicy.from_json(POLICY.to_json()) == POLICY
    with pytest.raises(ValueError, match="not an elastic scaling policy"):
        ScalingPolicy.from_json('{"min_slices": 1}')


# ---- flex-start: a slice added as a resize request that waits for capacity -----------------------

FLEX = dataclasses.replace(POLICY, run_duration_s=86400)


def test_a_waiting_request_counts_as_the_slice_added_so_no_second_one_is_asked_for():
    demand = _demand(pgs=[_pg(HEAD)], slices={"c-slice-0": _use(True)})
    waiting = decide(FLEX, SLICES, {"c-slice-0"}, demand, NOW, missing_before=True, waiting={"c-slice-1"})
    assert waiting == Decision(wanted=1)  # slice 1 takes the demand once its hosts come
    more = _demand(pgs=[_pg(HEAD), _pg(HEAD)], slices={"c-slice-0": _use(True)})
    both = decide(FLEX, SLICES, {"c-slice-0"}, more, NOW, missing_before=True, waiting={"c-slice-1"})
    assert both.add == ("c-slice-2",) and not both.cancel  # the next slice, not slice 1 again
    full = decide(
        FLEX,
        SLICES,
        {"c-slice-0"},
        _demand(pgs=[_pg(HEAD)] * 3, slices={"c-slice-0": _use(True)}),
        NOW,
        True,
        waiting={"c-slice-1", "c-slice-2"},
    )
    assert full.waiting == "1 more slice(s) wanted; slices=3 reached"  # a waiting slice counts


def test_a_request_whose_demand_went_is_cancelled_before_an_idle_slice_is_removed():
    idle = {"c-slice-0": _use(False, 600), "c-slice-1": _use(False, 600)}
    gone = decide(
        FLEX, SLICES, {"c-slice-0", "c-slice-1"}, _demand(slices=idle), NOW, False, waiting={"c-slice-2"}
    )
    assert gone.cancel == ("c-slice-2",) and gone.remove == ("c-slice-1",)
    one = _demand(pgs=[_pg(HEAD)], slices={"c-slice-0": _use(True), "c-slice-1": _use(False, 600)})
    kept = decide(FLEX, SLICES, {"c-slice-0", "c-slice-1"}, one, NOW, False, waiting={"c-slice-2"})
    assert kept.cancel == ("c-slice-2",) and not kept.remove  # the idle slice with hosts takes the job
    below_min = decide(FLEX, SLICES, set(), _demand(), NOW, False, waiting={"c-slice-0"})
    assert not below_min.cancel  # slice 0 is the program's (minSlices=1): its request is Pulumi's


def test_no_reading_cancels_nothing():
    for demand in (None, _demand(at=NOW - STALE_AFTER_S - 1)):
        assert not decide(FLEX, SLICES, set(), demand, NOW, False, waiting={"c-slice-2"}).cancel


# An elastic JaxTrainer of 4 to 8 workers on v6e-16 (4 hosts of 4 chips): Ray Train asks for the
# most workers with request_resources and starts none until its minimum fits.
TRAINER_ASKS = [{"shape": {"TPU": 4}, "count": 8}]


def test_what_request_resources_asks_for_is_added_though_nothing_is_pending():
    demand = _demand(asked=TRAINER_ASKS, slices={"c-slice-0": _use(True)})
    first = decide(POLICY, SLICES, {"c-slice-0"}, demand, NOW, missing_before=False)
    assert (first.add, first.missing, first.wanted, first.asked) == ((), 1, 0, 2)
    second = decide(POLICY, SLICES, {"c-slice-0"}, demand, NOW, missing_before=True)
    assert second.add == ("c-slice-1",)
    # Both there: nothing more to add, though one of them is idle.
    both = _demand(asked=TRAINER_ASKS, slices={"c-slice-0": _use(True), "c-slice-1": _use(False, 5)})
    assert decide(POLICY, SLICES, {"c-slice-0", "c-slice-1"}, both, NOW, missing_before=True) == Decision(
        asked=2
    )


def test_a_slice_request_resources_still_asks_for_is_kept_past_the_idle_time():
    idle = {"c-slice-0": _use(False, 600), "c-slice-1": _use(False, 600)}
    kept = decide(POLICY, SLICES, set(idle), _demand(asked=TRAINER_ASKS, slices=idle), NOW, False)
    assert not kept.remove and not kept.add
    # The trainer ended and withdrew its request: the controller's idle slice goes.
    gone = decide(POLICY, SLICES, set(idle), _demand(slices=idle), NOW, False)
    assert gone.remove == ("c-slice-1",)
