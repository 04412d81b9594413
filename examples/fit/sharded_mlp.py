"""A user's own JAX training program, written to be checked by `rayslice fit` before a slice exists.

A two-layer MLP whose weights are split over a ``model`` axis and whose batch is split over a
``data`` axis (2-D mesh: tensor and data parallelism). The program keeps its step and its
arguments' shapes in functions, so the same code trains here and is compiled by `rayslice fit`
for a TPU topology it does not have:

    rayslice fit examples/fit/sharded_mlp.py --topology v5e:2x2 -- --width 16384
    python examples/fit/sharded_mlp.py --steps 5        # trains on the devices JAX sees

`fit_step(devices, argv)` is the entry point `rayslice fit` calls: build the mesh from the
devices it is given, parse your own arguments, return the jitted step and its arguments as
`jax.ShapeDtypeStruct`s with their shardings.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1024, help="global batch")
    parser.add_argument("--model-parallel", type=int, default=2, help="devices per model shard group")
    parser.add_argument("--steps", type=int, default=5)
    return parser.parse_args(list(argv))


def mesh_for(devices: Sequence[Any], model_parallel: int) -> jax.sharding.Mesh:
    model = min(model_parallel, len(devices))
    # Auto axes: XLA inserts the collectives the split weights need (Explicit axes would make
    # each matmul say how its sharded contraction is reduced).
    return jax.make_mesh(
        (len(devices) // model, model),
        ("data", "model"),
        axis_types=(AxisType.Auto, AxisType.Auto),
        devices=list(devices),
    )


def shardings(mesh: jax.sharding.Mesh) -> dict[str, NamedSharding]:
    """Where each array lives: weights split by columns then rows over `model`, batch over `data`."""
    return {
        "w1": NamedSharding(mesh, PartitionSpec(None, "model")),
        "w2": NamedSharding(mesh, PartitionSpec("model", None)),
        "x": NamedSharding(mesh, PartitionSpec("data", None)),
    }


def step(params: dict[str, jax.Array], x: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
    """One SGD step on a reconstruction loss, in bf16 matmuls."""

    def loss_fn(p: dict[str, jax.Array]) -> jax.Array:
        h = jax.nn.gelu(x @ p["w1"].astype(jnp.bfloat16))
        out = h @ p["w2"].astype(jnp.bfloat16)
        return jnp.mean((out.astype(jnp.float32) - x.astype(jnp.float32)) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), loss


def fit_step(devices: Sequence[Any], argv: Sequence[str]) -> tuple[Any, tuple[Any, ...]]:
    """`rayslice fit`'s entry point: the step and its abstract, sharded arguments."""
    args = parse(argv)
    where = shardings(mesh_for(devices, args.model_parallel))
    params = {
        "w1": jax.ShapeDtypeStruct((args.width, 4 * args.width), jnp.float32, sharding=where["w1"]),
        "w2": jax.ShapeDtypeStruct((4 * args.width, args.width), jnp.float32, sharding=where["w2"]),
    }
    x = jax.ShapeDtypeStruct((args.batch, args.width), jnp.bfloat16, sharding=where["x"])
    return jax.jit(step, donate_argnums=0), (params, x)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv if argv is not None else [])
    where = shardings(mesh_for(jax.devices(), args.model_parallel))
    rng = np.random.default_rng(0)
    shapes = {"w1": (args.width, 4 * args.width), "w2": (4 * args.width, args.width)}
    params = {
        name: jax.device_put(0.01 * rng.normal(size=shape).astype(np.float32), where[name])
        for name, shape in shapes.items()
    }
    x = jax.device_put(rng.normal(size=(args.batch, args.width)).astype(jnp.bfloat16), where["x"])
    jitted = jax.jit(step, donate_argnums=0)
    for i in range(args.steps):
        params, loss = jitted(params, x)
        print(f"step {i} loss {float(loss):.4f}")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
