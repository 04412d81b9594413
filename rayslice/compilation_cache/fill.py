"""Fill the cluster's compilation cache with a step compiled elsewhere (`fill`).

`rayslice fit` compiles a job's step ahead of time for the stack's topology; handing that
compilation to `fill` instead of calling ``lowered.compile()`` itself also writes the executable
into the cluster's cache, where hosts that compile the same step for the same devices find it
(`rayslice.compilation_cache`). A user's own program can do the same:

    lowered = jax.jit(step).lower(*abstract_args)
    filled = fill(lowered, "gs://BUCKET/jax-compilation-cache")
    print(filled.compiled.memory_analysis(), filled.added)

JAX decides what a cache entry's key is (the computation, the devices, the compile options, the
backend and jaxlib's version: "How it works" in JAX's guide), so an entry helps a host only if
the host's compile would have made the same key. JAX writes entries from process 0 only
(jax/_src/compiler.py, ``_cache_write``), which a deployer's single process is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import jax
from etils import epath
from jax.experimental.compilation_cache import compilation_cache

from rayslice.compilation_cache import CACHE_DIR_VARIABLE, SETTINGS

# JAX's cache entry files end so (jax/_src/lru_cache.py, ``_CACHE_SUFFIX``).
ENTRY_SUFFIX = "-cache"


@dataclass(frozen=True)
class Filled:
    """What `fill` did: the compiled step and the names of the entries it added to `location`
    (none when the cache held the step already)."""

    compiled: jax.stages.Compiled
    location: str
    added: tuple[str, ...]


def entries(location: str) -> set[str]:
    """The names of the cache entries at `location` (a folder or a gs:// URL); none if it is absent."""
    folder = epath.Path(location)
    if not folder.exists():
        return set()
    return {path.name for path in folder.iterdir() if path.name.endswith(ENTRY_SUFFIX)}


@contextmanager
def _cache_at(location: str) -> Iterator[None]:
    """JAX's persistent cache at `location` with the hosts' settings, for the block only. JAX opens
    its cache once per process; `reset_cache` makes it open `location` now, and the one configured
    before once the block is over."""
    # The hosts' settings as JAX's config states take them: each variable's name in lower case.
    values: dict[str, object] = {
        CACHE_DIR_VARIABLE.lower(): location,
        "jax_persistent_cache_min_compile_time_secs": float(
            SETTINGS["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]
        ),
        "jax_persistent_cache_min_entry_size_bytes": int(
            SETTINGS["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]
        ),
    }
    saved = {name: getattr(jax.config, name) for name in values}
    compilation_cache.reset_cache()
    try:
        for name, value in values.items():
            jax.config.update(name, value)
        yield
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


def fill(lowered: jax.stages.Lowered, location: str) -> Filled:
    """Compile `lowered` (``jax.jit(f).lower(...)``) with JAX's persistent cache at `location`, as
    the hosts have it, so the executable lands there; returns it with the entries it added.

    The process's in-memory compilations are cleared first (``jax.clear_caches``): a step this
    process has compiled before would otherwise come from memory and never reach the cache.
    """
    before = entries(location)
    jax.clear_caches()
    with _cache_at(location):
        compiled = lowered.compile()
    return Filled(compiled, location, tuple(sorted(entries(location) - before)))
