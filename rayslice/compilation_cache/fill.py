"""Fill the cluster's compilation cache with a step compiled elsewhere (`fill`).

`rayslice fit` compiles a job's step ahead of time for the stack's topology; handing that
compilation to `fill` instead of calling ``lowered.compile()`` itself also writes the executable
into the cluster's cache, where hosts that compile the same step for the same devices find it
(`rayslice.compilation_cache`). A user's own program can do the same:

    lowered = jax.jit(step).lower(*abstract_args)
    filled = fill(lowered, "gs://BUCKET/jax-compilation-cache")
    print(filled.compiled.memory_analysis(), filled.added)

`fill` trusts nothing it finds at the location: any job on the cluster can write there (the
hosts' account writes the cache), and JAX runs whatever executable an entry holds. So the step
is compiled against an empty cache folder of this process's own, never read from the location,
and the entries that compile wrote are then copied to the location create-only: a name that is
already there is left as it is (on GCS, ``ifGenerationMatch=0``; in a folder, ``O_EXCL``), and
neither read nor replaced.

JAX decides what a cache entry's key is (the computation, the devices and their topology, the
compile options, the backend's platform version, jaxlib's version and the XLA flags in the
environment: jax/_src/cache_key.py), so an entry helps a host only if the host's compile makes
the same key. JAX writes entries from process 0 only (jax/_src/compiler.py, ``_cache_write``),
which a deployer's single process is.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import jax
from etils import epath
from jax.experimental.compilation_cache import compilation_cache

from rayslice.compilation_cache import CACHE_DIR_VARIABLE, SETTINGS
from rayslice.observability.gcs import GcsBucket

# JAX's cache entry files end so (jax/_src/lru_cache.py, ``_CACHE_SUFFIX``).
ENTRY_SUFFIX = "-cache"
GCS_SCHEME = "gs://"


@dataclass(frozen=True)
class Filled:
    """What `fill` did: the compiled step, the entries its compile wrote that `location` lacked
    and now holds (`added`), and those `location` held already under the same name (`present`)."""

    compiled: jax.stages.Compiled
    location: str
    added: tuple[str, ...]
    present: tuple[str, ...] = ()


def entries(location: str) -> set[str]:
    """The names of the cache entries at `location` (a folder or a gs:// URL); none if it is absent."""
    folder = epath.Path(location)
    if not folder.exists():
        return set()
    return {path.name for path in folder.iterdir() if path.name.endswith(ENTRY_SUFFIX)}


def _host_config(location: str | None) -> dict[str, object]:
    """The hosts' settings as JAX's config states take them (each variable's name in lower case),
    with the cache at `location`, or without a cache for None."""
    return {
        CACHE_DIR_VARIABLE.lower(): location,
        "jax_persistent_cache_min_compile_time_secs": float(
            SETTINGS["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]
        ),
        "jax_persistent_cache_min_entry_size_bytes": int(
            SETTINGS["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]
        ),
        "jax_persistent_cache_enable_xla_caches": SETTINGS["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"],
        "jax_hlo_source_file_canonicalization_regex": SETTINGS["JAX_HLO_SOURCE_FILE_CANONICALIZATION_REGEX"],
    }


@contextmanager
def _configured(values: dict[str, object]) -> Iterator[None]:
    saved = {name: getattr(jax.config, name) for name in values}
    try:
        for name, value in values.items():
            jax.config.update(name, value)
        yield
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)


@contextmanager
def as_on_the_hosts() -> Iterator[None]:
    """The hosts' settings for the block, the cache's location aside: what a step is lowered
    under (the source files' names in a Pallas kernel) when its entry is to match a host's."""
    values = _host_config(None)
    del values[CACHE_DIR_VARIABLE.lower()]
    with _configured(values):
        yield


@contextmanager
def hosts_cache_at(location: str) -> Iterator[None]:
    """JAX's persistent cache at `location` with the hosts' settings, for the block only. JAX opens
    its cache once per process; `reset_cache` makes it open `location` now, and the one configured
    before once the block is over."""
    compilation_cache.reset_cache()
    try:
        with _configured(_host_config(location)):
            yield
    finally:
        compilation_cache.reset_cache()


def _upload(source: Path, location: str) -> bool:
    """Copy one entry to `location` unless an object of its name is there; True if copied."""
    data = source.read_bytes()
    if location.startswith(GCS_SCHEME):
        bucket, _, prefix = location[len(GCS_SCHEME) :].partition("/")
        try:
            GcsBucket.default(bucket).write(f"{prefix.strip('/')}/{source.name}".lstrip("/"), data)
        except FileExistsError:
            return False
        return True
    folder = Path(location)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        handle = os.open(folder / source.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    return True


def fill(lowered: jax.stages.Lowered, location: str) -> Filled:
    """Compile `lowered` (``jax.jit(f).lower(...)``, lowered under `as_on_the_hosts`) as a host
    would, against an empty cache of this process's own, and copy the entries that wrote to
    `location` create-only; returns the compiled step with what was added and what `location`
    held already.

    The process's in-memory compilations are cleared first (``jax.clear_caches``): a step this
    process has compiled before would otherwise come from memory and never reach the cache.
    """
    jax.clear_caches()
    with tempfile.TemporaryDirectory(prefix="rayslice-fill-") as own:
        with hosts_cache_at(own):
            compiled = lowered.compile()
        added: list[str] = []
        present: list[str] = []
        for entry in sorted(Path(own).iterdir()):
            if entry.name.endswith(ENTRY_SUFFIX):
                (added if _upload(entry, location) else present).append(entry.name)
    return Filled(compiled, location, tuple(added), tuple(present))
