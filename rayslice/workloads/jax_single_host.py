"""JAX on one TPU host: a task holding every chip of one host returns `jax.device_count()`.

The guide's single-host example, scheduled by Ray: the task asks for the host's chips
(`{"TPU": N}`, N read from the cluster, or `--chips`) on a host of the chosen slice, so a v6e-4
prints 4. Asking for more chips than a host has is refused up front (Ray would wait forever), and
so is a whole host of a multi-host slice, where JAX would wait for the other hosts forever: a
single-host slice is chosen when the cluster has one, and `jax_multihost` is the job for the rest.

    python -m rayslice.workloads.jax_single_host [--chips N] [--slice NAME] [--accelerator-type TYPE]
"""

from __future__ import annotations

import argparse
import sys

import ray

from rayslice.workloads import _cluster

# The job to run instead on a multi-host slice; its presence marks this job as single-host, for
# `rayslice run` too, which reads it without importing this module (`rayslice.jobs.upload`).
MULTIHOST_COUNTERPART = "jax_multihost"


@ray.remote(max_calls=1)  # a fresh process: JAX holds its chips until the process ends
def device_count() -> int:
    import jax

    return jax.device_count()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jax_single_host", description=__doc__.splitlines()[0])
    _cluster.add_slice_args(parser)
    _cluster.add_chips_arg(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    tpu_slice = _cluster.choose_single_host_slice(
        "jax_single_host",
        MULTIHOST_COUNTERPART,
        chips=args.chips,
        slice_name=args.slice_name,
        accelerator_type=args.accelerator_type,
    )
    chips = tpu_slice.chips_per_host if args.chips is None else args.chips
    task = device_count.options(**_cluster.one_host_options(chips, tpu_slice))
    (count,) = _cluster.wait_ready([task.remote()], args.timeout, "the JAX task")
    print(f"{chips} chip(s) of a {tpu_slice.pod_type} host: jax.device_count() = {count}")
    print(count)
    return count


def main(argv: list[str] | None = None) -> int:
    return _cluster.run_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
