"""One JAX program over every host of a TPU slice; prints the global device count seen per host.

The guide's host-centric example: one Ray task per host, all started together through a slice
placement group, each calling `jax.distributed.initialize` (coordinator on TPU worker 0, process id
= the host's TPU worker id from its `ray.io/tpu-worker-id` label). Every host then sees every chip
of the slice, so a v6e-16 (4 hosts x 4 chips) prints `[16, 16, 16, 16]`.

    python -m rayslice.workloads.jax_multihost [--slice NAME] [--accelerator-type TYPE]
"""

from __future__ import annotations

import argparse
import sys

from rayslice import names
from rayslice.workloads import _cluster, _jax_hosts


def global_device_count() -> int:
    import jax

    return jax.device_count()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jax_multihost", description=__doc__.splitlines()[0])
    _cluster.add_slice_args(parser)
    parser.add_argument("--coordinator-port", type=int, default=names.JAX_COORDINATOR_PORT)
    return parser


def run(args: argparse.Namespace) -> list[int]:
    (tpu_slice,) = _cluster.choose_slices(
        1, slice_name=args.slice_name, accelerator_type=args.accelerator_type
    )
    print(f"slice {tpu_slice.describe()}", flush=True)
    reports = _jax_hosts.run_on_hosts(
        global_device_count, [tpu_slice], coordinator_port=args.coordinator_port, timeout_s=args.timeout
    )
    counts = [r.result for r in reports]
    print(counts)
    return counts


def main(argv: list[str] | None = None) -> int:
    return _cluster.run_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
