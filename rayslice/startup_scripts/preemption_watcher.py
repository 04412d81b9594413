"""A Spot host's preemption watcher: tells Ray the host is going away as soon as GCE says so.

Compute Engine gives a Spot (or preemptible) VM a notice before it stops it: the metadata key
``instance/preempted`` turns ``TRUE`` and the guest gets an ACPI G2 soft off, "up to 30 seconds"
before the VM is stopped (Google's "Spot VMs" -> "Preemption process"; "Create and use Spot VMs"
-> "Detect preemption of Spot VMs" reads the key, with ``wait_for_change=true`` to be told at
once). Without this watcher Ray learns of the loss only when the GCS's health checks of the
powered-off raylet fail (default 3 s x 5), and Ray Train or `rayslice run --max-restarts` keep
counting the host's resources until then.

On the notice the watcher drains every Ray node of this host with reason
``DRAIN_NODE_REASON_PREEMPTION`` and the notice's deadline, through the GCS's DrainNode call, the
one ``ray drain-node`` makes (Ray 2.60: ray/scripts/scripts.py ``drain_node`` ->
``GcsClient.drain_node(node_id_hex, reason, message, deadline_timestamp_ms)``; the same call
autoscaler v2 uses for preemption, and Ray's own SIGTERM handler in ray/_private/node.py
``_drain_node_before_shutdown``). The GCS then schedules nothing more there, and a task or actor
that dies with the node is reported as preempted ("the actor's node was preempted"), which
`rayslice.jobs.restarts` counts as a node loss.

Then it stops Ray on this host (``ray stop``), having first written a marker file that keeps the
boot script's ``run_ray`` from starting Ray again (the boot clears it). It stops Ray as soon as
every Ray node of this host still alive has said that its just-in-time checkpoint is committed
(a key ``JIT_CHECKPOINT_KEY_PREFIX + <node id>`` in the GCS's key-value store, namespace
``JIT_CHECKPOINT_NAMESPACE``, which `rayslice.workloads.jax_trainer`'s workers put once Ray Train
has taken the checkpoint they saved on the notice; a drained node with nothing running shuts
itself down and no longer counts), and at the latest ``STOP_BEFORE_DEADLINE_S`` before the VM
stops, for a job that says nothing. Draining alone is not enough with GCE's full 30 s: Ray Train's
controller waits out a drain in its PreemptingState until the drain's deadline
(ray/train/v2/_internal/execution/controller/controller.py, ``_is_preemption_deadline_exceeded``),
then restarts and sizes the new worker group from the nodes the GCS lists alive (the
AutoscalingCoordinator's ``_update_cluster_node_resources`` and ``ray.util.tpu.get_num_tpu_slices``
both keep every ``Alive`` node). A draining node is alive, and a VM powered off at the deadline
stays alive for the GCS's health checks (3 s x 5) more: Ray Train would reserve the preempted slice
again and wait for it. ``ray stop`` sends the raylet SIGTERM first, and the raylet unregisters
from the GCS at once; the workers it ran die with it, and Ray Train restarts on what is left.
A raylet stopped before its drain's deadline reports ``EXPECTED_TERMINATION``, not
``AUTOSCALER_DRAIN_PREEMPTED`` (Ray 2.60 src/ray/raylet/main.cc, the SIGTERM handler), so its
actors' deaths are not marked preempted (see docs/recovery.md for what that costs).

It survives the metadata server's hiccups (any error: retried with backoff, the ETag kept), and on
a host that never gets the notice it only waits. A preemption reaches only Spot hosts, and the
boot script starts the watcher only on those (`startup_scripts.variables`).

This file runs on the hosts, which do not install rayslice: the boot script writes it from its
rendered text and runs it with the venv's Python (stdlib and Ray only; the GCS is reached through
`RayGcs`, so the logic is tested without a cluster). Usage::

    python preemption_watcher.py --metadata-url URL --gcs-address HOST:PORT --node-ip IP \\
        --deadline-s 30 --stop-marker FILE --ray-cli PATH [--log-file FILE]
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Compiled (Cython, protobuf) modules whose names mypy cannot see.
from ray._raylet import GcsClient  # type: ignore[attr-defined]
from ray.core.generated.autoscaler_pb2 import DrainNodeReason  # type: ignore[attr-defined]
from ray.core.generated.gcs_pb2 import GcsNodeInfo  # type: ignore[attr-defined]

PREEMPTED_KEY = "instance/preempted"
TRUE, FALSE = "TRUE", "FALSE"
DRAIN_REASON = "DRAIN_NODE_REASON_PREEMPTION"
# How long one wait_for_change request is held (timeout_sec); then it is simply asked again.
WAIT_S = 300
RETRY_MAX_DELAY_S = 30
# An ETag no answer carries: the first request returns the current value at once (Google's
# server returns immediately when last_etag differs from the value's ETag).
NO_ETAG = "0"
# `ray stop --grace-period`: SIGTERM, then SIGKILL for what is still running this long after.
STOP_GRACE_S = 5
# Ray is stopped this long before the VM stops: the grace period plus as much again, so Ray is gone
# (and unregistered) before the deadline even when ray stop needs its whole grace period. What is
# left of the notice (20 s of GCE's 30) is the most the workers' just-in-time checkpoint gets (Ray
# stops sooner once the job says it is committed): Ray Train's own PreemptionWatcher sees the drain
# within its 5 s poll (RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S).
STOP_BEFORE_DEADLINE_S = 2 * STOP_GRACE_S
# Where a job says that a node's just-in-time checkpoint is committed, so that Ray may stop there
# at once: the key is the prefix and the node's id (hex), in the GCS's key-value store. The same
# as `rayslice.names`'s, which the jobs use (this file runs where rayslice is not installed).
JIT_CHECKPOINT_NAMESPACE = "rayslice"
JIT_CHECKPOINT_KEY_PREFIX = "jit-checkpoint/"
# How often the key-value store is asked while waiting for those keys.
CHECKPOINT_POLL_S = 0.2
# Its log's milestones (bench/train_preemption.py times the shrink by them).
ALL_COMMITTED = "every job on this host has committed its checkpoint"
STOPPING = "stopping Ray on this host"

Log = Callable[[str], None]


def read_preempted(metadata_url: str, last_etag: str, wait_s: float) -> tuple[str, str]:
    """``instance/preempted`` once it differs from `last_etag` (or after `wait_s`): (value, ETag)."""
    query = urllib.parse.urlencode(
        {"wait_for_change": "true", "last_etag": last_etag, "timeout_sec": str(int(wait_s))}
    )
    request = urllib.request.Request(
        f"{metadata_url.rstrip('/')}/{PREEMPTED_KEY}?{query}", headers={"Metadata-Flavor": "Google"}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the metadata server is local
    with opener.open(request, timeout=wait_s + 10) as response:
        return response.read().decode().strip(), response.headers.get("ETag", "")


def wait_for(
    value: str,
    metadata_url: str,
    log: Log,
    *,
    wait_s: float = WAIT_S,
    max_delay_s: float = RETRY_MAX_DELAY_S,
    read: Callable[[str, str, float], tuple[str, str]] = read_preempted,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once ``instance/preempted`` is `value`. Any failure to read it (no answer, an HTTP
    error, a reset connection) is logged once per outage and retried with backoff."""
    etag, delay, failing = NO_ETAG, 1.0, False
    while True:
        try:
            current, etag = read(metadata_url, etag, wait_s)
        except (OSError, http.client.HTTPException, ValueError) as exc:  # URLError is an OSError
            if not failing:
                log(f"cannot read {PREEMPTED_KEY} ({exc}); retrying")
            failing, etag = True, NO_ETAG
            sleep(delay)
            delay = min(delay * 2, max_delay_s)
            continue
        if failing:
            log(f"{PREEMPTED_KEY} readable again")
        failing, delay = False, 1.0
        if current == value:
            return


@dataclass(frozen=True)
class Timeline:
    """What happens when, from the notice (epoch seconds): the drain's deadline is when the VM
    stops; Ray is stopped `STOP_BEFORE_DEADLINE_S` before it (never before the notice)."""

    notice: float
    deadline: float

    @classmethod
    def from_notice(cls, notice: float, deadline_s: float) -> Timeline:
        return cls(notice, notice + deadline_s)

    @property
    def stop_ray(self) -> float:
        return max(self.notice, self.deadline - STOP_BEFORE_DEADLINE_S)


def drain(
    drain_node: Callable[[str, int], tuple[bool, str]],
    own_nodes: Callable[[], list[str]],
    timeline: Timeline,
    log: Log,
    *,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Drain every Ray node of this host (`own_nodes`) with the VM's deadline; retried until each
    is accepted or it is time to stop Ray. Returns the nodes drained."""
    deadline_ms = int(timeline.deadline * 1000)
    drained: list[str] = []
    delay = 0.5
    while now() < timeline.stop_ray:
        try:
            pending = [n for n in own_nodes() if n not in drained]
            for node in pending:
                accepted, why = drain_node(node, deadline_ms)
                if not accepted:
                    raise RuntimeError(f"drain of {node} refused: {why}")
                drained.append(node)
                left = timeline.deadline - now()
                log(f"drained Ray node {node} ({DRAIN_REASON}, deadline in {left:.0f} s)")
            if drained and not pending:
                return drained
            if not drained:
                log("no Ray node of this host is alive yet")
        except Exception as exc:  # the GCS unreachable, a node the GCS no longer knows: try again
            log(f"draining failed ({exc}); retrying")
        sleep(min(delay, max(0.0, timeline.stop_ray - now())))
        delay = min(delay * 2, 5.0)
    log(f"time to stop Ray; drained {len(drained)} node(s)")
    return drained


def wait_for_checkpoints(
    own_nodes: Callable[[], list[str]],
    checkpointed: Callable[[str], bool],
    timeline: Timeline,
    log: Log,
    *,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait until every Ray node of this host still alive has its just-in-time checkpoint
    committed (`checkpointed`), or until it is time to stop Ray. True if they all have."""
    failing = False
    while now() < timeline.stop_ray:
        try:
            waiting = [n for n in own_nodes() if not checkpointed(n)]
        except Exception as exc:  # the GCS unreachable: ask again, until the stop's time
            if not failing:
                log(f"cannot read the checkpoints' keys ({exc}); retrying")
            failing = True
        else:
            if not waiting:
                log(ALL_COMMITTED)
                return True
        sleep(min(CHECKPOINT_POLL_S, max(0.0, timeline.stop_ray - now())))
    return False


def on_notice(
    drain_node: Callable[[str, int], tuple[bool, str]],
    own_nodes: Callable[[], list[str]],
    checkpointed: Callable[[str], bool],
    timeline: Timeline,
    marker: Path,
    stop_ray: Callable[[], int],
    log: Log,
    *,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """The notice's timeline: the marker first (from now on the boot script starts no Ray here),
    the drain, then Ray stopped once the jobs' checkpoints are committed, at `timeline.stop_ray`
    at the latest."""
    marker.write_text(f"notice at {timeline.notice:.3f}; the VM stops by {timeline.deadline:.3f}\n")
    drain(drain_node, own_nodes, timeline, log, now=now, sleep=sleep)
    wait_for_checkpoints(own_nodes, checkpointed, timeline, log, now=now, sleep=sleep)
    log(f"{STOPPING}, {timeline.deadline - now():.0f} s before the VM stops")
    code = stop_ray()
    log(f"ray stop exited {code}")


def ray_stopper(ray_cli: str) -> Callable[[], int]:
    """`ray stop` on this host (it finds Ray's processes by name, the raylet first)."""
    return lambda: subprocess.run([ray_cli, "stop", f"--grace-period={STOP_GRACE_S}"], check=False).returncode


class RayGcs:
    """This host's Ray nodes and their drain, through the GCS client ``ray drain-node`` uses
    (RAY_AUTH_MODE and RAY_AUTH_TOKEN_PATH in the environment authenticate it)."""

    def __init__(self, gcs_address: str, node_ip: str, message: str):
        self.client = GcsClient(address=gcs_address)
        self.node_ip = node_ip
        self.message = message

    def own_nodes(self) -> list[str]:
        alive = GcsNodeInfo.GcsNodeState.ALIVE
        nodes = self.client.get_all_node_info(timeout=10, state_filter=alive)
        return [info.node_id.hex() for info in nodes.values() if info.node_manager_address == self.node_ip]

    def drain_node(self, node_id: str, deadline_ms: int) -> tuple[bool, str]:
        accepted, why = self.client.drain_node(
            node_id, DrainNodeReason.Value(DRAIN_REASON), self.message, deadline_ms, timeout=10
        )
        return bool(accepted), str(why)

    def checkpointed(self, node_id: str) -> bool:
        key = (JIT_CHECKPOINT_KEY_PREFIX + node_id).encode()
        return bool(self.client.internal_kv_exists(key, JIT_CHECKPOINT_NAMESPACE.encode(), timeout=10))


def logger(log_file: str | None) -> Log:
    def log(message: str) -> None:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        line = f"{stamp} rayslice-preemption: {message}\n"
        sys.stderr.write(line)
        if log_file:
            with open(log_file, "a") as out:
                out.write(line)

    return log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--metadata-url", required=True, help="the metadata server's computeMetadata/v1 URL")
    parser.add_argument("--gcs-address", required=True, help="the head's GCS, HOST:PORT")
    parser.add_argument("--node-ip", required=True, help="this host's IP, as its Ray nodes report it")
    parser.add_argument("--deadline-s", type=float, required=True, help="seconds from notice to stop")
    parser.add_argument("--stop-marker", type=Path, required=True, help="written on the notice: start no Ray")
    parser.add_argument("--ray-cli", required=True, help="the `ray` command of Ray's venv")
    parser.add_argument("--log-file", help="also append log lines here")
    args = parser.parse_args(argv)
    log = logger(args.log_file)
    log(f"watching {PREEMPTED_KEY}")
    wait_for(TRUE, args.metadata_url, log)
    timeline = Timeline.from_notice(time.time(), args.deadline_s)
    log(f"preemption notice: {PREEMPTED_KEY} is {TRUE}; draining this host's Ray nodes")
    message = f"GCE preemption notice on {args.node_ip}: the VM stops within {args.deadline_s:.0f} s"
    gcs = RayGcs(args.gcs_address, args.node_ip, message)
    on_notice(
        gcs.drain_node,
        gcs.own_nodes,
        gcs.checkpointed,
        timeline,
        args.stop_marker,
        ray_stopper(args.ray_cli),
        log,
    )
    # Nothing more to do until the VM stops; a VM that survives (the notice withdrawn) starts Ray
    # again and watches again.
    wait_for(FALSE, args.metadata_url, log)
    args.stop_marker.unlink(missing_ok=True)
    log(f"{PREEMPTED_KEY} is {FALSE} again; Ray may start again")
    return 0


if __name__ == "__main__":
    sys.exit(main())
