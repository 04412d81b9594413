"""The simulated ``libtpu.sdk``: ``tpumonitoring`` (the chips' figures) and ``slice`` (their
coordinates), as a real libtpu wheel has them."""

from . import slice, tpumonitoring

__all__ = ["slice", "tpumonitoring"]
