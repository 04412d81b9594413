"""Run one function on every host of one or more TPU slices as ONE multi-process JAX program.

This is the host-centric mode of the guide: one Ray task per host holding all of its chips,
every task started together (a slice placement group pinned to the chosen slices), each calling
`jax.distributed.initialize` with the coordinator on worker 0 of the first slice. The process id
is `slice index x hosts per slice + TPU worker id` (what JAX's own Cloud TPU detection computes
for multislice), the worker id read from the host's `ray.io/tpu-worker-id` label.

With more than one slice, each slice's tasks also get `MEGASCALE_COORDINATOR_ADDRESS`,
`MEGASCALE_NUM_SLICES`, `MEGASCALE_SLICE_ID` and `MEGASCALE_PORT` from the live cluster
(`ray.util.tpu.get_tpu_coordinator_env_vars`), which libtpu uses for the data-centre network
between slices.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
import ray.util.tpu

from rayslice import names
from rayslice.workloads import _cluster
from rayslice.workloads._cluster import TpuSlice

PG_READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class HostReport:
    """What one host's task returns: where it ran, its JAX process id, and `fn`'s result."""

    slice_name: str
    slice_id: int
    worker_id: int
    process_id: int
    result: Any


# A fresh process per task: jax.distributed and the chips are per process. No retry: one host's
# task started again cannot rejoin a JAX program that is already running; the job must fail and be
# submitted again whole (`rayslice run --max-restarts`).
@ray.remote(max_calls=1, max_retries=0)
def _host_task(
    fn: Callable[[], Any],
    env: dict[str, str],
    slice_name: str,
    slice_id: int,
    hosts_per_slice: int,
    num_processes: int,
    coordinator: str,
) -> HostReport:
    os.environ.update(env)
    import jax

    worker_id = _cluster.current_worker_id()
    process_id = slice_id * hosts_per_slice + worker_id
    if num_processes > 1:
        jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)
    try:
        result = fn()
    finally:
        if num_processes > 1:
            jax.distributed.shutdown()
    return HostReport(slice_name, slice_id, worker_id, process_id, result)


def megascale_env(slices: Sequence[TpuSlice], slice_id: int) -> dict[str, str]:
    """The MEGASCALE_* variables for one slice of a multislice job; none for a single slice."""
    if len(slices) == 1:
        return {}
    return ray.util.tpu.get_tpu_coordinator_env_vars(
        coordinator_address=slices[0].hosts[0].ip, num_slices=len(slices), slice_id=slice_id
    )


def run_on_hosts(
    fn: Callable[[], Any],
    slices: Sequence[TpuSlice],
    *,
    coordinator_port: int = names.JAX_COORDINATOR_PORT,
    timeout_s: float = 600.0,
    progress: _cluster.Progress | None = None,
) -> list[HostReport]:
    """Run `fn` on every host of `slices` (all of one type) in one JAX program; reports by process
    id. What `fn` reports to `progress` is shown while the program runs."""
    first = slices[0]
    hosts = len(first.hosts)
    handle = ray.util.tpu.slice_placement_group(
        topology=first.topology,
        accelerator_version=first.generation,
        num_slices=len(slices),
        chips_per_vm=first.chips_per_host,
        pg_per_slice=True,
        # Pin the bundles to the slices chosen from the cluster, so Ray does not pick others.
        bundle_label_selector=[{names.SLICE_NAME_LABEL: s.name} for s in slices for _ in s.hosts],
    )
    try:
        _cluster.wait_ready(
            [pg.ready() for pg in handle.slice_placement_groups],
            PG_READY_TIMEOUT_S,
            "reserving the TPU hosts",
        )
        refs = []
        for slice_id, tpu_slice in enumerate(slices):
            refs += ray.util.tpu.run_on_slice(
                _host_task,
                fn,
                megascale_env(slices, slice_id),
                tpu_slice.name,
                slice_id,
                hosts,
                hosts * len(slices),
                f"{first.hosts[0].ip}:{coordinator_port}",
                tpu_slice=handle,
                slice_index=slice_id,
            )
        reports = _cluster.wait_ready(refs, timeout_s, f"the JAX program on {len(refs)} hosts", progress)
    finally:
        handle.shutdown()
    return sorted(reports, key=lambda r: r.process_id)
