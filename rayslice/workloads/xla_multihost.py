"""PyTorch/XLA across hosts: one Ray task per TPU chip of the chosen slices, world size read from Ray.

The guide's multi-host device-centric example without its typed-in sizes: the number of tasks is
the chips of the chosen slices (every complete slice of one type by default, `--slice` for one),
the local world size is the chips per host Ray's TPU detection reported, and each task's local
rank is the chip Ray gave it (`TPU_VISIBLE_CHIPS`). On a TPU host each task then runs PJRT's
multi-process initialisation (`pjrt.initialize_multiprocess(local_rank, local_world_size)`), so
`xr.global_ordinal()` / `xr.world_size()` are the ranks PJRT reports. No collective runs across
the tasks: each prints a tensor on its own chip, as in the guide.

    python -m rayslice.workloads.xla_multihost [--slice NAME] [--accelerator-type TYPE]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import ray

from rayslice.workloads import _cluster


@dataclass(frozen=True)
class ChipReport:
    slice_name: str
    worker_id: int
    local_rank: int
    device: str
    xla_world_size: int
    xla_ordinal: int


@ray.remote(max_calls=1)  # a fresh process per chip: PJRT is initialised once per process
def print_tensor(slice_name: str, local_world_size: int) -> ChipReport:
    import torch
    import torch_xla
    import torch_xla.runtime as xr
    from torch_xla._internal import pjrt

    local_rank = int(ray.get_runtime_context().get_accelerator_ids()[_cluster.TPU_RESOURCE][0])
    pjrt.initialize_multiprocess(local_rank, local_world_size)
    xr._init_world_size_ordinal()
    t = torch.randn(2, 2, device=torch_xla.device())
    print(f"{t.device}\n{t}", flush=True)
    return ChipReport(
        slice_name,
        _cluster.current_worker_id(),
        local_rank,
        str(t.device),
        xr.world_size(),
        xr.global_ordinal(),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xla_multihost", description=__doc__.splitlines()[0])
    _cluster.add_slice_args(parser)
    return parser


def run(args: argparse.Namespace) -> list[ChipReport]:
    slices = _cluster.choose_slices(None, slice_name=args.slice_name, accelerator_type=args.accelerator_type)
    refs = [
        print_tensor.options(**_cluster.one_host_options(1, s)).remote(s.name, s.chips_per_host)
        for s in slices
        for _ in range(s.chips)
    ]
    print(f"{len(refs)} tasks, one per TPU chip of: {'; '.join(s.describe() for s in slices)}", flush=True)
    reports = _cluster.wait_ready(refs, args.timeout, f"{len(refs)} XLA tasks")
    reports.sort(key=lambda r: (r.slice_name, r.worker_id, r.local_rank))
    for r in reports:
        print(
            f"{r.slice_name} worker {r.worker_id} chip {r.local_rank}: {r.device} "
            f"(xla ordinal {r.xla_ordinal} of {r.xla_world_size})"
        )
    places = {(r.slice_name, r.worker_id, r.local_rank) for r in reports}
    print(f"{len(reports)} tasks on {len(places)} distinct chips")
    return reports


def main(argv: list[str] | None = None) -> int:
    return _cluster.run_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
