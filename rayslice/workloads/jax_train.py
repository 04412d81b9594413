"""Data-parallel JAX training over every device of a TPU slice; reports loss, steps/s, samples/s, FLOP/s.

A small MLP regression (a random linear teacher plus noise, so the loss must fall) is trained with
optax Adam. Parameters are replicated, the batch is sharded over a 1-D `data` mesh of all devices
of the slice, and one jitted step runs on every host (launched like `jax_multihost`). Each host
makes its own share of the batch. Achieved FLOP/s comes from the compiled step's own
`cost_analysis()` (per device, so times the device count) and the measured step time; the first,
compiling step is left out of the timing.

With `--checkpoint-dir DIR` the parameters and optimizer state are saved with orbax-checkpoint
every `--checkpoint-every` steps (DIR is a `gs://` path on Cloud TPU, or any directory every host
shares), and a run that finds a checkpoint there resumes from its latest step, printing
`resumed from step K`, so a job resubmitted after a preemption continues its loss curve.

`train()` needs no Ray: `bench/train.py` runs it in one process on whatever devices JAX sees.

    python -m rayslice.workloads.jax_train [--steps N] [--batch-per-device B] [--hidden H]
        [--checkpoint-dir DIR] [--checkpoint-every K]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

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
    first_step: int = 0  # > 0 when resumed from a checkpoint: the step `losses[0]` belongs to

    @property
    def flops_per_s(self) -> float:
        return self.flops_per_step * self.steps_per_s

    def summary(self) -> str:
        """The line printed after the last step."""
        return (
            f"{self.devices} x {self.device_kind}, global batch {self.global_batch}: "
            f"{self.steps_per_s:.2f} steps/s, {self.samples_per_s:.0f} samples/s, "
            f"{self.flops_per_s / 1e9:.3f} GFLOP/s achieved "
            f"({self.flops_per_step / 1e6:.2f} MFLOP per step from {self.flops_source})"
        )


def step_line(step: int, loss: float) -> str:
    """The line both training loops report as each step ends."""
    return f"step {step:3d}  loss {loss:.5f}"


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


class Model(NamedTuple):
    """The MLP, its optimizer state and its jitted step, set up on every device JAX sees."""

    params: Any  # replicated over the `data` mesh
    opt_state: Any
    step: Any  # jitted (params, opt_state, x, y) -> (params, opt_state, loss); donates the first two
    global_batch: int
    batch: Callable[[Any], tuple[Any, Any]]  # a numpy Generator -> this process's share of (x, y)


def build_model(batch_per_device: int = 32, hidden: int = 256, seed: int = 0) -> Model:
    """The model both JAX training jobs train (jax_train's own loop, and jax_trainer's under Ray
    Train), on a 1-D `data` mesh of every device: the same seed everywhere, so every process
    builds the same teacher and the same initial parameters."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    batch_sharding = NamedSharding(mesh, PartitionSpec("data"))
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

    def batch(local_rng: Any) -> tuple[Any, Any]:
        x = local_rng.normal(size=(local_batch, FEATURES)).astype(np.float32)
        y = x @ teacher + 0.01 * local_rng.normal(size=(local_batch, 1)).astype(np.float32)
        return (
            jax.make_array_from_process_local_data(batch_sharding, x),
            jax.make_array_from_process_local_data(batch_sharding, y),
        )

    return Model(params, opt_state, step, batch_per_device * jax.device_count(), batch)


def train(
    steps: int = 30,
    batch_per_device: int = 32,
    hidden: int = 256,
    seed: int = 0,
    checkpoint_dir: str | None = None,
    checkpoint_every: int = 10,
    progress: Callable[[str], None] | None = None,
) -> TrainReport:
    """Train on every device JAX sees (all hosts' after `jax.distributed.initialize`).

    With `checkpoint_dir`, state is saved after every `checkpoint_every`-th step and at the end,
    and training starts after the latest saved step (every process must see the same directory).
    Process 0 reports each step's line as the step ends, to `progress` (a Ray job's driver shows
    them, `_cluster.Progress`), by default printed at once.
    """
    check_steps(steps)
    report = progress or _cluster.show_line
    import jax
    import numpy as np

    model = build_model(batch_per_device, hidden, seed)
    params, opt_state, step = model.params, model.opt_state, model.step

    manager = None
    start = 0
    if checkpoint_dir is not None:
        import orbax.checkpoint as ocp

        manager = ocp.CheckpointManager(
            checkpoint_dir,
            options=ocp.CheckpointManagerOptions(save_interval_steps=checkpoint_every, max_to_keep=2),
        )
        latest = manager.latest_step()
        if latest is not None:  # the saved step counts the steps done
            state = manager.restore(latest, args=ocp.args.StandardRestore((params, opt_state)))
            params, opt_state = state
            start = min(latest, steps)
            if jax.process_index() == 0:
                report(f"resumed from step {latest}")
    # Each host its own samples; a resumed run draws new ones rather than replaying the first.
    local_rng = np.random.default_rng([seed, jax.process_index(), start])

    def batch():
        return model.batch(local_rng)

    x, y = batch()
    costs = step.lower(params, opt_state, x, y).compile().cost_analysis()
    if not costs:
        raise RuntimeError("XLA gave no cost analysis for the training step")
    flops_per_device = costs["flops"]
    losses = []
    timed_from = time.perf_counter()
    for i in range(start, steps):
        if i == start + 1:  # the first step of this run compiled; time the rest
            timed_from = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, x, y)
        losses.append(float(loss))  # also waits for the step
        if jax.process_index() == 0:  # the loss is replicated: one line per step, not per host
            report(step_line(i, losses[-1]))
        if manager is not None:
            manager.save(i + 1, args=ocp.args.StandardSave((params, opt_state)), force=i + 1 == steps)
        x, y = batch()
    timed = len(losses) - 1
    steps_per_s = timed / (time.perf_counter() - timed_from) if timed > 0 else 0.0
    if manager is not None:
        manager.wait_until_finished()
        manager.close()
    return TrainReport(
        devices=jax.device_count(),
        device_kind=jax.devices()[0].device_kind,
        global_batch=model.global_batch,
        losses=tuple(losses),
        steps_per_s=steps_per_s,
        samples_per_s=steps_per_s * model.global_batch,
        flops_per_step=flops_per_device * jax.device_count(),
        flops_source="the compiled step's cost_analysis",
        first_step=start,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jax_train", description=__doc__.splitlines()[0])
    add_training_args(parser, "--batch-per-device", 32)
    parser.add_argument("--coordinator-port", type=int, default=names.JAX_COORDINATOR_PORT)
    parser.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="save and resume with orbax-checkpoint here (gs://... on Cloud TPU; shared by every host)",
    )
    parser.add_argument(
        "--checkpoint-every", type=_positive_int, default=10, metavar="K", help="save every K steps"
    )
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def run(args: argparse.Namespace) -> TrainReport:
    (tpu_slice,) = _cluster.choose_slices(
        1, slice_name=args.slice_name, accelerator_type=args.accelerator_type
    )
    print(f"slice {tpu_slice.describe()}", flush=True)
    progress = _cluster.Progress()
    job = functools.partial(
        train,
        args.steps,
        args.batch_per_device,
        args.hidden,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        progress=progress,
    )
    reports = _jax_hosts.run_on_hosts(
        job, [tpu_slice], coordinator_port=args.coordinator_port, timeout_s=args.timeout, progress=progress
    )
    report = reports[0].result  # every process computed the same replicated loss
    print(report.summary())
    return report


def main(argv: list[str] | None = None) -> int:
    return _cluster.run_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
