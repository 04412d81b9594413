"""An elastic cluster's demand publisher: Ray's own autoscaling demand, where the controller can read it.

The recovery controller of an elastic cluster (`minSlices`) adds and removes whole slices, but
it runs on its own VM with no network path to Ray: it reads the cloud API only. So the head VM
runs this script, which every `--interval-s` seconds reads the GCS's cluster resource state
(what autoscaler v2 itself reads: pending tasks and actors, pending placement groups, and every
node's resources, labels and idle time) and writes a compact JSON summary to the head's guest
attribute ``rayslice/demand`` (`names.DEMAND_KEY`), which the controller reads through Compute
Engine's ``instances.getGuestAttributes``. `rayslice.recovery.demand` parses it; a test keeps the
two in step. The value (schema version ``v`` 1)::

    {"v": 1, "at": <unix s>,
     "pgs": [{"bundles": [{"shape": {res: amount}, "count": n, "slice": name?}], "strategy": "PACK"}],
     "tasks": [{"shape": {res: amount}, "count": n, "slice": name?}],
     "asked": [{"shape": {res: amount}, "count": n, "slice": name?}],
     "slices": {"<ray.io/tpu-slice-name>": {"nodes": n, "busy": bool, "idle_s": float}},
     "truncated": bool}

- ``pgs``: one entry per pending placement group, its bundles grouped by shape. ``strategy`` is
  the group's (``PACK``, ``SPREAD``, ...), from the GCS's ``<pg_id>:<strategy>|<state>`` detail.
- ``tasks``: pending task and actor requests, by shape, with their count.
- ``asked``: the bundles of ``ray.autoscaler.sdk.request_resources`` (the GCS's cluster resource
  constraints under autoscaler v2, the internal KV under v1: `requested_v1`), by shape: what
  the cluster should hold in all, busy or not. Ray Train's elastic scaling asks for its workers
  this way and places nothing until they fit (ray/train/v2/_internal/execution/scaling_policy/
  elastic.py, Ray 2.60), so without this key an elastic JaxTrainer on a cluster without its
  slices would wait for ever. Absent in values from before it (the reader then takes none).
- ``slice``: present when the request's label selector pins it to one slice
  (``ray.io/tpu-slice-name in (name)``, as `ray.util.tpu.slice_placement_group` pins its
  workers' bundles once it has reserved that slice's head). Such a request waits for that
  slice's own hosts, and a new slice cannot hold it.
- ``slices``: every live Ray node with the slice-name label, per slice. ``busy``: some node of
  the slice has a resource in use, other than the marker resources Ray gives every node
  (``node:<ip>``, ``node:__internal_head__``, ``accelerator_type:<type>``): they exist to pin
  work to a node or a type, and a fraction of them is only ever asked for beside real resources.
  Everything else counts, the ``TPU-<type>-head`` and slice-name resources too (a placement
  group holding a slice's head has reserved the slice, even while its job runs nothing).
  ``idle_s``: the least time any node of the slice has been idle by Ray's own account (the
  node's ``idle_duration_ms``), 0 when busy or when any node is not IDLE (running, draining).
- Each list, the bundles of one group and the slices hold at most `MAX_ITEMS` entries; ``truncated``
  says one was cut, so the reader knows the demand is at least what it sees.

A failed read (the GCS restarting, Ray not up yet) or a failed PUT is logged once per outage and
retried at the next interval; the script never exits on one. ``at`` changes at every write, so
the reader can tell a stale value from a quiet cluster.

This file runs on the head, which does not install rayslice: the boot script writes it from its
rendered text and runs it with the venv's Python (stdlib and Ray only), with RAY_AUTH_MODE and
RAY_AUTH_TOKEN_PATH in its environment, which authenticate the GCS client when the cluster uses
token auth. Usage::

    python demand_publisher.py --gcs-address HOST:PORT --attribute-url URL \\
        --slice-label ray.io/tpu-slice-name [--interval-s 5] [--log-file FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

# Compiled (Cython, protobuf) modules whose names mypy cannot see.
from ray._raylet import GcsClient  # type: ignore[attr-defined]
from ray.autoscaler.v2.schema import PlacementGroupResourceDemand
from ray.core.generated.autoscaler_pb2 import (  # type: ignore[attr-defined]
    ClusterResourceConstraint,
    GetClusterResourceStateReply,
    NodeStatus,
    ResourceRequest,
    ResourceRequestByCount,
)
from ray.core.generated.common_pb2 import LabelSelectorOperator  # type: ignore[attr-defined]

SCHEMA_VERSION = 1
MAX_ITEMS = 64
DEFAULT_INTERVAL_S = 5.0
# One read of the GCS may take this long; then it counts as failed and is tried at the next interval.
READ_TIMEOUT_S = 10.0
PUT_TIMEOUT_S = 5.0
# Resources every Ray node carries to be targeted by (node affinity, accelerator type), not work.
MARKER_PREFIXES = ("node:", "accelerator_type:")
IDLE, DEAD = NodeStatus.Value("IDLE"), NodeStatus.Value("DEAD")
LABEL_IN = LabelSelectorOperator.Value("LABEL_OPERATOR_IN")  # "label in (values)"
# Where request_resources leaves its bundles for autoscaler v1 (Ray 2.60
# ray_constants.AUTOSCALER_RESOURCE_REQUEST_CHANNEL, in the KV's default namespace).
RESOURCE_REQUEST_KEY = b"autoscaler_resource_request"

Log = Callable[[str], None]


def _shape(request: Any) -> dict[str, float]:
    return {name: float(amount) for name, amount in sorted(request.resources_bundle.items())}


def _pinned_slice(request: Any, slice_label: str) -> str | None:
    """The one slice a request's label selector pins it to (``slice_label in (name)``), if any."""
    for selector in request.label_selectors:
        for constraint in selector.label_constraints:
            if (
                constraint.label_key == slice_label
                and constraint.operator == LABEL_IN
                and len(constraint.label_values) == 1
            ):
                return str(constraint.label_values[0])
    return None


def _entry(shape: dict[str, float], count: int, pinned: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"shape": shape, "count": count}
    if pinned is not None:
        entry["slice"] = pinned
    return entry


def _capped(items: Iterable[Any]) -> tuple[list[Any], bool]:
    listed = list(items)
    return listed[:MAX_ITEMS], len(listed) > MAX_ITEMS


def _bundles(requests: Iterable[Any], slice_label: str) -> list[dict[str, Any]]:
    """A placement group's bundles, grouped by shape and pinned slice, in first-seen order."""
    counts: dict[str, int] = {}
    keys: dict[str, tuple[dict[str, float], str | None]] = {}
    for request in requests:
        shape, pinned = _shape(request), _pinned_slice(request, slice_label)
        key = json.dumps([shape, pinned])
        keys[key] = (shape, pinned)
        counts[key] = counts.get(key, 0) + 1
    return [_entry(shape, counts[key], pinned) for key, (shape, pinned) in keys.items()]


def _strategy(details: str) -> str:
    """The strategy in the GCS's ``<pg_id>:<strategy>|<state>`` detail, as Ray's own
    `PlacementGroupResourceDemand` parses it ("" if the detail has another form)."""
    return PlacementGroupResourceDemand(bundles_by_count=[], details=details).strategy or ""


def _node_busy(node: Any) -> bool:
    for name, total in node.total_resources.items():
        if name.startswith(MARKER_PREFIXES):
            continue
        if total - node.available_resources.get(name, 0.0) > 0:
            return True
    return False


def _slices(nodes: Iterable[Any], slice_label: str) -> dict[str, dict[str, Any]]:
    slices: dict[str, dict[str, Any]] = {}
    for node in nodes:
        status = node.status
        name = node.labels.get(slice_label)
        if status == DEAD or not name:
            continue
        busy = _node_busy(node)
        idle_s = node.idle_duration_ms / 1000 if status == IDLE and not busy else 0.0
        if name not in slices:
            slices[name] = {"nodes": 0, "busy": False, "idle_s": idle_s}
        entry = slices[name]
        entry["nodes"] += 1
        entry["busy"] = entry["busy"] or busy
        entry["idle_s"] = 0.0 if entry["busy"] else min(entry["idle_s"], idle_s)
    return slices


def snapshot(state: Any, now: float, slice_label: str) -> dict[str, Any]:
    """The published value of one ``ClusterResourceState`` (autoscaler.proto) read at `now`."""
    truncated = False
    pgs = []
    for gang in state.pending_gang_resource_requests:
        # As autoscaler v2's scheduler reads a gang: its first bundle selector, else the legacy list.
        requests = gang.bundle_selectors[0].resource_requests if gang.bundle_selectors else gang.requests
        bundles, cut = _capped(_bundles(requests, slice_label))
        truncated = truncated or cut
        pgs.append({"bundles": bundles, "strategy": _strategy(gang.details)})
    pgs, cut = _capped(pgs)
    truncated = truncated or cut
    tasks, cut = _capped(
        _entry(_shape(pending.request), int(pending.count), _pinned_slice(pending.request, slice_label))
        for pending in state.pending_resource_requests
    )
    truncated = truncated or cut
    asked, cut = _capped(
        _entry(_shape(asked.request), int(asked.count), _pinned_slice(asked.request, slice_label))
        for constraint in state.cluster_resource_constraints
        for asked in constraint.resource_requests
    )
    truncated = truncated or cut
    slice_items, cut = _capped(sorted(_slices(state.node_states, slice_label).items()))
    return {
        "v": SCHEMA_VERSION,
        "at": round(now, 3),
        "pgs": pgs,
        "tasks": tasks,
        "asked": asked,
        "slices": dict(slice_items),
        "truncated": truncated or cut,
    }


def encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def read_state(gcs_address: str) -> Any:
    """The GCS's ``ClusterResourceState``: what ``ray.autoscaler.v2.sdk.get_cluster_resource_state``
    returns (Ray 2.60, sdk.py), with a timeout, which that wrapper does not pass to the client;
    and, as one more of its cluster resource constraints, what ``request_resources`` wrote where
    autoscaler v1 reads it (`requested_v1`)."""
    client = GcsClient(address=gcs_address)
    reply = GetClusterResourceStateReply()
    reply.ParseFromString(client.get_cluster_resource_state(timeout_s=READ_TIMEOUT_S))
    state = reply.cluster_resource_state
    asked = requested_v1(client.internal_kv_get(RESOURCE_REQUEST_KEY, None, timeout=READ_TIMEOUT_S))
    if asked is not None:
        state.cluster_resource_constraints.append(asked)
    return state


def requested_v1(value: bytes | None) -> Any:
    """``request_resources`` writes to the GCS's cluster resource constraints only when the
    cluster runs autoscaler v2 (its GCS key says so); otherwise it writes a JSON list of bundles
    ({resource: amount}, label selectors dropped) to the internal KV key autoscaler v1's monitor
    reads (Ray 2.60, autoscaler/_private/commands.py request_resources, monitor.py
    update_resource_requests). A head started with ``ray start`` runs v1, so both are read. That
    list as a constraint, or None when there is none or it is not such a list."""
    try:
        bundles = json.loads(value) if value else []
    except ValueError:
        return None
    if not isinstance(bundles, list) or not bundles:
        return None
    shapes = Counter(  # equal bundles as one request with their count
        tuple(sorted((str(k), float(v)) for k, v in bundle.items()))
        for bundle in bundles
        if isinstance(bundle, dict) and all(isinstance(v, (int, float)) for v in bundle.values())
    )
    requests = [
        ResourceRequestByCount(request=ResourceRequest(resources_bundle=dict(shape)), count=count)
        for shape, count in shapes.items()
    ]
    return ClusterResourceConstraint(resource_requests=requests) if requests else None


def put(url: str, body: bytes) -> None:
    """PUT a guest attribute on the metadata server (Google's "Set and query guest attributes":
    ``PUT .../instance/guest-attributes/<namespace>/<key>`` with ``Metadata-Flavor: Google``)."""
    request = urllib.request.Request(url, data=body, method="PUT", headers={"Metadata-Flavor": "Google"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the metadata server is local
    with opener.open(request, timeout=PUT_TIMEOUT_S) as response:
        response.read()


def publish_once(
    read: Callable[[], Any], write: Callable[[bytes], None], slice_label: str, now: Callable[[], float]
) -> None:
    write(encode(snapshot(read(), now(), slice_label)))


def run(
    read: Callable[[], Any],
    write: Callable[[bytes], None],
    slice_label: str,
    interval_s: float,
    log: Log,
    *,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    rounds: int | None = None,
) -> None:
    """Publish every `interval_s` seconds (`rounds` times, or forever). A failure of either side is
    logged once per outage and the next round tries again."""
    failing = False
    done = 0
    while rounds is None or done < rounds:
        try:
            publish_once(read, write, slice_label, now)
        except Exception as exc:  # the GCS down or restarting, a refused PUT: both pass
            if not failing:
                why = f"{type(exc).__name__}: {exc}"
                log(f"cannot publish the demand ({why}); retrying every {interval_s:g} s")
            failing = True
        else:
            if failing:
                log("publishing the demand again")
            failing = False
        done += 1
        if rounds is None or done < rounds:
            sleep(interval_s)


def logger(log_file: str | None) -> Log:
    def log(message: str) -> None:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        line = f"{stamp} rayslice-demand: {message}\n"
        sys.stderr.write(line)
        if log_file:
            with open(log_file, "a") as out:
                out.write(line)

    return log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--gcs-address", required=True, help="the head's GCS, HOST:PORT")
    parser.add_argument("--attribute-url", required=True, help="the guest attribute's metadata URL")
    parser.add_argument("--slice-label", required=True, help="the node label that names a node's slice")
    parser.add_argument("--interval-s", type=float, default=DEFAULT_INTERVAL_S, help="seconds between writes")
    parser.add_argument("--log-file", help="also append log lines here")
    args = parser.parse_args(argv)
    if args.interval_s <= 0:
        parser.error("--interval-s must be positive")
    log = logger(args.log_file)
    log(
        f"publishing Ray's demand from {args.gcs_address} to {args.attribute_url} every {args.interval_s:g} s"
    )
    run(
        lambda: read_state(args.gcs_address),
        lambda body: put(args.attribute_url, body),
        args.slice_label,
        args.interval_s,
        log,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
