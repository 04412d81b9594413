"""Bundled XLA (device-centric) and JAX (host-centric) jobs (`rayslice.workloads`)."""
