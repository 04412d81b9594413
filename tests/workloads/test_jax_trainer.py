"""jax_trainer's pieces that need no cluster: checkpoint names, orbax paths, the scaling config it
derives from a slice, and its command line. Its runs on a cluster are in
tests/integration/test_ray_train.py."""

from __future__ import annotations

import pytest

from rayslice.errors import EXIT_INVALID
from rayslice.workloads import _cluster, jax_trainer
from tests.workloads.test_workloads import slices_of, v6e_16


def test_a_checkpoint_folder_names_the_steps_done():
    name = jax_trainer.checkpoint_name(20)
    assert name == "step_000020"
    assert jax_trainer.checkpoint_step(f"/runs/r/{name}") == 20
    assert jax_trainer.checkpoint_step(f"bucket/runs/r/{name}/") == 20


def test_orbax_gets_back_the_scheme_ray_strips():
    assert jax_trainer.orbax_uri("gs://b/runs", "b/runs/r/step_000010") == "gs://b/runs/r/step_000010"
    assert jax_trainer.orbax_uri("/shared/runs", "/shared/runs/r/step_000010") == "/shared/runs/r/step_000010"


def test_the_scaling_config_is_one_worker_per_host_of_whole_slices():
    [tpu_slice] = slices_of(v6e_16("a"))
    elastic = jax_trainer.scaling_config(tpu_slice, 1, 2, 5.0)
    assert elastic.num_workers == (4, 8) and elastic.use_tpu
    assert (elastic.topology, elastic.accelerator_type) == ("4x4", "TPU-V6E")
    # Ray derived each worker's chips from the topology: a whole v6e host.
    assert elastic.resources_per_worker["TPU"] == 4
    assert elastic.elastic_resize_monitor_interval_s == 5.0
    assert jax_trainer.scaling_config(tpu_slice, 2, 2, 60.0).num_workers == 8


def test_more_min_slices_than_max_is_refused_before_training(monkeypatch, capsys):
    monkeypatch.setattr(_cluster, "connect", lambda: None)
    hosts = _cluster.tpu_hosts(v6e_16("a"))
    monkeypatch.setattr(_cluster, "tpu_hosts", lambda nodes=None: hosts)
    code = jax_trainer.main(["--storage-path", "/x", "--min-slices", "2", "--max-slices", "1"])
    assert code == EXIT_INVALID
    assert "--min-slices 2 is more than --max-slices 1" in capsys.readouterr().err


def test_the_storage_path_is_required():
    with pytest.raises(SystemExit) as exited:
        jax_trainer.build_parser().parse_args([])
    assert exited.value.code == 2
