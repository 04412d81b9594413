"""PyTorch/XLA on every chip of one host: `torch_xla.launch` runs one process per local device.

The guide's second device-centric example, in one Ray task that holds all chips of a host of the
chosen slice. Each launched function prints its device and a tensor, and returns nothing (as in
the guide); the task reports how many devices ran it. A whole host of a multi-host slice would
wait for the slice's other hosts, so the job takes a single-host slice and refuses the rest
(`xla_multihost` runs on every chip of a multi-host slice).

    python -m rayslice.workloads.xla_multi_device [--slice NAME] [--accelerator-type TYPE]
"""

from __future__ import annotations

import argparse
import sys

import ray

from rayslice.workloads import _cluster

# The job to run instead on a multi-host slice; its presence marks this job as single-host, for
# `rayslice run` too, which reads it without importing this module (`rayslice.jobs.upload`).
MULTIHOST_COUNTERPART = "xla_multihost"


def print_on_device(index: int) -> None:
    import torch
    import torch_xla

    t = torch.randn(2, 2, device=torch_xla.device())
    print(f"[{index}] {t.device}\n{t}", flush=True)


@ray.remote(max_calls=1)  # a fresh process: the PJRT client is made once per process
def launch_on_host() -> int:
    import torch_xla
    import torch_xla.runtime as xr

    # launch() pickles the function by reference: name it through its module, never `__main__`
    from rayslice.workloads import xla_multi_device

    torch_xla.launch(xla_multi_device.print_on_device, args=())
    return xr.global_runtime_device_count()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xla_multi_device", description=__doc__.splitlines()[0])
    _cluster.add_slice_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    tpu_slice = _cluster.choose_single_host_slice(
        "xla_multi_device",
        MULTIHOST_COUNTERPART,
        slice_name=args.slice_name,
        accelerator_type=args.accelerator_type,
    )
    chips = tpu_slice.chips_per_host
    task = launch_on_host.options(**_cluster.one_host_options(chips, tpu_slice))
    (devices,) = _cluster.wait_ready([task.remote()], args.timeout, "torch_xla.launch")
    print(f"torch_xla.launch ran on {devices} device(s) of one {tpu_slice.pod_type} host")
    return devices


def main(argv: list[str] | None = None) -> int:
    return _cluster.run_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
