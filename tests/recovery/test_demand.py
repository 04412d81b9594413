"""`rayslice.recovery.demand`: the head's published demand, parsed, and turned into whole slices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ray._private.accelerators.tpu import (
    infer_tpu_pod_type_from_topology,
    normalize_tpu_accelerator_type,
)

from rayslice import catalog
from rayslice.recovery import demand
from rayslice.recovery.demand import Demand, PendingGroup, Request, SliceUse
from tests.imports import imported_modules

HEAD = "TPU-v6e-16-head"


def _value(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "at": 1700000000.5, "pgs": [], "tasks": [], "slices": {}, "truncated": False, **fields}


def _demand(**fields: Any) -> Demand:
    return demand.parse(json.dumps(_value(**fields)))


def _pg(*bundles: dict[str, Any], strategy: str = "PACK") -> dict[str, Any]:
    return {"bundles": list(bundles), "strategy": strategy}


def test_a_published_value_parses_into_frozen_records() -> None:
    parsed = _demand(
        pgs=[_pg({"shape": {HEAD: 1.0}, "count": 1}, {"shape": {"TPU": 4}, "count": 4, "slice": "s-1"})],
        tasks=[{"shape": {"TPU": 4.0, "CPU": 1.0}, "count": 2}],
        slices={"s-1": {"nodes": 4, "busy": False, "idle_s": 12.5}},
        truncated=True,
    )
    assert parsed == Demand(
        at=1700000000.5,
        pgs=(
            PendingGroup(
                bundles=(Request({HEAD: 1.0}, 1), Request({"TPU": 4.0}, 4, slice="s-1")), strategy="PACK"
            ),
        ),
        tasks=(Request({"TPU": 4.0, "CPU": 1.0}, 2),),
        slices={"s-1": SliceUse(nodes=4, busy=False, idle_s=12.5)},
        truncated=True,
    )
    with pytest.raises(AttributeError):
        parsed.at = 0  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "demand: not JSON"),
        ("[1]", "demand value: expected an object"),
        (json.dumps(_value(v=2)), "schema version 2, but this controller reads version 1"),
        (json.dumps({k: v for k, v in _value().items() if k != "v"}), "schema version None"),
        (json.dumps(_value(at="now")), "demand at: expected a number from 0 to"),
        (json.dumps(_value(pgs={})), "demand pgs: expected a list"),
        (json.dumps(_value(pgs=[{"bundles": []}])), "demand pgs[0].strategy: expected a string"),
        (
            json.dumps(_value(pgs=[_pg({"shape": {"TPU": -1}, "count": 1})])),
            r"pgs[0].bundles[0].shape['TPU']",
        ),
        (json.dumps(_value(tasks=[{"shape": {"TPU": 4}, "count": 1.5}])), "tasks[0].count: expected a whole"),
        (json.dumps(_value(asked={})), "demand asked: expected a list"),
        (json.dumps(_value(asked=[{"shape": {"TPU": 4}}])), "asked[0].count: expected a whole"),
        (json.dumps(_value(tasks=[{"shape": {}, "count": True}])), "tasks[0].count: expected a whole"),
        (
            json.dumps(_value(tasks=[{"shape": {}, "count": 1, "slice": 3}])),
            "tasks[0].slice: expected a slice",
        ),
        (json.dumps(_value(slices={"s": {"nodes": 1, "busy": "no", "idle_s": 0}})), "slices['s'].busy"),
        (json.dumps(_value(slices={"s": {"nodes": 1, "busy": False}})), "slices['s'].idle_s"),
        (json.dumps(_value(truncated=None)), "demand truncated: expected true or false"),
        # Numbers that would overflow a float (OverflowError in slices_wanted) or never go stale.
        (
            json.dumps(_value(tasks=[{"shape": {"TPU": 4}, "count": 10**400}])),
            "tasks[0].count: expected a whole",
        ),
        (
            json.dumps(_value(tasks=[{"shape": {"TPU": 1e308}, "count": 1}])),
            "tasks[0].shape['TPU']: expected a",
        ),
        (
            json.dumps(_value(asked=[{"shape": {"TPU": 10**400}, "count": 1}])),
            "asked[0].shape['TPU']: expected",
        ),
        (json.dumps(_value(pgs=[_pg({"shape": {"TPU": 4}, "count": 10**10})])), "pgs[0].bundles[0].count"),
        (json.dumps(_value(tasks=[{"shape": {"TPU": float("inf")}, "count": 1}])), "tasks[0].shape['TPU']"),
        (json.dumps(_value(tasks=[{"shape": {"TPU": float("nan")}, "count": 1}])), "tasks[0].shape['TPU']"),
        (
            json.dumps(_value(slices={"s": {"nodes": 10**400, "busy": False, "idle_s": 0}})),
            "slices['s'].nodes",
        ),
        (
            json.dumps(_value(slices={"s": {"nodes": 4, "busy": False, "idle_s": 1e308}})),
            "slices['s'].idle_s",
        ),
        ('{"v": 1, "at": 1' + "0" * 5000 + "}", "demand: not JSON"),  # more digits than int() reads
        (json.dumps(_value(at=1e308)), "demand at: expected a number from 0 to"),
        (json.dumps(_value(at=10**400)), "demand at: expected a number from 0 to"),
        (json.dumps(_value(at=1e12)), "demand at: expected a number from 0 to"),  # the year 33658
    ],
)
def test_a_malformed_or_unknown_value_is_a_clear_value_error(text: str, message: str) -> None:
    """A future ``at`` within the bounds is the reader's to refuse (tests/recovery/test_scaling.py,
    `test_a_reading_from_the_future_changes_nothing`): only the reader has a clock."""
    with pytest.raises(ValueError) as raised:
        demand.parse(text)
    assert message in str(raised.value)


def test_the_largest_value_parse_takes_asks_for_a_finite_number_of_slices() -> None:
    """Every number at its bound, in more entries than the publisher ever writes: the sums stay
    finite floats and the answer a whole number (a forged value cannot raise out of the loop)."""
    most = {"shape": {HEAD: demand.MAX_AMOUNT, "TPU": demand.MAX_AMOUNT}, "count": demand.MAX_COUNT}
    parsed = _demand(
        at=demand.MAX_SECONDS,
        pgs=[_pg(*[most] * 100)] * 100,
        tasks=[most] * 1000,
        asked=[most] * 1000,
        slices={"s": {"nodes": demand.MAX_COUNT, "busy": False, "idle_s": demand.MAX_SECONDS}},
    )
    wanted = demand.slices_wanted(parsed, "v6e-16", 1)
    asked = demand.slices_asked(parsed, "v6e-16", 1)
    assert isinstance(wanted, int) and isinstance(asked, int) and 0 < asked < wanted


def test_each_pending_slice_head_reservation_asks_for_one_slice() -> None:
    """`reserve_tpu_slice`'s placement group is one bundle of the head resource; two of them
    pending (two jobs, or a job's second slice) ask for two."""
    one = _pg({"shape": {HEAD: 1.0}, "count": 1})
    assert demand.slices_wanted(_demand(pgs=[one]), "v6e-16", 16) == 1
    assert demand.slices_wanted(_demand(pgs=[one, one]), "v6e-16", 16) == 2
    # A head bundle and TPU bundles of its own slice in one group: still that one slice.
    with_workers = _pg({"shape": {HEAD: 1.0}, "count": 1}, {"shape": {"TPU": 4.0}, "count": 4})
    assert demand.slices_wanted(_demand(pgs=[with_workers]), "v6e-16", 16) == 1


def test_another_types_head_asks_for_nothing() -> None:
    other = _pg({"shape": {"TPU-v6e-32-head": 1.0}, "count": 1})
    assert demand.slices_wanted(_demand(pgs=[other]), "v6e-16", 16) == 0


def test_a_pending_group_of_tpu_bundles_asks_for_its_chips_in_whole_slices() -> None:
    """A single-host slice_placement_group (no head reservation) or any user group: 20 chips of
    16-chip slices are two slices, never one slice and a host."""
    assert demand.slices_wanted(_demand(pgs=[_pg({"shape": {"TPU": 4.0}, "count": 4})]), "v6e-16", 16) == 1
    assert demand.slices_wanted(_demand(pgs=[_pg({"shape": {"TPU": 4.0}, "count": 5})]), "v6e-16", 16) == 2
    # Each group is reserved whole, so two groups of one host each need two slices.
    two = [_pg({"shape": {"TPU": 4.0}, "count": 1}), _pg({"shape": {"TPU": 4.0}, "count": 1})]
    assert demand.slices_wanted(_demand(pgs=two), "v6e-16", 16) == 2


def test_bundles_pinned_to_a_named_slice_ask_for_nothing() -> None:
    """slice_placement_group pins its workers' bundles to the slice whose head it reserved; they
    wait for that slice's hosts, and a new slice cannot take them."""
    pinned = _pg({"shape": {"TPU": 4.0}, "count": 4, "slice": "s-0"}, strategy="SPREAD")
    assert demand.slices_wanted(_demand(pgs=[pinned]), "v6e-16", 16) == 0
    tasks = [{"shape": {"TPU": 4.0}, "count": 8, "slice": "s-0"}]
    assert demand.slices_wanted(_demand(tasks=tasks), "v6e-16", 16) == 0


def test_pending_tasks_and_actors_ask_for_their_chips_together_in_whole_slices() -> None:
    tasks = [{"shape": {"TPU": 4.0}, "count": 3}, {"shape": {"TPU": 4.0, "CPU": 1.0}, "count": 2}]
    assert demand.slices_wanted(_demand(tasks=tasks), "v6e-16", 16) == 2  # 20 chips
    heads = [{"shape": {HEAD: 1.0}, "count": 2}, {"shape": {"TPU": 4.0}, "count": 1}]
    assert demand.slices_wanted(_demand(tasks=heads), "v6e-16", 16) == 3  # two heads, and 4 chips


def test_cpu_only_demand_asks_for_no_slice() -> None:
    value = _demand(
        pgs=[_pg({"shape": {"CPU": 8.0}, "count": 2})], tasks=[{"shape": {"CPU": 1.0}, "count": 100}]
    )
    assert demand.slices_wanted(value, "v6e-16", 16) == 0


def test_groups_and_tasks_add_up() -> None:
    value = _demand(
        pgs=[_pg({"shape": {HEAD: 1.0}, "count": 1}), _pg({"shape": {"TPU": 4.0}, "count": 2})],
        tasks=[{"shape": {"TPU": 1.0}, "count": 1}],
    )
    assert demand.slices_wanted(value, "v6e-16", 16) == 3


@pytest.mark.parametrize(("accelerator_type", "chips"), [("tpu7x-16", 8), ("v6e-16", 0)])
def test_a_type_in_another_spelling_or_an_empty_slice_is_refused(accelerator_type: str, chips: int) -> None:
    with pytest.raises(ValueError, match=r"Ray's spelling|at least one chip"):
        demand.slices_wanted(_demand(), accelerator_type, chips)


def test_the_head_resource_is_rays_for_every_type_the_catalog_offers() -> None:
    """For each catalog type: the host's resource (Ray's TPU detection names it ``TPU-<pod
    type>-head``, the pod type normalized from TPU_ACCELERATOR_TYPE, which the boot script sets
    to the spec's type) and what `slice_placement_group` asks for (the pod type inferred from its
    topology and generation) are both `head_resource` of `catalog.reported_name`."""
    checked = set()
    for platform in ("compute", "tpu-vm"):
        for tpu in catalog.table(platform).values():
            reported = catalog.reported_name(tpu.accelerator_type)
            expected = demand.head_resource(reported)
            assert f"TPU-{normalize_tpu_accelerator_type(tpu.accelerator_type)}-head" == expected
            generation = "TPU-" + reported.split("-")[0].upper()
            assert f"TPU-{infer_tpu_pod_type_from_topology(tpu.topology, generation)}-head" == expected
            checked.add(tpu.accelerator_type)
    assert {"v6e-16", "tpu7x-16", "v5p-16"} <= checked


def test_it_needs_only_the_standard_library() -> None:
    """It runs in the controller's zipapp on Python 3.10, beside no rayslice.spec nor pydantic."""
    found = imported_modules(Path(demand.__file__).read_text(), demand.__name__, is_package=False)
    assert {name.split(".")[0] for _, name in found} <= {
        "__future__",
        "dataclasses",
        "json",
        "math",
        "re",
        "typing",
    }
