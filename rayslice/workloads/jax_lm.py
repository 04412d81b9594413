"""A decoder-only transformer language model trained over a TPU slice; reports tokens/s, MFU and loss.

The model is the shape people train on TPU slices (Llama's): RMSNorm before each block, rotary
positions, grouped-query attention, a SwiGLU MLP, no biases, separate input and output
embeddings. Its matrix products run in bf16 while the parameters and AdamW's moments stay
float32. The layers are one `lax.scan` over stacked weights, rematerialised by a policy
(`--remat`): `dots` keeps every projection's output and the attention kernel's residuals and
recomputes the cheap elementwise work, `full` recomputes everything, `none` keeps everything.

Sharding: a mesh of (`data`, `fsdp`, `tensor`) axes. `tensor` (`--tensor-parallel`, default 1)
splits the heads and the MLP's width within a slice; `fsdp` takes the rest of a slice's devices
and shards both the batch and every weight (each weight is gathered where it is used); `data`
runs over the slices of a multislice job, across the data-centre network, as jax_train's does.
Heads that do not divide by the tensor-parallel degree, or a batch that does not divide by the
data-parallel degree (`data` x `fsdp`), are refused with one line before anything runs.

Attention on TPU devices is Pallas' splash attention kernel
(`jax.experimental.pallas.ops.tpu.splash_attention`, causal, grouped heads native); elsewhere a
reference attention in plain JAX. Training text is the Python standard library's sources on
every host, as bytes (`_lm_data`): a 256-symbol vocabulary, real text, nothing to download.

MFU counts the model's FLOPs as MaxText does (`calculate_tflops_training_per_device` in
AI-Hypercomputer/maxtext's maxtext_utils.py): 3 x (forward FLOPs of every weight matrix: QKV, the
output projection, the MLP's three, the output embedding) plus 3 x the causal half of the
attention products (4 x batch x seq^2 x heads x head_dim / 2 per layer), over the step's time
and the chips' bf16 peak from the catalog.

With `--checkpoint-dir DIR`, parameters and optimizer state are saved with orbax-checkpoint every
`--checkpoint-every` steps; a run that finds one resumes from its latest step (`resumed from step
K`), so `rayslice run jax_lm --max-restarts N` continues after a preemption. The hosts' JAX
compilation cache (set by the boot script) holds the compiled step for the next attempt.
`fit_step` is the entry point of `rayslice fit jax_lm`.

    python -m rayslice.workloads.jax_lm [--steps N] [--slices N] [--tensor-parallel T]
        [--d-model D] [--layers L] [--heads H] [--kv-heads K] [--mlp F] [--seq S]
        [--batch B] [--remat dots|full|none] [--attention splash|reference]
        [--checkpoint-dir DIR] [--checkpoint-every K]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rayslice import catalog, names
from rayslice.errors import InvalidInput
from rayslice.workloads import _cluster, _jax_hosts, _lm_data, jax_train

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch is split over both data-parallel axes
ROPE_THETA = 10_000.0
WARMUP_STEPS = 10
REMAT_POLICIES = ("dots", "full", "none")
ATTENTIONS = ("splash", "reference")
# Splash attention's tiles along the sequence (MaxText's defaults for its sa_block_* settings).
SPLASH_BLOCK = 512
# The names under which the attention output and the kernel's residuals are kept by `dots`.
ATTENTION_NAME = "attention"
ATTENTION_RESIDUALS = "attention_residuals"


@dataclass(frozen=True)
class Sizes:
    """The model's shape, the sequence length, the batch and how it trains."""

    d_model: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    seq: int
    batch_per_device: int  # sequences per data-parallel device (`Layout.data_parallel` of them)
    remat: str
    lr: float

    @property
    def weights_per_layer(self) -> int:
        """Weights of one block's matrices (QKV, output projection, gate, up, down)."""
        attention = self.d_model * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return attention + 3 * self.d_model * self.mlp

    @property
    def parameters(self) -> int:
        norms = (2 * self.layers + 1) * self.d_model
        return self.layers * self.weights_per_layer + 2 * _lm_data.VOCAB * self.d_model + norms

    def describe(self) -> str:
        return (
            f"{self.parameters / 1e6:.0f}M parameters: d_model {self.d_model} x {self.layers} layers, "
            f"{self.heads} heads ({self.kv_heads} kv) of {self.head_dim}, mlp {self.mlp}, seq {self.seq}, "
            f"remat {self.remat}, lr {self.lr:.1e}"
        )


# On CPU devices (the simulator, a laptop): small enough that a step takes a fraction of a second.
SMALL = Sizes(
    d_model=128, layers=2, heads=4, kv_heads=2, head_dim=32, mlp=384, seq=128, batch_per_device=8,
    remat="none", lr=3e-3,
)  # fmt: skip
# On a TPU chip the catalog knows: projections wide enough (2048, heads of 128) to fill the matrix
# units, the sequence splash attention is tuned for, and as many layers as a chip's HBM holds at
# about 1.6 GiB per layer (its float32 weights, Adam's moments and gradient: 16 bytes x 45 M; the
# kept activations about as much), at most 8.
CHIP = Sizes(
    d_model=2048, layers=8, heads=16, kv_heads=4, head_dim=128, mlp=5632, seq=2048, batch_per_device=8,
    remat="dots", lr=3e-4,
)  # fmt: skip
CHIP_HBM_PER_LAYER = int(1.6 * 2**30)


def sizes_for(device_kind: str, **given: Any) -> Sizes:
    """The sizes for devices of this kind (`jax.Device.device_kind`) with every given (not None)
    field kept: a TPU chip the catalog knows gets `CHIP`, with fewer layers where its HBM is
    smaller; anything else `SMALL`."""
    hbm = catalog.device_hbm_bytes(device_kind)
    base = (
        SMALL
        if hbm is None
        else dataclasses.replace(CHIP, layers=min(CHIP.layers, hbm // CHIP_HBM_PER_LAYER))
    )
    unknown = set(given) - {f.name for f in dataclasses.fields(Sizes)}
    if unknown:
        raise TypeError(f"no such sizes: {sorted(unknown)}")
    return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})


@dataclass(frozen=True)
class Layout:
    """The mesh's degrees: slices (`data`), the rest of a slice (`fsdp`) and `tensor`."""

    data: int
    fsdp: int
    tensor: int

    @property
    def data_parallel(self) -> int:
        return self.data * self.fsdp

    @classmethod
    def of(cls, devices: int, slices: int, tensor: int) -> Layout:
        """The layout of `devices` over `slices` slices with `tensor`-way tensor parallelism; raises
        `InvalidInput` when the tensor degree does not divide a slice's devices."""
        per_slice = devices // slices
        if tensor < 1 or per_slice % tensor:
            raise InvalidInput(
                f"--tensor-parallel {tensor} does not divide a slice's {per_slice} devices: "
                "pick a divisor of it"
            )
        return cls(slices, per_slice // tensor, tensor)


def check_sizes(sizes: Sizes, layout: Layout, global_batch: int) -> None:
    """Refuse, with one line naming both numbers, sizes that do not divide over the mesh."""
    if sizes.heads % sizes.kv_heads:
        raise InvalidInput(f"{sizes.heads} heads do not divide into groups of {sizes.kv_heads} kv heads")
    for what, number in (("heads", sizes.heads), ("kv heads", sizes.kv_heads), ("mlp width", sizes.mlp)):
        if number % layout.tensor:
            raise InvalidInput(
                f"{number} {what} do not divide over the tensor-parallel degree {layout.tensor}: "
                f"pick a --tensor-parallel that divides {number}"
            )
    if global_batch % layout.data_parallel:
        raise InvalidInput(
            f"batch {global_batch} does not divide over the data-parallel degree {layout.data_parallel} "
            f"({layout.data} slices x {layout.fsdp} fsdp devices): pick a multiple of {layout.data_parallel}"
        )
    if sizes.d_model % layout.fsdp:
        raise InvalidInput(
            f"d_model {sizes.d_model} does not divide over the fsdp degree {layout.fsdp}: "
            "pick a multiple of it"
        )
    if sizes.head_dim % 2:
        raise InvalidInput(f"head_dim {sizes.head_dim} must be even for rotary positions")


def flops_per_step(sizes: Sizes, global_batch: int) -> float:
    """The model FLOPs of one training step, by MaxText's formula (see the module's docstring)."""
    tokens = global_batch * sizes.seq
    qkv = 2 * tokens * sizes.d_model * (sizes.heads + 2 * sizes.kv_heads) * sizes.head_dim
    projection = 2 * tokens * sizes.d_model * sizes.heads * sizes.head_dim
    mlp = 2 * tokens * sizes.d_model * sizes.mlp * 3  # gate and up (SwiGLU's two), then down
    embedding = 2 * tokens * sizes.d_model * _lm_data.VOCAB
    causal_attention = 4 * global_batch * sizes.seq**2 * sizes.heads * sizes.head_dim / 2
    weights = ((qkv + projection + mlp) * sizes.layers + embedding) * 3
    return weights + causal_attention * sizes.layers * 3


# ---- the model --------------------------------------------------------------------------------


def _specs(sizes: Sizes) -> dict[str, Any]:
    """Each parameter's partition spec: weights over `fsdp` on their model dimension and over
    `tensor` on their heads or MLP width; the leading axis of the stacked layers is not split."""
    from jax.sharding import PartitionSpec as P

    return {
        "embed": P(None, "fsdp"),
        "layers": {
            "attn_norm": P(None, None),
            "wq": P(None, "fsdp", "tensor", None),
            "wk": P(None, "fsdp", "tensor", None),
            "wv": P(None, "fsdp", "tensor", None),
            "wo": P(None, "tensor", None, "fsdp"),
            "mlp_norm": P(None, None),
            "w_gate": P(None, "fsdp", "tensor"),
            "w_up": P(None, "fsdp", "tensor"),
            "w_down": P(None, "tensor", "fsdp"),
        },
        "final_norm": P(None),
        "unembed": P("fsdp", None),
    }


def _shapes(sizes: Sizes) -> dict[str, Any]:
    d, n, h, k, hd, f = sizes.d_model, sizes.layers, sizes.heads, sizes.kv_heads, sizes.head_dim, sizes.mlp
    return {
        "embed": (_lm_data.VOCAB, d),
        "layers": {
            "attn_norm": (n, d),
            "wq": (n, d, h, hd),
            "wk": (n, d, k, hd),
            "wv": (n, d, k, hd),
            "wo": (n, h, hd, d),
            "mlp_norm": (n, d),
            "w_gate": (n, d, f),
            "w_up": (n, d, f),
            "w_down": (n, f, d),
        },
        "final_norm": (d,),
        "unembed": (d, _lm_data.VOCAB),
    }


def _is_shape(leaf: Any) -> bool:
    return isinstance(leaf, tuple) and all(isinstance(x, int) for x in leaf)


def make_mesh(devices: Sequence[Any], tensor: int = 1) -> tuple[Any, Layout]:
    """The (`data`, `fsdp`, `tensor`) mesh over `devices`: `data` over their slices (DCN),
    `fsdp` x `tensor` within each (ICI)."""
    import jax
    from jax.experimental import mesh_utils
    from jax.sharding import Mesh

    slices = len({getattr(d, "slice_index", 0) for d in devices})
    layout = Layout.of(len(devices), slices, tensor)
    if slices > 1:
        grid = mesh_utils.create_hybrid_device_mesh(
            (1, layout.fsdp, layout.tensor), (slices, 1, 1), list(devices)
        )
        return Mesh(grid, MESH_AXES), layout
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)  # XLA propagates what is not constrained
    return (
        jax.make_mesh((1, layout.fsdp, layout.tensor), MESH_AXES, devices=list(devices), axis_types=auto),
        layout,
    )


def _init(sizes: Sizes, key: Any) -> dict[str, Any]:
    """Float32 parameters: unit-variance inputs stay unit-variance through each projection; the
    projections into the residual stream are scaled down by the depth (GPT-2's rule)."""
    import jax
    import jax.numpy as jnp

    shapes = _shapes(sizes)
    flat = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=_is_shape)[0]
    tree = jax.tree.structure(shapes, is_leaf=_is_shape)
    keys = iter(jax.random.split(key, len(flat)))
    residual = (2 * sizes.layers) ** -0.5

    def fan_in(name: str) -> float:
        if name.endswith("norm"):
            return 0.0
        if name == "embed":
            return 1.0
        if name == "wo":
            return (sizes.heads * sizes.head_dim) ** -0.5 * residual
        if name == "w_down":
            return sizes.mlp**-0.5 * residual
        return sizes.d_model**-0.5

    values = []
    for path, shape in flat:
        scale = fan_in(str(path[-1].key))
        values.append(
            jnp.ones(shape, jnp.float32) if scale == 0.0 else scale * jax.random.normal(next(keys), shape)
        )
    return jax.tree.unflatten(tree, values)


def _rms_norm(x: Any, scale: Any) -> Any:
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    normed = x32 * jnp.reciprocal(jnp.sqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6))
    return (normed * scale).astype(x.dtype)


def _rope(x: Any, positions: Any) -> Any:
    """Rotary positions on (batch, seq, heads, head_dim), the two halves of head_dim as pairs."""
    import jax.numpy as jnp

    half = x.shape[-1] // 2
    freq = ROPE_THETA ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions[:, None] * freq[None, :]  # (seq, half)
    sin, cos = jnp.sin(angle)[None, :, None, :], jnp.cos(angle)[None, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def reference_attention(q: Any, k: Any, v: Any) -> Any:
    """Causal grouped-query attention in plain JAX, softmax in float32: q (batch, heads, seq,
    head_dim), k and v (batch, kv_heads, seq, head_dim); q already scaled."""
    import jax
    import jax.numpy as jnp

    b, h, s, hd = q.shape
    groups = h // k.shape[1]
    qg = q.reshape(b, k.shape[1], groups, s, hd)
    logits = jnp.einsum("bkgqd,bksd->bkgqs", qg, k, preferred_element_type=jnp.float32)
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    logits = jnp.where(causal, logits, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgqs,bksd->bkgqd", weights, v).reshape(b, h, s, hd)


def splash_attention(mesh: Any) -> Callable[[Any, Any, Any], Any]:
    """Pallas' splash attention kernel, per device under `shard_map` (batch over the data-parallel
    axes, heads over `tensor`), causal, with grouped kv heads as the kernel takes them."""
    import jax
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
    from jax.sharding import PartitionSpec as P

    spec = P(BATCH_AXES, "tensor", None, None)

    def local(q: Any, k: Any, v: Any) -> Any:
        heads, seq = q.shape[1], q.shape[2]
        block = min(SPLASH_BLOCK, seq)
        blocks = splash.BlockSizes(
            block_q=block, block_kv=block, block_kv_compute=block,
            block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
            block_q_dq=block, block_kv_dq=block,
        )  # fmt: skip
        kernel = splash.make_splash_mha(
            mask=masks.MultiHeadMask([masks.CausalMask((seq, seq))] * heads),
            block_sizes=blocks,
            head_shards=1,
            q_seq_shards=1,
            residual_checkpoint_name=ATTENTION_RESIDUALS,
        )
        return jax.vmap(kernel)(q, k, v)

    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)


def _remat_policy(name: str) -> Any:
    import jax

    policies = jax.checkpoint_policies
    if name == "full":
        return policies.nothing_saveable
    return policies.save_from_both_policies(
        policies.dots_with_no_batch_dims_saveable,
        policies.save_only_these_names(ATTENTION_NAME, ATTENTION_RESIDUALS),
    )


def make_loss(sizes: Sizes, mesh: Any, attention: str) -> Callable[[Any, Any], Any]:
    """The next-byte cross-entropy of `tokens` (batch, seq + 1) under float32 `params`."""
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    bf16 = jnp.bfloat16
    attend = splash_attention(mesh) if attention == "splash" else reference_attention

    def constrain(x: Any, *spec: Any) -> Any:
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))

    def block(x: Any, layer: dict[str, Any]) -> tuple[Any, None]:
        w = {name: value.astype(bf16) for name, value in layer.items()}
        positions = jnp.arange(x.shape[1], dtype=jnp.float32)
        h = _rms_norm(x, layer["attn_norm"])
        q = _rope(jnp.einsum("bsd,dhk->bshk", h, w["wq"]), positions) * sizes.head_dim**-0.5
        k = _rope(jnp.einsum("bsd,dhk->bshk", h, w["wk"]), positions)
        v = jnp.einsum("bsd,dhk->bshk", h, w["wv"])
        q, k, v = (constrain(t.transpose(0, 2, 1, 3), BATCH_AXES, "tensor", None, None) for t in (q, k, v))
        out = checkpoint_name(attend(q, k, v), ATTENTION_NAME)
        x = x + constrain(jnp.einsum("bhsk,hkd->bsd", out, w["wo"]), BATCH_AXES, None, None)
        h = _rms_norm(x, layer["mlp_norm"])
        gate = constrain(jnp.einsum("bsd,df->bsf", h, w["w_gate"]), BATCH_AXES, None, "tensor")
        up = constrain(jnp.einsum("bsd,df->bsf", h, w["w_up"]), BATCH_AXES, None, "tensor")
        x = x + constrain(
            jnp.einsum("bsf,fd->bsd", jax.nn.silu(gate) * up, w["w_down"]), BATCH_AXES, None, None
        )
        return x, None

    if sizes.remat != "none":
        block = jax.checkpoint(block, policy=_remat_policy(sizes.remat), prevent_cse=False)

    def loss(params: dict[str, Any], tokens: Any) -> Any:
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        x = constrain(params["embed"].astype(bf16)[inputs], BATCH_AXES, None, None)
        x, _ = jax.lax.scan(block, x, params["layers"])
        x = _rms_norm(x, params["final_norm"])
        logits = jnp.einsum(
            "bsd,dv->bsv", x, params["unembed"].astype(bf16), preferred_element_type=jnp.float32
        )
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))

    return loss


def _optimizer(sizes: Sizes) -> Any:
    import optax

    schedule = optax.linear_schedule(sizes.lr / WARMUP_STEPS, sizes.lr, WARMUP_STEPS)
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.1),
    )


@dataclass(frozen=True)
class Model:
    """Everything a run needs besides its state: the mesh, its shardings, the jitted step."""

    sizes: Sizes
    mesh: Any
    layout: Layout
    global_batch: int
    optimizer: Any
    param_shardings: Any
    state_shardings: Any
    token_sharding: Any
    step: Any  # jitted (params, opt_state, tokens) -> (params, opt_state, loss); donates the first two


def build(
    devices: Sequence[Any],
    sizes: Sizes,
    tensor: int = 1,
    batch: int | None = None,
    attention: str | None = None,
) -> Model:
    """The mesh, shardings and jitted step for `sizes` over `devices` (attached, or a topology's
    compile-only devices for `rayslice fit`); raises `InvalidInput` for sizes that do not divide."""
    import jax
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh, layout = make_mesh(devices, tensor)
    global_batch = sizes.batch_per_device * layout.data_parallel if batch is None else batch
    check_sizes(sizes, layout, global_batch)
    if attention is None:
        attention = "splash" if devices[0].platform == "tpu" else "reference"
    optimizer = _optimizer(sizes)
    param_shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), _specs(sizes))
    abstract = jax.tree.map(
        lambda shape: jax.ShapeDtypeStruct(shape, "float32"), _shapes(sizes), is_leaf=_is_shape
    )
    replicated = NamedSharding(mesh, P())
    state_shardings = optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        jax.eval_shape(optimizer.init, abstract),
        param_shardings,
        transform_non_params=lambda _: replicated,
    )
    loss_fn = make_loss(sizes, mesh, attention)

    @functools.partial(
        jax.jit,
        donate_argnums=(0, 1),
        out_shardings=(param_shardings, state_shardings, replicated),
    )
    def step(params: Any, opt_state: Any, tokens: Any) -> tuple[Any, Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    token_sharding = NamedSharding(mesh, P(BATCH_AXES, None))
    return Model(
        sizes, mesh, layout, global_batch, optimizer, param_shardings, state_shardings, token_sharding, step
    )


def abstract_args(model: Model) -> tuple[Any, Any, Any]:
    """The step's arguments as sharded `ShapeDtypeStruct`s."""
    import jax
    import jax.numpy as jnp

    shapes = _shapes(model.sizes)
    params = jax.tree.map(
        lambda shape, sharding: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding),
        shapes,
        model.param_shardings,
        is_leaf=_is_shape,
    )
    state = jax.tree.map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        jax.eval_shape(model.optimizer.init, params),
        model.state_shardings,
    )
    tokens = jax.ShapeDtypeStruct(
        (model.global_batch, model.sizes.seq + 1), jnp.int32, sharding=model.token_sharding
    )
    return params, state, tokens


def initial_state(model: Model, seed: int = 0) -> tuple[Any, Any]:
    """Parameters and optimizer state, made sharded on the devices (the same on every process)."""
    import jax

    params = jax.jit(functools.partial(_init, model.sizes), out_shardings=model.param_shardings)(
        jax.random.key(seed)
    )
    opt_state = jax.jit(model.optimizer.init, out_shardings=model.state_shardings)(params)
    return params, opt_state


def tokens_at(model: Model, text: Any, seed: int, step: int) -> Any:
    """Step `step`'s global batch, each process placing the rows its devices hold."""
    import jax

    rows = _lm_data.batch(text, seed, step, model.global_batch, model.sizes.seq)
    return jax.make_array_from_callback(rows.shape, model.token_sharding, lambda index: rows[index])


# ---- the command line's pieces ----------------------------------------------------------------


def _given_sizes(args: argparse.Namespace) -> dict[str, Any]:
    """The `Sizes` fields the command line gave (None where it left them to the device kind)."""
    fields = ("d_model", "layers", "heads", "kv_heads", "head_dim", "mlp", "seq", "batch_per_device", "remat")
    return {**{name: getattr(args, name) for name in fields}, "lr": args.learning_rate}


def fit_step(devices: Sequence[Any], argv: Sequence[str]) -> tuple[Any, tuple[Any, ...]]:
    """`rayslice fit`'s entry point: the step and its abstract arguments over `devices` for the
    sizes jax_lm would pick there with these command-line arguments."""
    args = build_parser().parse_args(list(argv))
    sizes = sizes_for(devices[0].device_kind, **_given_sizes(args))
    model = build(devices, sizes, args.tensor_parallel, args.batch, args.attention)
    return model.step, abstract_args(model)


@dataclass(frozen=True)
class LmReport:
    """One run's figures; FLOPs count every device."""

    devices: int
    device_kind: str
    sizes: Sizes
    layout: Layout
    global_batch: int
    losses: tuple[float, ...]
    step_seconds: float  # mean over the timed steps (all but this run's first)
    flops_per_step: float  # MaxText's count (`flops_per_step`)
    compiled_flops_per_step: float  # XLA's cost analysis of the compiled step, for comparison
    first_step: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.global_batch * self.sizes.seq / self.step_seconds if self.step_seconds else 0.0

    @property
    def peak_flops(self) -> float | None:
        peak = catalog.device_peak_flops(self.device_kind)
        return None if peak is None else peak * self.devices

    @property
    def mfu(self) -> float | None:
        peak = self.peak_flops
        if peak is None or not self.step_seconds:
            return None
        return self.flops_per_step / self.step_seconds / peak

    def summary(self) -> str:
        mfu = self.mfu
        of_peak = (
            f"MFU {mfu:.1%} of {self.peak_flops / 1e12:.0f} TFLOP/s bf16 peak"  # type: ignore[operator]
            if mfu is not None
            else f"MFU unknown (no peak for device kind {self.device_kind!r})"
        )
        return (
            f"{self.devices} x {self.device_kind}, mesh data {self.layout.data} x fsdp {self.layout.fsdp} "
            f"x tensor {self.layout.tensor}, {self.sizes.describe()}, batch {self.global_batch}: "
            f"{self.tokens_per_s:,.0f} tokens/s, {self.step_seconds * 1e3:.1f} ms/step, {of_peak} "
            f"(MaxText's count {self.flops_per_step / 1e12:.2f} TFLOP/step, XLA's "
            f"{self.compiled_flops_per_step / 1e12:.2f}); loss {self.losses[0]:.4f} -> {self.losses[-1]:.4f}"
        )


def _step_line(
    step: int, loss: float, seconds: float | None, tokens: int, flops: float, peak: float | None
) -> str:
    line = jax_train.step_line(step, loss)
    if seconds is None:
        return line + "  (compiling)"
    mfu = f"  MFU {flops / seconds / peak:.1%}" if peak else ""
    return line + f"  {tokens / seconds:,.0f} tokens/s{mfu}"


def train(
    steps: int = 30,
    *,
    tensor: int = 1,
    batch: int | None = None,
    attention: str | None = None,
    seed: int = 0,
    checkpoint_dir: str | None = None,
    checkpoint_every: int = 10,
    progress: Callable[[str], None] | None = None,
    **sizes: Any,
) -> LmReport:
    """Train on every device JAX sees (all hosts' after `jax.distributed.initialize`), at the
    sizes for their kind with `sizes` (`Sizes`' fields) kept; process 0 reports each step."""
    jax_train.check_steps(steps)
    report = progress or _cluster.show_line
    import jax

    devices = jax.devices()
    kind = devices[0].device_kind
    model = build(devices, sizes_for(kind, **sizes), tensor, batch, attention)
    text = _lm_data.corpus()
    params, opt_state = initial_state(model, seed)
    manager, start = None, 0
    if checkpoint_dir is not None:
        import orbax.checkpoint as ocp

        manager = ocp.CheckpointManager(
            checkpoint_dir,
            options=ocp.CheckpointManagerOptions(save_interval_steps=checkpoint_every, max_to_keep=2),
        )
        latest = manager.latest_step()
        if latest is not None:  # the saved step counts the steps done
            params, opt_state = manager.restore(latest, args=ocp.args.StandardRestore((params, opt_state)))
            start = min(latest, steps)
            if jax.process_index() == 0:
                report(f"resumed from step {latest}")
    flops = flops_per_step(model.sizes, model.global_batch)
    peak = catalog.device_peak_flops(kind)
    peak = None if peak is None else peak * len(devices)
    tokens = tokens_at(model, text, seed, start)
    try:
        compiled = model.step.lower(params, opt_state, tokens).compile()
    except Exception as exc:  # XLA's errors come as several types; only running out of HBM is the user's
        if "RESOURCE_EXHAUSTED" not in str(exc):
            raise
        raise InvalidInput(
            f"jax_lm at {model.sizes.describe()}, batch {model.global_batch}, does not fit a {kind}'s "
            "HBM: shrink --batch-per-device, --seq or --layers, or use --remat full "
            "(`rayslice fit jax_lm -- ARGS` says before a run)"
        ) from None
    costs = compiled.cost_analysis() or {}
    losses: list[float] = []
    timed, started = 0.0, time.perf_counter()
    for i in range(start, steps):
        params, opt_state, loss = compiled(params, opt_state, tokens)
        if i + 1 < steps:
            tokens = tokens_at(model, text, seed, i + 1)  # while the step runs
        losses.append(float(loss))  # waits for the step
        now = time.perf_counter()
        seconds = None if i == start else now - started
        timed += seconds or 0.0
        started = now
        if jax.process_index() == 0:
            report(_step_line(i, losses[-1], seconds, model.global_batch * model.sizes.seq, flops, peak))
        if manager is not None:
            manager.save(i + 1, args=ocp.args.StandardSave((params, opt_state)), force=i + 1 == steps)
            started = time.perf_counter()  # the save is not the step's time
    if manager is not None:
        manager.wait_until_finished()
        manager.close()
    return LmReport(
        devices=len(devices),
        device_kind=kind,
        sizes=model.sizes,
        layout=model.layout,
        global_batch=model.global_batch,
        losses=tuple(losses),
        step_seconds=timed / (len(losses) - 1) if len(losses) > 1 else 0.0,
        flops_per_step=flops,
        compiled_flops_per_step=float(costs.get("flops", 0.0)) * len(devices),
        first_step=start,
    )


SIZE_HELP = "default: from the device kind (small on CPU devices, about 0.4 B parameters on a TPU chip)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jax_lm", description=__doc__.splitlines()[0])
    _cluster.add_slice_args(parser)
    parser.add_argument("--steps", type=_steps, default=30)
    parser.add_argument(
        "--slices",
        type=jax_train._positive_int,
        default=1,
        help="slices to train over (data parallel over DCN)",
    )
    parser.add_argument(
        "--tensor-parallel",
        type=jax_train._positive_int,
        default=1,
        metavar="T",
        help="tensor-parallel degree",
    )
    for flag in ("--d-model", "--layers", "--heads", "--kv-heads", "--head-dim", "--mlp", "--seq"):
        parser.add_argument(flag, type=jax_train._positive_int, help=SIZE_HELP)
    parser.add_argument(
        "--batch-per-device",
        type=jax_train._positive_int,
        help="sequences per data-parallel device; " + SIZE_HELP,
    )
    parser.add_argument(
        "--batch",
        type=jax_train._positive_int,
        help="global batch in sequences (overrides --batch-per-device)",
    )
    parser.add_argument(
        "--remat", choices=REMAT_POLICIES, help="what the backward pass recomputes; " + SIZE_HELP
    )
    parser.add_argument(
        "--attention", choices=ATTENTIONS, help="default: splash on TPU devices, reference elsewhere"
    )
    parser.add_argument("--learning-rate", type=float, help="AdamW's peak step size; " + SIZE_HELP)
    parser.add_argument("--coordinator-port", type=int, default=names.JAX_COORDINATOR_PORT)
    parser.add_argument("--checkpoint-dir", metavar="DIR", help="save and resume with orbax-checkpoint here")
    parser.add_argument(
        "--checkpoint-every", type=jax_train._positive_int, default=10, metavar="K", help="save every K steps"
    )
    return parser


def _steps(text: str) -> int:
    try:
        return jax_train.check_steps(int(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_on_slices(args: argparse.Namespace, slices: Sequence[_cluster.TpuSlice]) -> None:
    """The divisibility checks the driver can make before any host starts: the tensor degree
    against a slice's devices and the explicit heads and batch against the mesh."""
    chip = catalog.chip(slices[0].generation) if slices else None
    per_chip = chip.jax_devices_per_chip if chip is not None else 1
    devices = sum(s.chips for s in slices) * per_chip
    layout = Layout.of(devices, len(slices), args.tensor_parallel)
    for what, number in (("heads", args.heads), ("kv heads", args.kv_heads)):
        if number is not None and number % layout.tensor:
            raise InvalidInput(
                f"{number} {what} do not divide over the tensor-parallel degree {layout.tensor}: "
                f"pick a --tensor-parallel that divides {number}"
            )
    if args.batch is not None and args.batch % layout.data_parallel:
        raise InvalidInput(
            f"batch {args.batch} does not divide over the data-parallel degree {layout.data_parallel} "
            f"({layout.data} slices x {layout.fsdp} fsdp devices): pick a multiple of {layout.data_parallel}"
        )


def run(args: argparse.Namespace) -> LmReport:
    slices = _cluster.choose_slices(
        args.slices, slice_name=args.slice_name, accelerator_type=args.accelerator_type
    )
    for tpu_slice in slices:
        print(f"slice {tpu_slice.describe()}", flush=True)
    check_on_slices(args, slices)
    progress = _cluster.Progress()
    job = functools.partial(
        train,
        args.steps,
        tensor=args.tensor_parallel,
        batch=args.batch,
        attention=args.attention,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        progress=progress,
        **_given_sizes(args),
    )
    try:
        reports = _jax_hosts.run_on_hosts(
            job, slices, coordinator_port=args.coordinator_port, timeout_s=args.timeout, progress=progress
        )
    except InvalidInput as exc:  # a host's refusal (sizes that do not fit), without Ray's traceback
        raise InvalidInput(str(getattr(exc, "cause", exc))) from None
    report = reports[0].result  # the loss is replicated: every process computed the same
    print(report.summary())
    return report


def main(argv: list[str] | None = None) -> int:
    return _cluster.run_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
