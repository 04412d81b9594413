"""Data-parallel JAX training over every device of a TPU slice; reports loss, steps/s, samples/s, FLOP/s.

An MLP regression (a random linear teacher plus noise, so the loss must fall) is trained with
optax Adam. Its size comes from the device kind: on CPU devices (the simulator) a small float32
model; on a TPU chip the catalog knows, `layers` layers of 8192 x 8192 with bf16 matrix products
and a batch large enough that the step is bound by the matrix units (`sizes_for`); the learning
rate shrinks with the width so that the loss falls at every width. `--hidden`, `--layers` and
`--batch-per-device` override it. Parameters are replicated, the batch is sharded over a 1-D
`data` mesh of all devices of the slice, and one jitted step runs on every host (launched like
`jax_multihost`). Each host
makes its own share of the batch. Achieved FLOP/s comes from the compiled step's own
`cost_analysis()` (per device, so times the device count) and the measured step time; the first,
compiling step is left out of the timing.

With `--checkpoint-dir DIR` the parameters and optimizer state are saved with orbax-checkpoint
every `--checkpoint-every` steps (DIR is a `gs://` path on Cloud TPU, or any directory every host
shares), and a run that finds a checkpoint there resumes from its latest step, printing
`resumed from step K`, so a job resubmitted after a preemption continues its loss curve.

`train()` needs no Ray: `bench/train.py` runs it in one process on whatever devices JAX sees.
`fit_step` is its entry point for `rayslice fit` (the step and its abstract arguments).

    python -m rayslice.workloads.jax_train [--steps N] [--batch-per-device B] [--hidden H]
        [--layers L] [--checkpoint-dir DIR] [--checkpoint-every K]
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from rayslice import catalog, names
from rayslice.workloads import _cluster, _jax_hosts

FEATURES = 64
MIN_STEPS = 2  # the first step compiles and is not timed
# Adam's step size at the CPU width and depth (one hidden layer). Wider layers take proportionally
# smaller steps (Adam moves every weight by about lr, so a layer's output by about lr x width),
# and deeper models smaller ones again (the layers' changes compound), so the loss falls at every
# size instead of jumping at the first step.
LEARNING_RATE = 3e-3
BASE_WIDTH = 256


@dataclass(frozen=True)
class Sizes:
    """How big the model and batch are, and in which precision its matrix products run."""

    hidden: int
    layers: int  # hidden x hidden layers between the input and the output layer
    batch_per_device: int
    bf16: bool  # matrix products in bf16 (parameters and Adam's state stay float32)
    lr: float | None = None  # None: the rule in `learning_rate`

    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return LEARNING_RATE * BASE_WIDTH / max(self.hidden, BASE_WIDTH) / self.layers

    def describe(self) -> str:
        precision = "bf16" if self.bf16 else "f32"
        return (
            f"hidden {self.hidden} x {self.layers} layers, batch {self.batch_per_device} per device, "
            f"{precision} matmuls, lr {self.learning_rate:.2e}"
        )


# On CPU devices (the simulator, a laptop): small, so a step takes milliseconds.
SMALL = Sizes(hidden=256, layers=1, batch_per_device=32, bf16=False)
# On a TPU chip: layers wide enough to fill the matrix units, in bf16; at most 8 of them, one per
# 2 GiB of the device's HBM (a layer's float32 weights, Adam's two moments and its gradient take
# 1 GiB; its activations about as much): a v2 TensorCore's 8 GiB takes 4.
CHIP_HIDDEN = 8192
CHIP_LAYERS = 8
CHIP_HBM_PER_LAYER = 2 * 2**30
# Per step, the matmuls do 6 x batch x hidden^2 FLOPs per layer, and Adam moves about 28 bytes per
# parameter (read p, m, v, g; write p, m, v in float32): with the batch at 64 x the chip's FLOPs
# per HBM byte (to the nearest power of two), the matmuls outlast Adam's memory traffic about 14
# to 1. On one v5e chip that is 8 layers at batch 16384: 10.5 GiB of its 15.75 (`rayslice fit`).
CHIP_BATCH_PER_FLOP_PER_BYTE = 64


def sizes_for(
    device_kind: str,
    hidden: int | None = None,
    layers: int | None = None,
    batch_per_device: int | None = None,
    learning_rate: float | None = None,
) -> Sizes:
    """The sizes for devices of this kind (`jax.Device.device_kind`), with the given ones kept:
    a TPU chip the catalog knows gets sizes bound by its matrix units, anything else `SMALL`."""
    peak = catalog.device_peak_flops(device_kind)
    bandwidth = catalog.device_hbm_bytes_per_s(device_kind)
    hbm = catalog.device_hbm_bytes(device_kind)
    if peak is None or bandwidth is None or hbm is None:
        base = SMALL
    else:
        batch = 1 << round(math.log2(CHIP_BATCH_PER_FLOP_PER_BYTE * peak / bandwidth))
        layers = min(CHIP_LAYERS, hbm // CHIP_HBM_PER_LAYER)
        base = Sizes(hidden=CHIP_HIDDEN, layers=layers, batch_per_device=batch, bf16=True)
    return Sizes(
        hidden=base.hidden if hidden is None else hidden,
        layers=base.layers if layers is None else layers,
        batch_per_device=base.batch_per_device if batch_per_device is None else batch_per_device,
        bf16=base.bf16,
        lr=learning_rate,
    )


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
    sizes: Sizes = SMALL

    @property
    def flops_per_s(self) -> float:
        return self.flops_per_step * self.steps_per_s

    @property
    def peak_flops(self) -> float | None:
        """The devices' dense bf16 peak together, from the catalog; None where it is unknown."""
        peak = catalog.device_peak_flops(self.device_kind)
        return None if peak is None else peak * self.devices

    def summary(self) -> str:
        """The lines printed after the last step."""
        peak = self.peak_flops
        of_peak = (
            f"{self.flops_per_s / peak:.1%} of the chips' bf16 peak ({peak / 1e12:.0f} TFLOP/s)"
            if peak is not None
            else f"peak unknown for device kind {self.device_kind!r}"
        )
        return (
            f"{self.devices} x {self.device_kind}, {self.sizes.describe()}, global batch "
            f"{self.global_batch}: {self.steps_per_s:.2f} steps/s, {self.samples_per_s:.0f} samples/s, "
            f"{self.flops_per_s / 1e9:.3f} GFLOP/s achieved, {of_peak} "
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


def add_training_args(
    parser: argparse.ArgumentParser,
    batch_flag: str,
    batch_default: int | None,
    hidden_default: int | None = 256,
    size_help: str = "",
) -> None:
    """The options jax_train and xla_train share (slice choice, steps, model size) plus a batch flag."""
    _cluster.add_slice_args(parser)
    parser.add_argument("--steps", type=_steps_arg, default=30)
    parser.add_argument(batch_flag, type=int, default=batch_default, help=size_help)
    parser.add_argument("--hidden", type=int, default=hidden_default, help=size_help)


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
    sizes: Sizes


def param_shapes(sizes: Sizes) -> dict[str, Any]:
    """Each parameter's shape: the input layer, `layers` square ones, the output layer."""
    return {
        "w_in": (FEATURES, sizes.hidden),
        "hidden": [(sizes.hidden, sizes.hidden)] * sizes.layers,
        "w_out": (sizes.hidden, 1),
    }


def make_step(sizes: Sizes) -> tuple[Any, Any]:
    """The optimizer and the jitted training step for these sizes (the same for a real run and for
    `rayslice fit`, which compiles it for a topology without running it)."""
    import jax
    import jax.numpy as jnp
    import optax

    compute = jnp.bfloat16 if sizes.bf16 else jnp.float32
    optimizer = optax.adam(sizes.learning_rate)

    def loss_fn(p, x, y):
        h = jax.nn.relu(x.astype(compute) @ p["w_in"].astype(compute))
        for w in p["hidden"]:
            h = jax.nn.relu(h @ w.astype(compute))
        out = (h @ p["w_out"].astype(compute)).astype(jnp.float32)
        return jnp.mean((out - y) ** 2)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(p, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    return optimizer, step


def _mesh(devices: Sequence[Any]) -> tuple[Any, Any]:
    """Replicated and batch shardings over a 1-D `data` mesh of `devices`; over several slices
    (what `rayslice fit` compiles for a multislice stack) the axis runs over ICI within each
    slice and over DCN between them."""
    import jax
    from jax.experimental import mesh_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    slices = len({getattr(d, "slice_index", 0) for d in devices})
    if slices > 1:
        order = mesh_utils.create_hybrid_device_mesh((len(devices) // slices,), (slices,), list(devices))
        mesh = Mesh(order, ("data",))
    else:
        mesh = jax.make_mesh((len(devices),), ("data",), devices=list(devices))
    return NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("data"))


def build_model(
    batch_per_device: int | None = None,
    hidden: int | None = None,
    seed: int = 0,
    layers: int | None = None,
    learning_rate: float | None = None,
) -> Model:
    """The model both JAX training jobs train (jax_train's own loop, and jax_trainer's under Ray
    Train), on a 1-D `data` mesh of every device: the same seed everywhere, so every process
    builds the same teacher and the same initial parameters. Sizes not given come from the
    device kind (`sizes_for`)."""
    import jax
    import numpy as np

    sizes = sizes_for(jax.devices()[0].device_kind, hidden, layers, batch_per_device, learning_rate)
    replicated, batch_sharding = _mesh(jax.devices())
    local_batch = sizes.batch_per_device * jax.local_device_count()
    x_dtype = "bfloat16" if sizes.bf16 else np.float32

    rng = np.random.default_rng(seed)  # same seed everywhere: the teacher and the init agree
    teacher = rng.normal(scale=FEATURES**-0.5, size=(FEATURES, 1)).astype(np.float32)
    params = jax.tree.map(
        lambda shape: rng.normal(scale=shape[0] ** -0.5, size=shape).astype(np.float32),
        param_shapes(sizes),
        is_leaf=lambda leaf: isinstance(leaf, tuple),
    )
    optimizer, step = make_step(sizes)
    params = jax.device_put(params, replicated)
    opt_state = jax.device_put(optimizer.init(params), replicated)

    def batch(local_rng: Any) -> tuple[Any, Any]:
        x = local_rng.normal(size=(local_batch, FEATURES)).astype(np.float32)
        y = x @ teacher + 0.01 * local_rng.normal(size=(local_batch, 1)).astype(np.float32)
        return (
            jax.make_array_from_process_local_data(batch_sharding, x.astype(x_dtype)),
            jax.make_array_from_process_local_data(batch_sharding, y),
        )

    return Model(params, opt_state, step, sizes.batch_per_device * jax.device_count(), batch, sizes)


def fit_step(devices: Sequence[Any], argv: Sequence[str]) -> tuple[Any, tuple[Any, ...]]:
    """`rayslice fit`'s entry point: the training step and its abstract arguments, sharded over
    `devices` (a topology's, which need not be attached), for the sizes jax_train would pick
    there with these command-line arguments."""
    import jax
    import jax.numpy as jnp

    args = build_parser().parse_args(list(argv))
    sizes = sizes_for(
        devices[0].device_kind, args.hidden, args.layers, args.batch_per_device, args.learning_rate
    )
    replicated, batch_sharding = _mesh(devices)
    optimizer, step = make_step(sizes)
    params = jax.tree.map(
        lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=replicated),
        param_shapes(sizes),
        is_leaf=lambda leaf: isinstance(leaf, tuple),
    )
    opt_state = jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated),
        jax.eval_shape(optimizer.init, params),
    )
    batch = sizes.batch_per_device * len(devices)
    x = jax.ShapeDtypeStruct(
        (batch, FEATURES), jnp.bfloat16 if sizes.bf16 else jnp.float32, sharding=batch_sharding
    )
    y = jax.ShapeDtypeStruct((batch, 1), jnp.float32, sharding=batch_sharding)
    return step, (params, opt_state, x, y)


def train(
    steps: int = 30,
    batch_per_device: int | None = None,
    hidden: int | None = None,
    seed: int = 0,
    checkpoint_dir: str | None = None,
    checkpoint_every: int = 10,
    progress: Callable[[str], None] | None = None,
    layers: int | None = None,
    learning_rate: float | None = None,
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

    model = build_model(batch_per_device, hidden, seed, layers, learning_rate)
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
        sizes=model.sizes,
    )


SIZE_HELP = "default: from the device kind (small on CPU devices, bound by the matrix units on a TPU chip)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jax_train", description=__doc__.splitlines()[0])
    add_training_args(
        parser,
        "--batch-per-device",
        None,
        hidden_default=None,
        size_help=SIZE_HELP,
    )
    parser.add_argument("--layers", type=_positive_int, help=SIZE_HELP)
    parser.add_argument(
        "--learning-rate", type=float, help="Adam's step size (default: 3e-3 x 256 / hidden / layers)"
    )
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
        layers=args.layers,
        learning_rate=args.learning_rate,
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
