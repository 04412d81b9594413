"""`rayslice.compilation_cache`: the settings the hosts give JAX, and `fill`, which puts a step
compiled elsewhere where the hosts look. Real JAX on this machine's CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from rayslice import compilation_cache
from rayslice.compilation_cache.fill import entries, fill
from rayslice.errors import InvalidInput
from rayslice.startup_scripts import RenderOptions

# The step as a host's job runs it: the same function, called on an array of the same shape.
STEP = """
import jax, jax.numpy as jnp
def _step(x):
    return jnp.tanh(x @ x.T).sum()
print(float(jax.jit(_step)(jnp.ones((24, 24)))))
"""


def _step(x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ x.T).sum()


def _lowered() -> jax.stages.Lowered:
    return jax.jit(_step).lower(jax.ShapeDtypeStruct((24, 24), jnp.float32))


def _host_runs_the_step(location: Path) -> None:
    """The step in a new process with the environment the boot script gives Ray's jobs."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **compilation_cache.environment(str(location))}
    subprocess.run([sys.executable, "-c", STEP], env=env, check=True, capture_output=True, timeout=120)


def test_fill_writes_the_step_where_a_host_finds_it_and_compiles_nothing(tmp_path):
    location = tmp_path / compilation_cache.FOLDER
    filled = fill(_lowered(), str(location))
    assert len(filled.added) == 1 and filled.added[0].startswith("jit__step-")
    assert filled.compiled.cost_analysis()  # the compiled step, for `rayslice fit` to read
    assert fill(_lowered(), str(location)).added == ()  # there already: nothing added
    # A host's job compiling the same step finds it: on a miss it would write its own entry (the
    # hosts' settings cache every compiled step), under another key only if the keys differed.
    _host_runs_the_step(location)
    assert {e for e in entries(str(location)) if e.startswith("jit__step-")} == set(filled.added)


def test_fill_never_reads_the_location_and_never_replaces_an_entry_there(tmp_path):
    """Any job on the cluster can write the cache, so fit's compile must not come from it: an entry
    planted under the step's own key is neither loaded (the step is compiled) nor replaced."""
    (name,) = fill(_lowered(), str(tmp_path / "clean")).added
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / name).write_bytes(b"not an executable")
    filled = fill(_lowered(), str(planted))
    assert filled.added == () and filled.present == (name,)
    assert filled.compiled.cost_analysis()  # compiled here: the planted bytes would not load
    assert (planted / name).read_bytes() == b"not an executable"


def test_an_entrys_key_does_not_depend_on_where_the_cache_lies(tmp_path):
    """JAX by default puts a folder under the cache's location into every compile's options, and so
    into the key: the hosts' settings turn that off, so a step filled through a folder of fit's own
    has the key a host computes with its cache at the bucket."""
    first = fill(_lowered(), str(tmp_path / "a")).added
    assert first and fill(_lowered(), str(tmp_path / "elsewhere/b")).added == first
    env_key = _host_key(tmp_path / "host-cache")
    assert env_key + "-cache" in first


def _host_key(location: Path) -> str:
    """The key a host's job computes for the step, with the cache where the boot script puts it."""
    _host_runs_the_step(location)
    (entry,) = {e for e in entries(str(location)) if e.startswith("jit__step-")}
    return entry.removesuffix("-cache")


def _settings() -> list[object]:
    names = ["jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs"]
    return [getattr(jax.config, name) for name in names]


def test_fill_leaves_the_processs_own_cache_settings_as_they_were(tmp_path):
    before = _settings()
    fill(_lowered(), str(tmp_path / "cache"))
    assert _settings() == before


def test_the_hosts_cache_every_step_however_small():
    env = compilation_cache.environment("gs://b/f")
    assert env == {
        "JAX_COMPILATION_CACHE_DIR": "gs://b/f",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
        "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none",
        "JAX_HLO_SOURCE_FILE_CANONICALIZATION_REGEX": ".*/",
    }
    assert compilation_cache.bucket_location("b") == f"gs://b/{compilation_cache.FOLDER}"
    assert compilation_cache.folder_location("/x/shared/") == f"/x/shared/{compilation_cache.FOLDER}"


def test_a_rendered_cache_location_must_be_a_path_every_host_sees():
    with pytest.raises(InvalidInput, match="absolute path"):
        RenderOptions(compilation_cache="relative/cache")
