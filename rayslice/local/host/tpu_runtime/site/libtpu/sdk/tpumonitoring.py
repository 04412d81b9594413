"""The simulated ``libtpu.sdk.tpumonitoring``: the calls monitoring tools make, answered from what
the host's simulated chips run.

The interface is libtpu's as its users call it: ``list_supported_metrics()`` gives names,
``get_metric(name)`` an object whose ``data()`` is a list of strings, one per chip, and whose
``description()`` says what they mean (tpu-info 0.14 ``cli_helper.TensorCoreUtilizationTable``;
google-cloud-mldiagnostics 0.5.10 ``utils/libtpu_utils/libtpu_metric.py``, which parses each entry
with ``float``/``int``). Only the four metrics the simulation measures are listed; a real v5e
lists 18. The figures come from the records the host's JAX processes write
(`rayslice_simulated_tpu.Recorder`), read anew at each ``data()`` call.
"""

from __future__ import annotations

from collections.abc import Callable

import rayslice_simulated_tpu as runtime  # type: ignore[import-not-found]  # beside this package

_METRICS: dict[str, tuple[str, Callable[[runtime.ChipFigures], str]]] = {
    "duty_cycle_pct": (
        "Duty cycle percentage of each chip (accelerator_0 to accelerator_N-1) over the last "
        f"{runtime.WINDOW_S:g} s: the share of that time the chip ran a program.",
        lambda c: f"{c.duty_cycle_pct:.2f}",
    ),
    "tensorcore_util": (
        "TensorCore utilization percentage of each chip over the last "
        f"{runtime.WINDOW_S:g} s: the compute its programs used.",
        lambda c: f"{c.tensorcore_util_pct:.2f}",
    ),
    "hbm_capacity_usage": (
        "HBM in use on each chip, in bytes: the live arrays' buffers.",
        lambda c: str(c.hbm_used),
    ),
    "hbm_capacity_total": (
        "HBM capacity of each chip, in bytes.",
        lambda c: str(c.hbm_total),
    ),
}


class Metric:
    """One metric: what ``get_metric`` returns."""

    def __init__(self, name: str):
        self._name = name

    def name(self) -> str:
        return self._name

    def description(self) -> str:
        return _METRICS[self._name][0]

    def data(self) -> list[str]:
        """One string per chip of the host, read now."""
        render = _METRICS[self._name][1]
        return [render(chip) for chip in runtime.chip_figures()]


def list_supported_metrics() -> list[str]:
    return list(_METRICS)


def get_metric(metric_name: str) -> Metric:
    if metric_name not in _METRICS:
        raise ValueError(f"unsupported metric {metric_name!r}; supported: {', '.join(_METRICS)}")
    return Metric(metric_name)
