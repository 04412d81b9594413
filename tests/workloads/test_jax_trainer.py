"""jax_trainer's pieces that need no cluster: checkpoint names, orbax paths, the scaling config it
derives from a slice, and its command line. Its runs on a cluster are in
tests/integration/test_ray_train.py."""

from __future__ import annotations

import os

import pytest
import ray

from rayslice.errors import EXIT_INVALID, NoCluster
from rayslice.startup_scripts import preemption_watcher as watcher
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


def _args(*argv: str):
    return jax_trainer.build_parser().parse_args(["--storage-path", "/x", *argv])


def test_without_a_slice_of_the_type_the_shape_comes_from_the_catalog(monkeypatch, capsys):
    """On an elastic cluster with no v6e-16 slice yet, the run asks Ray for them: the scaling
    config is the one a present slice of that type gives."""
    [present] = slices_of(v6e_16("a"))
    monkeypatch.setattr(_cluster, "tpu_hosts", lambda nodes=None: [])
    first, most = jax_trainer._shape(_args("--accelerator-type", "v6e-16", "--max-slices", "2"))
    assert most == 2 and first.hosts == ()
    assert "no complete v6e-16 slice yet: asking Ray for 2" in capsys.readouterr().out
    assert jax_trainer.scaling_config(first, 1, 2, 5.0) == jax_trainer.scaling_config(present, 1, 2, 5.0)


def test_a_slice_of_the_type_present_is_the_shape_and_no_type_needs_one(monkeypatch):
    hosts = _cluster.tpu_hosts(v6e_16("a"))
    monkeypatch.setattr(_cluster, "tpu_hosts", lambda nodes=None: hosts)
    first, most = jax_trainer._shape(_args("--accelerator-type", "v6e-16", "--max-slices", "2"))
    assert (first.name, most) == ("a", 2)
    monkeypatch.setattr(_cluster, "tpu_hosts", lambda nodes=None: [])
    with pytest.raises(NoCluster):  # without --accelerator-type nothing says what to ask for
        jax_trainer._shape(_args("--max-slices", "2"))


def test_the_trainers_key_is_the_one_the_watcher_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """jax_trainer puts the key for its own node when that node is preempted, and only then (a
    survivor's key would let its own later preemption stop Ray too soon); the watcher's GCS
    client finds it there."""
    store: dict[tuple[bytes, bytes], bytes] = {}

    def put(key: str, value: str, overwrite: bool = True, *, namespace: str) -> bool:
        store[(key.encode(), namespace.encode())] = value.encode()
        return False

    class Context:
        def get_node_id(self) -> str:
            return "ab12"

    class Client:
        def internal_kv_exists(self, key: bytes, namespace: bytes, timeout: float) -> bool:
            return (key, namespace) in store

    monkeypatch.setattr(jax_trainer, "_internal_kv_put", put)
    monkeypatch.setattr(ray, "get_runtime_context", Context)
    gcs = watcher.RayGcs.__new__(watcher.RayGcs)
    gcs.client = Client()
    assert not gcs.checkpointed("ab12")
    jax_trainer.checkpoint_committed({"cd34"}, 57)  # another node preempted: this one survives
    assert store == {}
    jax_trainer.checkpoint_committed({"ab12", "cd34"}, 57)
    assert gcs.checkpointed("ab12") and not gcs.checkpointed("cd34")
    assert store == {(b"jit-checkpoint/ab12", b"rayslice"): b"57"}


def test_ray_trains_controller_gets_the_shorter_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's driver passes its Ray Train settings to Ray Train's controller (which reads them
    from the environment the driver gives it), and a value the user set stays."""
    from ray.train.v2._internal import constants

    assert set(jax_trainer.RAY_TRAIN_ENV) <= constants.ENV_VARS_TO_PROPAGATE  # names Ray reads
    environ = {k: v for k, v in os.environ.items() if k not in jax_trainer.RAY_TRAIN_ENV}
    monkeypatch.setattr(os, "environ", environ)  # what the run sets goes when the test ends
    environ["RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"] = "3"
    hosts = _cluster.tpu_hosts(v6e_16("a"))
    monkeypatch.setattr(_cluster, "connect", lambda: None)
    monkeypatch.setattr(_cluster, "tpu_hosts", lambda nodes=None: hosts)
    given: list[dict[str, str]] = []

    class Trainer:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def fit(self) -> object:
            given.append(constants.get_env_vars_to_propagate())  # what the controller gets
            return type("Result", (), {"metrics": {"step": 1}, "checkpoint": None})()

    monkeypatch.setattr(jax_trainer, "JaxTrainer", Trainer)
    assert jax_trainer.main(["--storage-path", "/x"]) == 0
    assert given == [
        {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "3"}
    ]


def test_ray_trains_controller_pauses_while_the_run_waits_for_slices_and_only_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray Train's controller asks its elastic policy again at once while a run waits for slices
    (no await in its loop): the run's callback, which Ray hands to the controller, pauses a turn
    that left the run in the same waiting state, and no other turn."""
    from ray.train.v2._internal.execution.controller.state import InitializingState, RunningState
    from ray.train.v2.jax import JaxTrainer

    hosts = _cluster.tpu_hosts(v6e_16("a"))
    monkeypatch.setattr(_cluster, "connect", lambda: None)
    monkeypatch.setattr(_cluster, "tpu_hosts", lambda nodes=None: hosts)
    controller_callbacks: list[object] = []

    class Trainer(JaxTrainer):  # Ray's own, up to the point where it would start the controller
        def fit(self) -> object:
            controller_callbacks.extend(self._create_default_callbacks())
            return type("Result", (), {"metrics": {"step": 1}, "checkpoint": None})()

    monkeypatch.setattr(jax_trainer, "JaxTrainer", Trainer)
    assert jax_trainer.main(["--storage-path", "/x", "--min-slices", "1", "--max-slices", "1"]) == 0
    [pause] = [c for c in controller_callbacks if isinstance(c, jax_trainer.PauseWhileWaitingForSlices)]

    slept: list[float] = []
    monkeypatch.setattr(jax_trainer.time, "sleep", slept.append)
    waiting, running = InitializingState(), RunningState()
    pause.after_controller_state_update(waiting, waiting)  # the policy said "not yet"
    assert slept == [jax_trainer.WAITING_PAUSE_S]
    pause.after_controller_state_update(waiting, InitializingState())  # a new attempt
    pause.after_controller_state_update(waiting, running)  # it started
    pause.after_controller_state_update(running, running)  # Ray polls a running group at its own pace
    assert slept == [jax_trainer.WAITING_PAUSE_S]


def test_the_workers_leave_jax_distributed_before_ray_stops_on_the_preempted_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the checkpoint on the notice is committed, every worker shuts `jax.distributed` down
    (all peers still alive), and only then may the preempted node's watcher stop Ray there: a
    survivor then has no peer to wait for when Ray Train shuts the group down."""
    import jax

    done: list[str] = []

    class Context:
        def get_node_id(self) -> str:
            return "ab12"

    monkeypatch.setattr(jax.distributed, "shutdown", lambda: done.append("jax.distributed.shutdown"))
    monkeypatch.setattr(jax_trainer, "_internal_kv_put", lambda key, value, **_: done.append(key))
    monkeypatch.setattr(ray, "get_runtime_context", Context)
    jax_trainer.leave_worker_group({"cd34"}, 57)  # a survivor: it leaves, and puts no key
    jax_trainer.leave_worker_group({"ab12"}, 57)
    assert done == ["jax.distributed.shutdown", "jax.distributed.shutdown", "jit-checkpoint/ab12"]
