"""Ray's demand as the head publishes it, and the whole slices it asks for.

An elastic cluster's head VM runs `rayslice/startup_scripts/demand_publisher.py`, which writes
what the GCS says is pending (placement groups, tasks and actors) and how each slice is used to
the head's guest attribute ``rayslice/demand`` (`names.DEMAND_KEY`; the schema is in that file's
docstring). The controller cannot reach Ray; it reads that attribute through Compute Engine's
``instances.getGuestAttributes``, and `parse` turns the text into a `Demand`. `slices_wanted`
turns the pending demand into whole slices of the cluster's type, never single hosts.

The value is not trusted: any job on the cluster can write it (the head's metadata server
answers every process on the head VM), so `parse` bounds every number (`MAX_COUNT`,
`MAX_AMOUNT`, `MAX_SECONDS`) and the arithmetic below stays finite whatever it says. What a
forged value can still do is ask for slices: at most the stack's ``slices``, under its
``maxUsdPerHour`` (`rayslice.recovery.scaling`).

The controller runs from a zipapp on Python 3.10 (`rayslice.recovery.bundle`): standard library only.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 1  # the publisher's `SCHEMA_VERSION`
# Ray's TPU chips resource: a TPU host has ``TPU: <chips per host>``.
TPU = "TPU"
# Ray's spelling of an accelerator type (Ray 2.60 ray/_private/accelerators/tpu.py,
# normalize_tpu_accelerator_type: ``v6e-16``, ``v7x-16`` for Compute Engine's ``tpu7x-16``),
# which `catalog.reported_name` gives.
_RAY_TYPE = re.compile(r"v\d+[a-z]*-\d+")
# The bounds of a published value's numbers. A count (of requests, of a slice's nodes) above
# MAX_COUNT is more pending work than a GCS could hold. Ray keeps a resource amount as a
# fixed-point int64 in units of 1/10000 (src/ray/common/scheduling/fixed_point.h: ``int64_t i_``,
# ``RESOURCE_UNIT_SCALING 10000``), so no amount it holds exceeds 2**63 / 10**4, about 9.2e14.
# Times (``at``, unix seconds; ``idle_s``) stop at 2**32 s, the year 2106. Within these bounds
# every sum `slices_wanted` makes is a finite float.
MAX_COUNT = 10**9
MAX_AMOUNT = 1e15
MAX_SECONDS = float(2**32)


@dataclass(frozen=True)
class Request:
    """`count` requests of one `shape` ({resource: amount}). `slice` names the one slice a label
    selector pins them to (``ray.io/tpu-slice-name in (name)``); None when any node may take them."""

    shape: dict[str, float]
    count: int
    slice: str | None = None


@dataclass(frozen=True)
class PendingGroup:
    """A placement group Ray could not place yet: its bundles by shape, and its strategy."""

    bundles: tuple[Request, ...]
    strategy: str


@dataclass(frozen=True)
class SliceUse:
    """A slice's Ray nodes: how many joined, whether any runs or holds something, and for how long
    every one of them has been idle by Ray's account (0 when busy)."""

    nodes: int
    busy: bool
    idle_s: float


@dataclass(frozen=True)
class Demand:
    """One published value: when it was read (`at`, unix seconds), what is pending, how each slice
    (by its name) is used, and whether a list was cut short (the demand is then at least this)."""

    at: float
    pgs: tuple[PendingGroup, ...]
    tasks: tuple[Request, ...]
    slices: dict[str, SliceUse]
    truncated: bool
    # What `ray.autoscaler.sdk.request_resources` asks the cluster to hold in all (Ray Train's
    # elastic scaling asks this way): see `slices_asked`.
    asked: tuple[Request, ...] = ()


def _fail(where: str, expected: str, value: object) -> ValueError:
    return ValueError(f"demand {where}: expected {expected}, got {value!r:.80}")


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, "an object", value)
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(where, "a list", value)
    return value


def _number(value: object, where: str, limit: float) -> float:
    # Compared before any conversion: float(10**400) would raise OverflowError.
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= limit:
        raise _fail(where, f"a number from 0 to {limit:g}", value)
    return float(value)


def _whole(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise _fail(where, f"a whole number from 0 to {MAX_COUNT}", value)
    return value


def _flag(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, "true or false", value)
    return value


def _request(value: object, where: str) -> Request:
    entry = _object(value, where)
    shape = _object(entry.get("shape"), f"{where}.shape")
    pinned = entry.get("slice")
    if pinned is not None and not isinstance(pinned, str):
        raise _fail(f"{where}.slice", "a slice name", pinned)
    return Request(
        shape={
            str(name): _number(amount, f"{where}.shape[{name!r}]", MAX_AMOUNT)
            for name, amount in shape.items()
        },
        count=_whole(entry.get("count"), f"{where}.count"),
        slice=pinned,
    )


def _group(value: object, where: str) -> PendingGroup:
    entry = _object(value, where)
    strategy = entry.get("strategy")
    if not isinstance(strategy, str):
        raise _fail(f"{where}.strategy", "a string", strategy)
    bundles = _list(entry.get("bundles"), f"{where}.bundles")
    return PendingGroup(
        bundles=tuple(_request(b, f"{where}.bundles[{i}]") for i, b in enumerate(bundles)), strategy=strategy
    )


def _slice_use(value: object, where: str) -> SliceUse:
    entry = _object(value, where)
    return SliceUse(
        nodes=_whole(entry.get("nodes"), f"{where}.nodes"),
        busy=_flag(entry.get("busy"), f"{where}.busy"),
        idle_s=_number(entry.get("idle_s"), f"{where}.idle_s", MAX_SECONDS),
    )


def parse(text: str) -> Demand:
    """The `Demand` in a published value; ValueError saying what is wrong when the text is not
    JSON, has another schema version, or any field is missing, of the wrong type or out of
    bounds. Whether ``at`` lies in the future is the reader's to judge (`scaling.decide`): it
    needs the reader's clock."""
    try:
        value = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, and an integer of more digits than int() takes
        raise ValueError(f"demand: not JSON ({exc})") from None
    top = _object(value, "value")
    if top.get("v") != SCHEMA_VERSION:
        raise ValueError(
            f"demand: schema version {top.get('v')!r:.20}, but this controller reads version "
            f"{SCHEMA_VERSION}; "
            "deploy the head and the controller from the same rayslice"
        )
    slices = _object(top.get("slices"), "slices")
    return Demand(
        at=_number(top.get("at"), "at", MAX_SECONDS),
        pgs=tuple(_group(g, f"pgs[{i}]") for i, g in enumerate(_list(top.get("pgs"), "pgs"))),
        tasks=tuple(_request(t, f"tasks[{i}]") for i, t in enumerate(_list(top.get("tasks"), "tasks"))),
        slices={str(name): _slice_use(use, f"slices[{name!r}]") for name, use in slices.items()},
        truncated=_flag(top.get("truncated"), "truncated"),
        asked=tuple(_request(a, f"asked[{i}]") for i, a in enumerate(_list(top.get("asked", []), "asked"))),
    )


def head_resource(accelerator_type: str) -> str:
    """The resource Ray gives worker 0 of each slice of `accelerator_type` (Ray's spelling), and
    that `ray.util.tpu.slice_placement_group` and JaxTrainer reserve a slice by: Ray 2.60
    ray/_private/accelerators/tpu.py, ``TPU-{pod_type}-head`` in
    get_current_node_additional_resources and in reserve_tpu_slice's one-bundle placement group."""
    if not _RAY_TYPE.fullmatch(accelerator_type):
        raise ValueError(
            f"accelerator type {accelerator_type!r}: expected Ray's spelling, such as v6e-16 "
            "(catalog.reported_name of the spec's type)"
        )
    return f"TPU-{accelerator_type}-head"


def _slices_for(requests: tuple[Request, ...], head: str, chips_per_slice: int) -> int:
    """Each request of `head` is one slice; the TPU chips of the rest fill whole slices. Requests
    pinned to a named slice wait for that slice's hosts: a new slice cannot hold them."""
    heads = chips = 0.0
    for request in requests:
        if request.slice is not None:
            continue
        if request.shape.get(head, 0) > 0:
            heads += request.count
        else:
            chips += request.shape.get(TPU, 0) * request.count
    return int(heads) + math.ceil(chips / chips_per_slice)


def slices_wanted(demand: Demand, accelerator_type: str, chips_per_slice: int) -> int:
    """How many more whole slices of `accelerator_type` (Ray's spelling, e.g. ``v6e-16``; see
    `head_resource`) of `chips_per_slice` chips the pending demand asks for: Ray could not place
    it on the nodes it has, so this counts beyond the slices already joined.

    - a pending placement group that holds the slice head resource asks for one slice per such
      bundle (how `slice_placement_group` and JaxTrainer reserve each slice), or for its TPU
      chips in whole slices if those are more;
    - any other pending placement group asks for its TPU chips in whole slices;
    - pending tasks and actors: one slice per request of the head resource, and their other TPU
      chips together in whole slices.

    Requests pinned to a named slice count for nothing (see `Request`); nor do requests of other
    resources only (CPU work goes to the head VM, never to a new slice)."""
    if chips_per_slice < 1:
        raise ValueError(f"chips_per_slice={chips_per_slice}: a slice has at least one chip")
    head = head_resource(accelerator_type)
    wanted = 0
    for group in demand.pgs:
        free = tuple(b for b in group.bundles if b.slice is None)
        heads = sum(b.count for b in free if b.shape.get(head, 0) > 0)
        chips = sum(b.shape.get(TPU, 0) * b.count for b in free)
        wanted += max(heads, math.ceil(chips / chips_per_slice))
    return wanted + _slices_for(demand.tasks, head, chips_per_slice)


def slices_asked(demand: Demand, accelerator_type: str, chips_per_slice: int) -> int:
    """How many whole slices of `accelerator_type` the cluster should have in all for what
    ``request_resources`` asked (`Demand.asked`), by the rule of pending tasks (`slices_wanted`).
    Unlike pending demand, this counts the slices there already, busy or not: asked for 100 CPUs
    with 45 tasks running, Ray's autoscaler adds nodes "so up to 100 tasks can run concurrently"
    and "not ... so that 145 tasks can run" (Ray 2.60, ray/autoscaler/sdk/sdk.py,
    request_resources). Ray Train's elastic scaling waits until its workers fit."""
    if chips_per_slice < 1:
        raise ValueError(f"chips_per_slice={chips_per_slice}: a slice has at least one chip")
    return _slices_for(demand.asked, head_resource(accelerator_type), chips_per_slice)
