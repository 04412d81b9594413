"""JAX's persistent compilation cache, in one place every host of a cluster reads.

A step that one host compiled is found by every other host, and by every later run of the same
job: a job resubmitted after a preemption, or started on a new slice, loads its compiled step
instead of compiling it again. Where the cache lives:

- on the cloud, a folder (`FOLDER`) of the cluster's own bucket (`rayslice.infra.compilation_cache`),
  whose ``gs://`` URL infra writes into the hosts' metadata (`names.ATTR_COMPILATION_CACHE`);
- on the simulator, the same folder of the simulation's shared folder, which every simulated
  host sees at one path (`RenderOptions.compilation_cache`).

The boot script hands `environment` to Ray, so every job on a host inherits it, unchanged. JAX
takes each of its settings from the environment variable of the setting's name in capitals
(jax/_src/config.py, jax 0.10.2: each state's default is ``os.getenv(name.upper())``), as its
guide shows for ``JAX_COMPILATION_CACHE_DIR``
(https://docs.jax.dev/en/latest/persistent_compilation_cache.html). This module imports no JAX:
the Pulumi program and the boot script's rendering read it; `fill` (``.fill``) compiles.

JAX treats its cache as trusted: whoever can write to it can run code in every process that
reads it (the guide's warning). Only the hosts write to it: the bucket grants its objects to the
hosts' account alone, and a simulated host's shared folder is writable by its root only. Every
Ray job on a host runs as that account, so any job can plant an entry that later jobs load;
`fill` (what `rayslice fit --fill-cache` runs on a deployer's machine) therefore never reads the
cache, and never replaces what is in it.
"""

from __future__ import annotations

# The variable JAX reads the cache's location from (config state ``jax_compilation_cache_dir``).
CACHE_DIR_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
# What else the hosts set, so that every step is cached, however small. JAX's defaults write an
# entry only for a computation that took at least 1 s to compile (``jax_persistent_cache_min_
# compile_time_secs``), and leave the smallest entry size to an override that "ensures that the
# minimum size is optimal for the filesystem" (``jax_persistent_cache_min_entry_size_bytes`` = 0);
# -1 there "disables the size restriction and prevents overrides" (jax/_src/config.py's help),
# as the guide's quick start sets it, with a minimum compile time of 0.
#
# And no XLA cache beside JAX's own: by default JAX also points XLA's GPU autotuning cache at a
# folder under the cache's location (``jax_persistent_cache_enable_xla_caches``, jax/_src/
# compiler.py's get_compile_options), which puts that path in every compile's options, and so in
# every entry's key (jax/_src/cache_key.py hashes the serialized options). A step `fill` compiled
# against a folder of its own would then never match a host's key; the GPU cache is of no use
# on a TPU. Any value that names none of XLA's caches turns them off.
SETTINGS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none",
    "JAX_HLO_SOURCE_FILE_CANONICALIZATION_REGEX": ".*/",
}
# The last setting keeps source files' names but drops their folders wherever JAX writes a
# location (jax/_src/interpreters/mlir.py, ``get_canonical_source_file``). JAX strips locations
# from a step before hashing it, except inside a Pallas kernel, which it serializes with them
# (jax/_src/tpu_custom_call.py): without it, the key of a step with a kernel would hold the
# folders the job and JAX were installed in, which differ between a deployer and the hosts (Ray
# unpacks a job's files under a folder of its session).
# What JAX adds to LIBTPU_INIT_ARGS when it starts on a machine with TPU chips
# (jax/_src/cloud_tpu_init.py, jax 0.10.2), which every cache key includes (cache_key.py's
# ``_hash_xla_flags`` reads the variable): a deployer compiling for a topology without chips
# must set it too for its keys to be a host's.
TPU_HOST_LIBTPU_ARGS = ("--xla_tpu_use_enhanced_launch_barrier=true",)
# The cache's folder in the bucket or the shared folder: the rest stays free for other uses.
FOLDER = "jax-compilation-cache"


def bucket_location(bucket: str) -> str:
    """The cache's location in `bucket` (a bucket's name), as JAX reads it."""
    return f"gs://{bucket}/{FOLDER}"


def folder_location(shared: str) -> str:
    """The cache's location in `shared`, a folder every host sees at the same path."""
    return f"{shared.rstrip('/')}/{FOLDER}"


def environment(location: str) -> dict[str, str]:
    """The environment that makes JAX cache every compiled step at `location`."""
    return {CACHE_DIR_VARIABLE: location, **SETTINGS}
