"""What every bundled workload shares: reading the TPU shape off a live Ray cluster, choosing
slices and hosts, and the command line.

Workloads never assume a topology. The slices, their hosts and each host's TPU worker id come
from the labels Ray's own TPU detection puts on every node (`ray.io/tpu-*`) and its `TPU`
resource; the catalog says how many hosts a complete slice of that type has, on the platform
the boot script labels each TPU host's node with (`names.PLATFORM_LABEL`). Ray names the
type as the host does (``v7x-16`` for Compute Engine's ``tpu7x-16``), which the catalog reads.
A bundle index of a placement group is not a TPU worker id, so tasks read their worker id from
their node's label.

Driver-side helpers import only `ray`; JAX and torch_xla are imported inside tasks, on the host
whose chips the task holds. Expected failures are `rayslice.errors` classes and end in their exit
codes.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.queue import Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayslice import catalog, names
from rayslice.errors import InvalidInput, JobFailed, NoCluster, RaysliceError

TPU_RESOURCE = "TPU"
# Node label keys set by Ray's TPU detection (ray._private.accelerators.tpu).
WORKER_ID_LABEL = "ray.io/tpu-worker-id"
TOPOLOGY_LABEL = "ray.io/tpu-topology"
POD_TYPE_LABEL = "ray.io/tpu-pod-type"


@dataclass(frozen=True)
class TpuHost:
    """One Ray node with TPU chips, as Ray's TPU detection described it."""

    node_id: str
    ip: str
    slice_name: str
    worker_id: int
    pod_type: str
    topology: str
    chips: int
    platform: str | None = None  # the platform label; None on a node the boot script did not start


@dataclass(frozen=True)
class TpuSlice:
    """The alive hosts of one slice, ordered by TPU worker id, and the slice's catalog shape."""

    name: str
    pod_type: str
    topology: str
    chips_per_host: int
    expected_hosts: int
    hosts: tuple[TpuHost, ...]

    @property
    def complete(self) -> bool:
        return [h.worker_id for h in self.hosts] == list(range(self.expected_hosts))

    @property
    def generation(self) -> str:
        """The generation as Ray spells it (``v7x``), for `ray.util.tpu`."""
        return catalog.reported_name(self.pod_type).rsplit("-", 1)[0]

    @property
    def chips(self) -> int:
        return self.chips_per_host * len(self.hosts)

    def describe(self) -> str:
        return (
            f"{self.name} ({self.pod_type}, topology {self.topology}, "
            f"{len(self.hosts)}/{self.expected_hosts} hosts x {self.chips_per_host} chips)"
        )


def tpu_hosts(nodes: Sequence[dict[str, Any]] | None = None) -> list[TpuHost]:
    """Every alive node that has TPU chips and the labels Ray's TPU detection adds."""
    found = []
    for node in ray.nodes() if nodes is None else nodes:
        labels = node.get("Labels") or {}
        chips = int(node.get("Resources", {}).get(TPU_RESOURCE, 0))
        if not node.get("Alive") or chips == 0 or WORKER_ID_LABEL not in labels:
            continue
        found.append(
            TpuHost(
                node_id=node["NodeID"],
                ip=node["NodeManagerAddress"],
                slice_name=labels.get(names.SLICE_NAME_LABEL, ""),
                worker_id=int(labels[WORKER_ID_LABEL]),
                pod_type=labels.get(POD_TYPE_LABEL, ""),
                topology=labels.get(TOPOLOGY_LABEL, ""),
                chips=chips,
                platform=labels.get(names.PLATFORM_LABEL),
            )
        )
    return found


def _expected_hosts(pod_type: str, chips_per_host: int, platform: str | None = None) -> int:
    """Hosts in a complete slice: the catalog shape on the cluster's `platform`, whose chips per
    host must be what Ray saw.

    Without a platform label (a node that rayslice's boot script did not start, e.g. a KubeRay
    pod), the shape is the one of any platform whose chips per host match: the TPU VM API and
    GKE disagree for 8-chip v5e/v6e (one 8-chip host vs two 4-chip nodes).
    """
    offering = (platform,) if platform else catalog.PLATFORMS
    shapes = [
        catalog.lookup(pod_type, p) for p in offering if catalog.canonical_name(pod_type) in catalog.table(p)
    ]
    for shape in shapes:
        if shape.chips_per_host == chips_per_host:
            return shape.hosts
    if not shapes:
        catalog.lookup(pod_type, offering[0])  # raises CatalogError naming the closest types
    raise InvalidInput(
        f"hosts of {pod_type} report {chips_per_host} TPU chips each, which no {pod_type} of "
        f"{' or '.join(offering)} has; check the nodes' TPU resources"
    )


def tpu_slices(hosts: Sequence[TpuHost] | None = None) -> list[TpuSlice]:
    """The slices present in the cluster, sorted by name, complete or not."""
    by_name: dict[str, list[TpuHost]] = {}
    for host in tpu_hosts() if hosts is None else hosts:
        by_name.setdefault(host.slice_name, []).append(host)
    slices = []
    for name, members in sorted(by_name.items()):
        members.sort(key=lambda h: h.worker_id)
        first = members[0]
        slices.append(
            TpuSlice(
                name=name,
                pod_type=first.pod_type,
                topology=first.topology,
                chips_per_host=first.chips,
                expected_hosts=_expected_hosts(first.pod_type, first.chips, first.platform),
                hosts=tuple(members),
            )
        )
    return slices


def catalog_slice(accelerator_type: str, platform: str = "compute") -> TpuSlice:
    """The shape of a slice of `accelerator_type` that the cluster does not have yet, from the
    catalog: for a job that asks Ray for slices an elastic cluster adds (docs/elastic.md;
    elastic clusters run on compute only, hence the default platform). It has no name and no
    hosts."""
    shape = catalog.lookup(accelerator_type, platform)
    return TpuSlice(
        name="",
        pod_type=catalog.reported_name(shape.accelerator_type),
        topology=shape.topology,
        chips_per_host=shape.chips_per_host,
        expected_hosts=shape.hosts,
        hosts=(),
    )


def choose_slices(
    count: int | None = 1,
    *,
    slice_name: str | None = None,
    accelerator_type: str | None = None,
    slices: Sequence[TpuSlice] | None = None,
    fewest_hosts: bool = False,
) -> list[TpuSlice]:
    """`count` complete slices of one type (all of that type when `count` is None).

    Without `accelerator_type` or `slice_name`, the largest slices are preferred (most hosts,
    then by name): a multi-host job should not land on a single-host slice by chance. With
    `fewest_hosts`, the smallest are, for a job that runs on one host. Raises InvalidInput listing
    what the cluster has when the request can't be met (NoCluster when it has no TPU host at all).
    """
    present = tpu_slices() if slices is None else list(slices)
    if not present:
        raise NoCluster(
            "the Ray cluster has no TPU hosts (no node with a TPU resource and "
            f"a {WORKER_ID_LABEL} label); start a TPU cluster or the simulated slice"
        )
    have = "; ".join(s.describe() for s in present)
    direction = 1 if fewest_hosts else -1
    candidates = sorted(
        (s for s in present if s.complete), key=lambda s: (direction * s.expected_hosts, s.name)
    )
    if slice_name is not None:
        candidates = [s for s in candidates if s.name == slice_name]
    if accelerator_type is not None:
        wanted = catalog.canonical_name(accelerator_type)
        candidates = [s for s in candidates if catalog.canonical_name(s.pod_type) == wanted]
    if not candidates:
        asked = " ".join(x for x in (slice_name, accelerator_type) if x) or "any"
        raise InvalidInput(f"no complete TPU slice matches {asked}; the cluster has: {have}")
    same_type = [s for s in candidates if s.pod_type == candidates[0].pod_type]
    if count is None:
        return same_type
    if len(same_type) < count:
        raise InvalidInput(
            f"asked for {count} complete {candidates[0].pod_type} slices, the "
            f"cluster has {len(same_type)}: {have}"
        )
    return same_type[:count]


def choose_single_host_slice(
    job: str,
    multihost_counterpart: str,
    *,
    chips: int | None = None,
    slice_name: str | None = None,
    accelerator_type: str | None = None,
    slices: Sequence[TpuSlice] | None = None,
) -> TpuSlice:
    """The slice for a job that holds every chip of one host (`chips` None, or a host's worth):
    a single-host slice, preferred over the rest, never a host of a multi-host slice.

    A process holding a whole host of a multi-host slice is one process of a program spanning the
    slice (libtpu's, and the simulated runtime's, rule): alone, it waits for the other hosts until
    the job's timeout. Refused up front with InvalidInput naming `multihost_counterpart`, the job
    that runs on every host. Fewer chips than a host has form a program of their own, so
    `--chips 1` runs on a host of any slice. Also called by `rayslice run` before it submits.
    """
    (chosen,) = choose_slices(
        1, slice_name=slice_name, accelerator_type=accelerator_type, slices=slices, fewest_hosts=True
    )
    if chosen.expected_hosts > 1 and chips in (None, chosen.chips_per_host):
        raise InvalidInput(
            f"{job} needs a single-host slice and none in the cluster matches (it would get "
            f"{chosen.describe()}): on a multi-host slice, a program holding a whole host waits for "
            f"the slice's other hosts, and the job would hang until its timeout. Run "
            f"{multihost_counterpart} instead, which runs on every host of the slice"
        )
    return chosen


def check_chips_on_one_host(chips: int, hosts: Sequence[TpuHost]) -> None:
    """Fail fast where Ray would wait forever: a task asking for more chips than any host has."""
    largest = max((h.chips for h in hosts), default=0)
    if chips < 1 or chips > largest:
        raise InvalidInput(
            f"this job asks for {chips} TPU chips on one host, but the largest host in the "
            f"cluster has {largest}; ask for 1..{largest} chips (Ray accepts 1, 2, 4 or 8)"
        )


def one_host_options(chips: int, tpu_slice: TpuSlice) -> dict[str, Any]:
    """Task options holding `chips` chips on one host of `tpu_slice` (checked against its hosts)."""
    check_chips_on_one_host(chips, tpu_slice.hosts)
    return {
        "num_cpus": 0,
        "resources": {TPU_RESOURCE: chips},
        "label_selector": {names.SLICE_NAME_LABEL: tpu_slice.name},
    }


# How often the driver shows the progress tasks reported while it waits for them.
PROGRESS_POLL_S = 0.5


def show_line(line: str) -> None:
    """Print one line of progress now: a job's stdout is a pipe or a log file, which Python
    buffers in blocks, so without the flush a long job shows its lines only when it ends."""
    print(line, flush=True)


class Progress:
    """Lines a task reports (call it with one) for the driver to show while it waits (`wait_ready`).

    A task's own prints reach the driver through Ray's log monitor, but prefixed with the task's
    pid and IP, and lines that look alike from several hosts are folded into one. A training loop's
    step lines go through this queue instead (an actor on no CPU), and the driver prints them as
    they come, exactly as the loop wrote them.

    The queue lives on the driver's node (the head), never on a TPU host: when a slice is
    preempted, a queue on one of its hosts would die with it, and the driver's next read would
    end the job with `ActorUnavailableError` instead of the node's death that `rayslice run
    --max-restarts` restarts on.
    """

    def __init__(self) -> None:
        driver_node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": driver_node})

    def __call__(self, line: str) -> None:  # in a task; returns once the line is queued
        self._queue.put(line)

    def show_new(self) -> None:  # in the driver
        for line in self._queue.get_nowait_batch(self._queue.qsize()):
            show_line(line)


def wait_ready(
    refs: list[ray.ObjectRef], timeout_s: float, what: str, progress: Progress | None = None
) -> list[Any]:
    """`ray.get` that turns a hang (a busy slice, a host that never joins) into a clear error, and
    raises the first task failure at once; meanwhile it shows what the tasks report to `progress`.

    The tasks of one multi-host program wait on each other in collectives: when one host's task
    fails (its node was preempted, say), the others would wait for it until `timeout_s`, and the
    error that ends the job would be the timeout, not the node's death that `rayslice run
    --max-restarts` looks for.
    """
    deadline = time.monotonic() + timeout_s
    pending = list(refs)
    while pending:
        left = max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(
            pending, num_returns=1, timeout=left if progress is None else min(left, PROGRESS_POLL_S)
        )
        if progress is not None:
            progress.show_new()
        if not ready:
            if time.monotonic() < deadline:
                continue
            raise JobFailed(
                f"{what} did not finish within {timeout_s:.0f} s "
                f"({len(refs) - len(pending)}/{len(refs)} done); is another job holding the chips?"
            )
        ray.get(ready)  # raises that task's error now
    return ray.get(refs)


# ---- inside a task ---------------------------------------------------------------------------


def current_worker_id() -> int:
    """This task's host's TPU worker id, from the node label (not the bundle index)."""
    labels: dict[str, Any] = ray.get_runtime_context().get_node_labels()  # values are str at runtime
    return int(labels[WORKER_ID_LABEL])


# ---- the command line of every workload -------------------------------------------------------


def add_slice_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slice",
        dest="slice_name",
        metavar="NAME",
        help="run on this slice (default: a complete slice with the most hosts)",
    )
    parser.add_argument(
        "--accelerator-type", metavar="TYPE", help="run on a slice of this type, e.g. v6e-16 (default: any)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="give up when the tasks have not finished after S seconds",
    )


def add_chips_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chips", type=int, help="TPU chips to hold (default: all of one host)")


def connect() -> None:
    """Join the running cluster: RAY_ADDRESS when set (a Ray job), else the one on this host."""
    try:
        ray.init(address=os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=True)
    except ConnectionError as exc:
        raise NoCluster(
            f"no Ray cluster to join ({exc}); run this on a cluster host or submit it with `rayslice run`"
        ) from None


def run_main(
    parser: argparse.ArgumentParser,
    body: Callable[[argparse.Namespace], object],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse, connect, run; an expected failure becomes a one-line message and its exit code."""
    args = parser.parse_args(argv)
    # Through a pipe (`| tee`, or the Jobs API's log), Python would hold the driver's lines, and
    # the task output Ray forwards to it, until the job ends.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    try:
        connect()
        body(args)
    except RaysliceError as exc:  # CatalogError included
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
