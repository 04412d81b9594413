"""bench/train.py: the peak comes from the catalog, the baseline from slice_check (the benchmark
itself is run by hand; on one CPU here it runs end to end in a few seconds)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rayslice import catalog
from tests.bench import load

bench_train = load("train")
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "kind, tflops",
    [
        ("TPU v5 lite", 197),
        ("TPU v5", 459),
        ("TPU v5p", 459),
        ("TPU v6 lite", 918),
        ("TPU v4", 275),
        ("TPU v3", 61.5),  # a TensorCore: two JAX devices per v3 chip
        ("TPU7x", 1153.5),  # likewise two per TPU7x chip
        ("cpu", None),
        ("NVIDIA H100 80GB HBM3", None),  # not a TPU: the catalog does not guess
    ],
)
def test_peak_per_device_by_device_kind(kind, tflops):
    expected = None if tflops is None else tflops * 1e12
    assert catalog.device_peak_flops(kind) == expected


def test_ratio_is_na_without_a_peak():
    assert bench_train.ratio(1.0, None) == "n/a"
    assert bench_train.ratio(1.0, 4.0) == "25.0%"


def test_on_cpu_the_bench_runs_and_says_the_peak_is_unknown():
    result = subprocess.run(
        [sys.executable, "bench/train.py", "--steps", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if not line.startswith("step")]
    assert lines[0].endswith("x cpu; peak (dense bf16, catalog): unknown")
    assert lines[1].startswith("baseline bf16 matmul 256^3:") and "of peak n/a" in lines[1]
    assert "jax_train (hidden 256 x 1 layers, batch 32 per device, f32 matmuls" in lines[2]
