"""A PyTorch/XLA training loop on one XLA device; reports loss, steps/s, samples/s and FLOP/s.

The device-centric counterpart of `jax_train`: the same MLP regression (a random linear teacher
plus noise) trained with `torch.optim.Adam` on the task's XLA device, one `torch_xla.sync()` per
step. FLOPs per step are counted by `torch.utils.flop_counter.FlopCounterMode` on one forward and
backward pass (the optimizer's element-wise work is left out), and the first step, which
compiles, is left out of the timing. The report is `jax_train.TrainReport`.

One chip only: data parallelism across torch_xla processes needs cross-process collectives,
which this job does not need (see xla_multihost).

    python -m rayslice.workloads.xla_train [--steps N] [--batch B] [--hidden H]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import ray

from rayslice.workloads import _cluster
from rayslice.workloads.jax_train import (
    FEATURES,
    LEARNING_RATE,
    TrainReport,
    add_training_args,
    check_steps,
    step_line,
)


def train(
    steps: int = 30,
    batch: int = 128,
    hidden: int = 256,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> TrainReport:
    """Train on this process's XLA device, reporting each step's line to `progress` as the step
    ends (by default printed at once)."""
    check_steps(steps)
    report = progress or _cluster.show_line
    import torch
    import torch_xla
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(seed)
    device = torch_xla.device()
    teacher = torch.randn(FEATURES, 1) * FEATURES**-0.5
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, hidden, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1, bias=False),
    )

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch, FEATURES)
        return x, x @ teacher + 0.01 * torch.randn(batch, 1)

    x, y = make_batch()
    with FlopCounterMode(display=False) as counter:  # on CPU, before the model moves
        torch.nn.functional.mse_loss(model(x), y).backward()
    model.zero_grad()
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    losses = []
    for i in range(steps):
        if i == 1:  # step 0 compiled; time the rest
            start = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        losses.append(loss.item())  # also waits for the step
        report(step_line(i, losses[-1]))
        x, y = make_batch()
    steps_per_s = (steps - 1) / (time.perf_counter() - start)
    return TrainReport(
        devices=1,
        device_kind=str(device),
        global_batch=batch,
        losses=tuple(losses),
        steps_per_s=steps_per_s,
        samples_per_s=steps_per_s * batch,
        flops_per_step=float(counter.get_total_flops()),
        flops_source="FlopCounterMode, forward + backward",
    )


@ray.remote(max_calls=1)  # a fresh process: the PJRT client is made once per process
def train_on_chip(steps: int, batch: int, hidden: int, progress: _cluster.Progress) -> TrainReport:
    return train(steps, batch, hidden, progress=progress)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xla_train", description=__doc__.splitlines()[0])
    add_training_args(parser, "--batch", 128)
    return parser


def run(args: argparse.Namespace) -> TrainReport:
    (tpu_slice,) = _cluster.choose_slices(
        1, slice_name=args.slice_name, accelerator_type=args.accelerator_type
    )
    task = train_on_chip.options(**_cluster.one_host_options(1, tpu_slice))
    progress = _cluster.Progress()
    (report,) = _cluster.wait_ready(
        [task.remote(args.steps, args.batch, args.hidden, progress)],
        args.timeout,
        "the torch_xla training task",
        progress,
    )
    print(report.summary())
    return report


def main(argv: list[str] | None = None) -> int:
    return _cluster.run_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
