"""bench/train.py: the peak table's lookup (the benchmark itself is run by hand)."""

from __future__ import annotations

import pytest

from tests.bench import load

bench_train = load("train")


@pytest.mark.parametrize(
    "kind, tflops",
    [
        ("TPU v5 lite", 197),
        ("TPU v5", 459),
        ("TPU v5p", 459),
        ("TPU v6 lite", 918),
        ("TPU v4", 275),
        ("NVIDIA H100 80GB HBM3", 989),
        ("cpu", None),
    ],
)
def test_peak_by_device_kind(kind, tflops):
    expected = None if tflops is None else tflops * 1e12
    assert bench_train.peak_flops(kind) == expected


def test_ratio_is_na_without_a_peak():
    assert bench_train.ratio(1.0, None) == "n/a"
    assert bench_train.ratio(1.0, 4.0) == "25.0%"
