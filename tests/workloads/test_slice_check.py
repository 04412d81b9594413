"""slice_check's judgement (which chip or link is flagged) and its tables; its measurements run
on the local CPU devices here, on the simulator in tests/integration, and on a real TPU host in
scripts/tpu_host_check.py."""

from __future__ import annotations

import pytest

from rayslice import catalog
from rayslice.workloads import slice_check
from rayslice.workloads.slice_check import ChipRow, HostResult, judge, tables

V5E = "TPU v5 lite"
PEAK = catalog.device_peak_flops(V5E)
BANDWIDTH = catalog.device_hbm_bytes_per_s(V5E)


def host(name: str, flops: list[float], hbm: float = 700e9, ici: float | None = 90e9, kind: str = V5E):
    peak, bandwidth = catalog.device_peak_flops(kind), catalog.device_hbm_bytes_per_s(kind)
    chips = tuple(ChipRow(str(i), f, peak, hbm, bandwidth) for i, f in enumerate(flops))
    return HostResult(name, kind, chips, ici, None)


def test_healthy_chips_and_links_are_not_flagged():
    verdict = judge([host("a", [180e12] * 4), host("b", [178e12] * 4)])
    assert verdict.judged and verdict.flags == []
    assert "every chip and link within its threshold" in tables([host("a", [180e12])], verdict)


def test_a_chip_below_the_fraction_of_the_median_is_flagged_with_its_host_and_device():
    verdict = judge([host("a", [180e12, 180e12, 120e12, 180e12]), host("b", [180e12] * 4)], fraction=0.8)
    assert [(f.host, f.what, f.device) for f in verdict.flags] == [("a", "matmul", "2")]
    assert "67% of the median 180.0 TFLOP/s" in verdict.flags[0].reason


def test_a_slow_link_is_flagged_against_the_other_hosts():
    links = {"a": 90e9, "b": 40e9, "c": 91e9}
    verdict = judge([host(name, [180e12], ici=ici) for name, ici in links.items()])
    assert [(f.host, f.what) for f in verdict.flags] == [("b", "ici")]


def test_every_chip_equally_slow_is_flagged_against_the_catalogs_peak():
    assert PEAK is not None and BANDWIDTH is not None
    verdict = judge([host("a", [0.3 * PEAK] * 4, hbm=0.9 * BANDWIDTH)], min_of_peak=0.5)
    assert {(f.what, f.reason) for f in verdict.flags} == {("matmul", "30% of the chip's peak 197.0 TFLOP/s")}


def test_cpu_devices_are_reported_but_not_judged():
    results = [host("a", [1e9, 5e9], ici=1e9, kind="cpu"), host("b", [0.1e9, 5e9], ici=0.1e9, kind="cpu")]
    verdict = judge(results)
    assert not verdict.judged and verdict.flags == []
    lines = tables(results, verdict)
    assert "host a (2 x cpu)" in lines and any("not judged" in line for line in lines)


def test_the_tables_have_a_row_per_chip_and_a_link_row_per_host():
    results = [host("s0/0", [180e12, 100e12]), host("s0/1", [180e12, 180e12])]
    lines = tables(results, judge(results))
    assert lines[0] == "host s0/0 (2 x TPU v5 lite)"
    row = next(line.split() for line in lines if line.startswith("  1 "))
    assert row[:4] == ["1", "100.00", "51%", "700.0"] and row[-1] == "matmul"
    assert any(line.startswith("FLAGGED s0/0 matmul device 1") for line in lines)
    links = [line.split()[:2] for line in lines if line.startswith("  s0/")]
    assert links == [["s0/0", "90.000"], ["s0/1", "90.000"]]


@pytest.mark.parametrize("kind, sizes", [(V5E, slice_check.CHIP_SIZES), ("cpu", slice_check.SMALL_SIZES)])
def test_sizes_come_from_the_device_kind(kind, sizes):
    assert slice_check.sizes_for(kind) == sizes


def test_measuring_the_local_cpu_devices_gives_a_row_each_and_no_flag():
    import jax

    result = slice_check.measure_host(1, "here")
    assert len(result.chips) == jax.local_device_count()
    assert all(c.flops > 0 and c.hbm > 0 and c.peak_flops is None for c in result.chips)
    assert judge([result]).flags == []


def test_a_devices_slice_comes_from_its_process_id_not_its_slice_index():
    """On the simulator every CPU device says slice_index 0; rayslice numbers the processes of a
    multislice program slice by slice (`_jax_hosts`), 4 hosts per v6e-16 slice."""

    class Device:
        slice_index = 0

        def __init__(self, process_index: int):
            self.process_index = process_index

    assert [slice_check._slice_of(Device(p), 4) for p in (0, 3, 4, 7)] == [0, 0, 1, 1]
