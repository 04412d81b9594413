"""Refusing, before anything is uploaded, a bundled job the cluster cannot run.

A single-host job (one whose module sets `MULTIHOST_COUNTERPART`, read by `upload.workloads`)
holding a whole host of a multi-host slice would wait for the slice's other hosts until its
timeout, ten minutes later. `rayslice run` reads the cluster's nodes from the dashboard and asks
the rule the job itself applies on the cluster (`_cluster.choose_single_host_slice`), with the
slice and chip options the job will parse, so a refusal comes at once, with exit 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rayslice.jobs import restarts
from rayslice.jobs.connection import Target
from rayslice.jobs.upload import Job


def check(job: Job, job_args: Sequence[str], target: Target) -> None:
    """Raise `InvalidInput` (or `NoCluster`) where the job would refuse the cluster itself."""
    if job.workload is None or job.multihost_counterpart is None:
        return
    from rayslice.workloads import _cluster  # imports ray, which `rayslice run --list` never needs

    # Only the options the rule reads, spelled out in full; anything else is the job's to parse.
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    _cluster.add_slice_args(parser)
    _cluster.add_chips_arg(parser)
    try:
        args, _ = parser.parse_known_args(list(job_args))
    except argparse.ArgumentError:
        return  # a malformed option: the job prints its own usage error
    nodes = restarts.read_nodes(target)
    _cluster.choose_single_host_slice(
        job.workload,
        job.multihost_counterpart,
        chips=args.chips,
        slice_name=args.slice_name,
        accelerator_type=args.accelerator_type,
        slices=_cluster.tpu_slices(_cluster.tpu_hosts(nodes)),
    )
