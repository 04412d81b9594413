"""One JAX program across several TPU slices (multislice); each host reports its slice and process id.

The guide's multi-host example stretched over slices: every host of every chosen slice runs one
task, all started together; each slice's tasks get `MEGASCALE_COORDINATOR_ADDRESS`,
`MEGASCALE_NUM_SLICES`, `MEGASCALE_SLICE_ID` and `MEGASCALE_PORT` from the live cluster, and all
processes join one `jax.distributed` system (process id = slice id x hosts per slice + worker id).
2 x v6e-16 gives 2 slice ids, 8 process ids and 32 global devices.

    python -m rayslice.workloads.jax_multislice [--slices N] [--accelerator-type TYPE]
"""

from __future__ import annotations

import argparse
import os
import sys

from rayslice import names
from rayslice.workloads import _cluster, _jax_hosts


def host_view() -> dict[str, object]:
    import jax

    return {
        "megascale_slice_id": os.environ.get("MEGASCALE_SLICE_ID"),
        "megascale_num_slices": os.environ.get("MEGASCALE_NUM_SLICES"),
        "jax_process_index": jax.process_index(),
        "device_count": jax.device_count(),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jax_multislice", description=__doc__.splitlines()[0])
    _cluster.add_slice_args(parser)
    parser.add_argument(
        "--slices", type=int, help="number of slices (default: every complete slice of the chosen type)"
    )
    parser.add_argument("--coordinator-port", type=int, default=names.JAX_COORDINATOR_PORT)
    return parser


def run(args: argparse.Namespace) -> list[_jax_hosts.HostReport]:
    slices = _cluster.choose_slices(
        args.slices, slice_name=args.slice_name, accelerator_type=args.accelerator_type
    )
    for tpu_slice in slices:
        print(f"slice {tpu_slice.describe()}", flush=True)
    reports = _jax_hosts.run_on_hosts(
        host_view, slices, coordinator_port=args.coordinator_port, timeout_s=args.timeout
    )
    for r in reports:
        print(
            f"slice_id={r.slice_id} slice={r.slice_name} worker={r.worker_id} "
            f"process_id={r.result['jax_process_index']} devices={r.result['device_count']} "
            f"MEGASCALE_SLICE_ID={r.result['megascale_slice_id']}"
        )
    process_ids = {r.result["jax_process_index"] for r in reports}
    print(f"{len({r.slice_id for r in reports})} slice ids, {len(process_ids)} process ids")
    return reports


def main(argv: list[str] | None = None) -> int:
    return _cluster.run_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
