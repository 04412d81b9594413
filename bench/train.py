"""Benchmark: `jax_train`'s achieved FLOP/s against a matmul baseline and the chips' peak.

Runs in one process on whatever devices JAX sees (CPU or TPU; no Ray needed):
1. baseline: slice_check's bf16 matmul chain on each local device, timed in this process;
2. `rayslice.workloads.jax_train.train` at the sizes it picks for the device kind (or the ones
   given), its FLOPs from the compiled step's cost_analysis;
and prints both, with the ratios train/baseline, train/peak and baseline/peak, the peak (dense
bf16) from the catalog (`catalog.device_peak_flops`); "unknown" on devices it does not know.

    python bench/train.py [--steps N] [--batch-per-device B] [--hidden H] [--layers L] [--matmul-size N]
"""

from __future__ import annotations

import argparse

from rayslice import catalog
from rayslice.workloads import slice_check
from rayslice.workloads.jax_train import train


def matmul_baseline(size: int | None = None) -> tuple[int, float]:
    """The matmul size and the achieved FLOP/s of slice_check's chain on every local device
    together (devices timed one after the other; the size slice_check picks when None)."""
    import jax

    sizes = slice_check.sizes_for(jax.devices()[0].device_kind)
    n = size or sizes.matmul
    return n, sum(slice_check.matmul_flops(d, n, sizes.matmul_chain) for d in jax.local_devices())


def ratio(numerator: float, denominator: float | None) -> str:
    return "n/a" if denominator is None else f"{numerator / denominator:.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-per-device", type=int, help="default: jax_train's for the device kind")
    parser.add_argument("--hidden", type=int, help="default: jax_train's for the device kind")
    parser.add_argument("--layers", type=int, help="default: jax_train's for the device kind")
    parser.add_argument("--matmul-size", type=int, help="default: slice_check's for the device kind")
    args = parser.parse_args()

    import jax

    kind = jax.devices()[0].device_kind
    peak = catalog.device_peak_flops(kind)
    devices = jax.local_device_count()
    peak_all = None if peak is None else peak * devices
    size, baseline = matmul_baseline(args.matmul_size)
    report = train(args.steps, args.batch_per_device, args.hidden, layers=args.layers)
    print(
        f"devices: {devices} x {kind}; peak (dense bf16, catalog): "
        f"{'unknown' if peak_all is None else f'{peak_all / 1e12:.0f} TFLOP/s'}"
    )
    print(
        f"baseline bf16 matmul {size}^3: {baseline / 1e9:10.2f} GFLOP/s  of peak {ratio(baseline, peak_all)}"
    )
    print(
        f"jax_train ({report.sizes.describe()}): {report.flops_per_s / 1e9:10.2f} GFLOP/s  "
        f"of peak {ratio(report.flops_per_s, peak_all)}, of baseline {ratio(report.flops_per_s, baseline)}"
        f"  ({report.steps_per_s:.2f} steps/s, {report.samples_per_s:.0f} samples/s, "
        f"loss {report.losses[0]:.3f} -> {report.losses[-1]:.3f})"
    )


if __name__ == "__main__":
    main()
