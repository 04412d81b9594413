"""Bundled XLA (device-centric) and JAX (host-centric) jobs (`rayslice.workloads`).

Every public module is one workload, runnable as `python -m rayslice.workloads.<name>` on a
cluster host and with `rayslice run <name>`; modules starting with `_` are shared plumbing
(`_cluster`: reading the TPU shape off the Ray cluster, `_jax_hosts`: one JAX program over the
hosts of one or more slices, `_lm_data`: jax_lm's training text). Everything here runs on
cluster hosts, shipped by `rayslice run` (`rayslice.jobs`), which this package never imports.
"""
