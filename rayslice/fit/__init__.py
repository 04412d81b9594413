"""Does a job's step fit the slice? Compiled ahead of time for the stack's TPU topology.

`rayslice fit` (and `rayslice preview --fit`) compile a job's training step on the deployer's
CPU for the topology of the stack's slices, with libtpu's compile-only devices
(`jax.experimental.topologies.get_topology_desc`), and read what XLA planned: the HBM each chip
needs (`memory_analysis`), the FLOPs of a step (`cost_analysis`), and how each array is laid out
over the mesh. A step that does not fit a chip's HBM, or does not compile for the topology, is
refused before anything is created.

A job names its step through one module-level function, the entry point (`ENTRY_POINT`):

    def fit_step(devices, argv) -> (step, args)

`devices` are the topology's devices (build the mesh from them), `argv` the job's own
command-line arguments; `step` is a `jax.jit`-wrapped function and `args` a tuple of its
arguments as `jax.ShapeDtypeStruct`s (pytrees of them) carrying their shardings. The bundled
`jax_train` has one; docs/fit.md shows one for a user's program.

`compile` holds the infra-independent core, `commands` the click command beside it.
"""
