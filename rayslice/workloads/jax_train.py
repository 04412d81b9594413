"""Data-parallel JAX training over every device of a TPU slice; reports loss, steps/s, samples/s, FLOP/s.

A small MLP regression (a random linear teacher plus noise, so the loss must fall) is trained with
optax Adam. Parameters are replicated, the batch is sharded over a 1-D `data` mesh of all devices
of the slice, and one jitted step runs on every host (launched like `jax_multihost`). Each host
makes its own share of the batch. Achieved FLOP/s comes from the compiled step's own
`cost_analysis()` (per device, so times the device count) and the measured step time; the first,
compiling step is left out of the timing.

`train()` needs no Ray: `bench/train.py` runs it in one process on whatever devices JAX sees.

    python -m rayslice.workloads.jax_train [--steps N] [--batch-per-device B] [--hidden H]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from dataclasses import dataclass

from rayslice import names
from rayslice.workloads import _cluster, _jax_hosts

FEATURES = 64
LEARNING_RATE = 3e-3
MIN_STEPS = 2  # the first step compiles and is not timed


@dataclass(frozen=True)
class TrainReport:
    """One run's figures; `flops_per_step` counts every device."""

    devices: int
    device_kind: str
    global_batch: int
    losses: tuple[float, ...]
    steps_per_s: float
    samples_per_s: float
    flops_per_step: float
    flops_source: str  # what counted the FLOPs

    @property
    def flops_per_s(self) -> float:
        return self.flops_per_step * self.steps_per_s

    def lines(self) -> list[str]:
        return [
            *(f"step {i:3d}  loss {loss:.5f}" for i, loss in enumerate(self.losses)),
            f"{self.devices} x {self.device_kind}, global batch {self.global_batch}: "
            f"{self.steps_per_s:.2f} steps/s, {self.samples_per_s:.0f} samples/s, "
            f"{self.flops_per_s / 1e9:.3f} GFLOP/s achieved "
            f"({self.flops_per_step / 1e6:.2f} MFLOP per step from {self.flops_source})",
        ]


def check_steps(steps: int) -> int:
    """Both training loops time every step after the first, which compiles."""
    if steps < MIN_STEPS:
        raise ValueError(f"steps must be at least {MIN_STEPS}: the first step compiles and is not timed")
    return steps


def add_training_args(parser: argparse.ArgumentParser, batch_flag: str, batch_default: int) -> None:
    """The options jax_train and xla_train share (slice choice, steps, model size) plus a batch flag."""
    _cluster.add_slice_args(parser)
    parser.add_argument("--steps", type=_steps_arg, default=30)
    parser.add_argument(batch_flag, type=int, default=batch_default)
    parser.add_argument("--hidden", type=int, default=256)


def _steps_arg(text: str) -> int:
    try:
        return check_steps(int(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def train(steps: int = 30, batch_per_device: int = 32, hidden: int = 256, seed: int = 0) -> TrainReport:
    """Train on every device JAX sees (all hosts' after `jax.distributed.initialize`)."""
    check_steps(steps)
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    batch_sharding = NamedSharding(mesh, PartitionSpec("data"))
    global_batch = batch_per_device * jax.device_count()
    local_batch = batch_per_device * jax.local_device_count()

    rng = np.random.default_rng(seed)  # same seed everywhere: the teacher and the init agree
    teacher = rng.normal(scale=FEATURES**-0.5, size=(FEATURES, 1)).astype(np.float32)
    params = {
        "w1": rng.normal(scale=FEATURES**-0.5, size=(FEATURES, hidden)).astype(np.float32),
        "w2": rng.normal(scale=hidden**-0.5, size=(hidden, hidden)).astype(np.float32),
        "w3": rng.normal(scale=hidden**-0.5, size=(hidden, 1)).astype(np.float32),
    }
    params = jax.device_put(params, replicated)
    optimizer = optax.adam(LEARNING_RATE)
    opt_state = jax.device_put(optimizer.init(params), replicated)

    def loss_fn(p, x, y):
        h = jax.nn.relu(x @ p["w1"])
        h = jax.nn.relu(h @ p["w2"])
        return jnp.mean((h @ p["w3"] - y) ** 2)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(p, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    local_rng = np.random.default_rng([seed, jax.process_index()])  # each host its own samples

    def batch():
        x = local_rng.normal(size=(local_batch, FEATURES)).astype(np.float32)
        y = x @ teacher + 0.01 * local_rng.normal(size=(local_batch, 1)).astype(np.float32)
        return (
            jax.make_array_from_process_local_data(batch_sharding, x),
            jax.make_array_from_process_local_data(batch_sharding, y),
        )

    x, y = batch()
    flops_per_device = step.lower(params, opt_state, x, y).compile().cost_analysis()["flops"]
    losses = []
    for i in range(steps):
        if i == 1:  # step 0 compiled; time the rest
            start = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, x, y)
        losses.append(float(loss))  # also waits for the step
        x, y = batch()
    steps_per_s = (steps - 1) / (time.perf_counter() - start)
    return TrainReport(
        devices=jax.device_count(),
        device_kind=jax.devices()[0].device_kind,
        global_batch=global_batch,
        losses=tuple(losses),
        steps_per_s=steps_per_s,
        samples_per_s=steps_per_s * global_batch,
        flops_per_step=flops_per_device * jax.device_count(),
        flops_source="the compiled step's cost_analysis",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jax_train", description=__doc__.splitlines()[0])
    add_training_args(parser, "--batch-per-device", 32)
    parser.add_argument("--coordinator-port", type=int, default=names.JAX_COORDINATOR_PORT)
    return parser


def run(args: argparse.Namespace) -> TrainReport:
    (tpu_slice,) = _cluster.choose_slices(
        1, slice_name=args.slice_name, accelerator_type=args.accelerator_type
    )
    print(f"slice {tpu_slice.describe()}", flush=True)
    job = functools.partial(train, args.steps, args.batch_per_device, args.hidden)
    reports = _jax_hosts.run_on_hosts(
        job, [tpu_slice], coordinator_port=args.coordinator_port, timeout_s=args.timeout
    )
    report = reports[0].result  # every process computed the same replicated loss
    print("\n".join(report.lines()))
    return report


def main(argv: list[str] | None = None) -> int:
    return _cluster.run_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
