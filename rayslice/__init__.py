"""rayslice: Ray clusters on Cloud TPU slices from one validated description."""

__version__ = "0.1.0"
