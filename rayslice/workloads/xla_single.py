"""PyTorch/XLA on one TPU chip: a task holding one chip puts a tensor on the XLA device and prints it.

The guide's first device-centric example, scheduled by Ray on a chip of the chosen slice
(`{"TPU": 1}`); the device is `xla:0`.

Needs torch and torch_xla on the hosts (`pip install -e '.[xla]'`).

    python -m rayslice.workloads.xla_single [--slice NAME] [--accelerator-type TYPE]
"""

from __future__ import annotations

import argparse
import sys

import ray

from rayslice.workloads import _cluster


@ray.remote(max_calls=1)  # a fresh process: the PJRT client is made once per process
def tensor_on_device() -> tuple[str, str]:
    import torch
    import torch_xla

    t = torch.randn(2, 2, device=torch_xla.device())
    return str(t.device), str(t)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xla_single", description=__doc__.splitlines()[0])
    _cluster.add_slice_args(parser)
    return parser


def run(args: argparse.Namespace) -> tuple[str, str]:
    (tpu_slice,) = _cluster.choose_slices(
        1, slice_name=args.slice_name, accelerator_type=args.accelerator_type
    )
    task = tensor_on_device.options(**_cluster.one_host_options(1, tpu_slice))
    ((device, tensor),) = _cluster.wait_ready([task.remote()], args.timeout, "the XLA task")
    print(device)
    print(tensor)
    return device, tensor


def main(argv: list[str] | None = None) -> int:
    return _cluster.run_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
