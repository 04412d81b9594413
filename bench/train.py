"""Benchmark: `jax_train`'s achieved FLOP/s against a matmul baseline and the device's peak.

Runs in one process on whatever devices JAX sees (CPU, GPU or TPU; no Ray needed):
1. baseline: a jitted bf16 matmul chain sized to keep the device busy, timed in this process;
2. `rayslice.workloads.jax_train.train`, whose FLOPs come from the compiled step's cost_analysis;
and prints both, with the ratios train/baseline and train/peak, baseline/peak where the peak is known.

    python bench/train.py [--steps N] [--batch-per-device B] [--hidden H] [--matmul-size N]
"""

from __future__ import annotations

import argparse
import time

from rayslice.workloads.jax_train import train

# Dense bf16 peak TFLOP/s per JAX device (a TensorCore on v2/v3, a chip from v4 on, one GPU), matched against
# `jax.Device.device_kind` by prefix, first match wins. Sources: Google Cloud TPU system
# architecture pages (cloud.google.com/tpu/docs/v2, v3, v4, v5e, v5p, v6e, tpu7x) and the
# NVIDIA A100 / H100 / H200 datasheets (dense, without sparsity).
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("TPU v2", 22.5),  # 45 per chip, two devices per chip
    ("TPU v3", 61.5),  # 123 per chip, two devices per chip
    ("TPU v4", 275.0),
    ("TPU v5 lite", 197.0),  # v5e
    ("TPU v5", 459.0),  # v5p
    ("TPU v6 lite", 918.0),  # v6e (Trillium)
    ("TPU7x", 2307.0),  # Ironwood: 4,614 TFLOP/s FP8, half that in bf16
    ("NVIDIA H200", 989.0),
    ("NVIDIA H100", 989.0),  # SXM
    ("NVIDIA A100", 312.0),
)


def peak_flops(device_kind: str) -> float | None:
    """The device's dense bf16 peak in FLOP/s, or None where it is not in the table (CPUs)."""
    for prefix, tflops in PEAK_TFLOPS:
        if device_kind.startswith(prefix):
            return tflops * 1e12
    return None


def matmul_baseline(size: int, repeats: int = 10) -> float:
    """Achieved FLOP/s of a chain of size x size bf16 matmuls on every local device."""
    import jax
    import jax.numpy as jnp

    devices = jax.local_device_count()
    a = jnp.ones((devices, size, size), jnp.bfloat16) * 0.01

    @jax.pmap
    def chain(m):
        for _ in range(repeats):
            m = m @ m
        return m

    chain(a).block_until_ready()  # compile
    start = time.perf_counter()
    chain(a).block_until_ready()
    return 2 * size**3 * repeats * devices / (time.perf_counter() - start)


def ratio(numerator: float, denominator: float | None) -> str:
    return "n/a" if denominator is None else f"{numerator / denominator:.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-per-device", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--matmul-size", type=int, default=1024)
    args = parser.parse_args()

    import jax

    kind = jax.devices()[0].device_kind
    peak = peak_flops(kind)
    devices = jax.local_device_count()
    peak_all = None if peak is None else peak * devices
    baseline = matmul_baseline(args.matmul_size)
    report = train(args.steps, args.batch_per_device, args.hidden)
    print(
        f"devices: {devices} x {kind}; peak (dense bf16): "
        f"{'unknown' if peak_all is None else f'{peak_all / 1e12:.0f} TFLOP/s'}"
    )
    print(
        f"baseline bf16 matmul {args.matmul_size}^2: {baseline / 1e9:10.2f} GFLOP/s  "
        f"of peak {ratio(baseline, peak_all)}"
    )
    print(
        f"jax_train (f32, hidden {args.hidden}):  {report.flops_per_s / 1e9:10.2f} GFLOP/s  "
        f"of peak {ratio(report.flops_per_s, peak_all)}, of baseline {ratio(report.flops_per_s, baseline)}"
        f"  ({report.steps_per_s:.1f} steps/s, {report.samples_per_s:.0f} samples/s, "
        f"loss {report.losses[0]:.3f} -> {report.losses[-1]:.3f})"
    )


if __name__ == "__main__":
    main()
