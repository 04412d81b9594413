"""A job resubmitted on a simulated slice loads its compiled steps from the cluster's cache.

Every host's Ray hands its jobs JAX's persistent compilation cache in the simulation's shared
folder (`rayslice.compilation_cache`), the bucket's stand-in: the first run of a job compiles
and writes its steps there (from JAX's process 0), the second finds every one of them and
compiles nothing, on both hosts of the slice.
"""

from __future__ import annotations

from rayslice import compilation_cache
from rayslice.compilation_cache.fill import entries
from tests.integration.clusters import on, raylet_environment, rayslice_run

# A width no other test trains, so that the first run finds none of its steps in the cache.
JOB = ("--steps", "3", "--hidden", "72", "--batch-per-device", "8")


@on("v5p-16 tpu-vm")
def test_a_resubmitted_job_compiles_nothing_and_reads_its_steps_from_the_shared_cache(cluster):
    location = compilation_cache.folder_location(cluster.plan.shared_dir)
    for host in cluster.plan.hosts:  # what every job on every host inherits
        environment = raylet_environment(cluster, host.name)
        assert {k: environment.get(k) for k in compilation_cache.environment(location)} == (
            compilation_cache.environment(location)
        )
    before = entries(location)
    first = rayslice_run(cluster, "jax_train", *JOB)
    assert first.returncode == 0
    written = entries(location)
    assert any(name.startswith("jit_") for name in written - before), "the first run cached nothing"

    second = rayslice_run(cluster, "jax_train", *JOB)
    assert second.returncode == 0
    # With every compiled step cached (no minimum compile time or size), a miss would have added
    # an entry: none was, so each step came from the cache.
    assert entries(location) == written
