"""jax_train's model under Ray Train's JaxTrainer: orbax checkpoints, restarts and elastic slices by Ray.

Ray Train (`ray.train.v2.jax.JaxTrainer`, `ScalingConfig(use_tpu=True, topology=...,
accelerator_type=...)`) reserves whole slices itself, one worker per host, and sets up
`jax.distributed` (and `MEGASCALE_*` across slices) in each worker. The training function is
jax_train's model and step (`jax_train.build_model`), wrapped the way Ray Train expects:

- **Checkpoints.** Every `--checkpoint-every` steps, and at once when Ray reports that a host of
  the run is being preempted (`ray.train.get_preemption_info`, which the hosts' preemption watcher
  feeds by draining their Ray nodes), every worker saves the state with orbax-checkpoint into the
  run's folder under `--storage-path` (a `gs://` bucket on Cloud TPU, a folder every host shares
  elsewhere), and rank 0 registers it with `ray.train.report`. Once Ray Train has taken the
  checkpoint saved on the notice, each worker of a preempted host says so to its watcher (a key
  in the GCS's key-value store, `names.JIT_CHECKPOINT_KEY_PREFIX`), which then stops Ray there at
  once rather than near the VM's deadline. A new attempt restores the latest one
  (`ray.train.get_checkpoint`) and prints `resumed from step K`; `--name` of an earlier run resumes
  that run.
- **The shrink.** A preemption ends the worker group: Ray Train restarts it without the preempted
  nodes. So once that checkpoint is committed, every worker leaves `jax.distributed` together,
  while every peer still lives, and then trains no more (a step trained now would be lost) until
  Ray Train stops it. Otherwise the survivors' `jax.distributed.shutdown`, which Ray Train calls
  as it stops the group, would wait for a peer that is gone, and Ray Train would give every
  survivor 5 s before it kills it. The run also shortens two of Ray Train's polls
  (`RAY_TRAIN_ENV`).
- **Failures.** `--max-failures` restarts after a worker error (`FailureConfig`); preemptions Ray
  sees as such are counted apart and retried without limit (Ray's default for
  `max_preemption_failures`). The hosts' watcher stops Ray before the VM stops, which Ray records
  as an expected termination: such a preemption counts as a worker error (docs/recovery.md).
- **Elastic slices.** With `--min-slices A --max-slices B`, training runs on as many whole slices
  as are alive, between A and B: when a slice is lost it goes on with the rest from the last
  checkpoint, and every `--resize-check-s` seconds Ray looks for more and grows back. Ray Train
  asks for the slices it lacks with `ray.autoscaler.sdk.request_resources`, which an elastic
  cluster's controller reads (docs/elastic.md); there, `--accelerator-type T --max-slices B`
  starts a run before any slice of type T exists, its shape taken from the catalog.

Rank 0 prints `workers W, devices D, from step K` when an attempt starts, then a line per step.

    python -m rayslice.workloads.jax_trainer --storage-path PATH [--steps N] [--min-slices A]
        [--max-slices B] [--checkpoint-every K] [--max-failures F] [--resize-check-s S] [--name NAME]
"""

from __future__ import annotations

import argparse
import logging
import os
import posixpath
import sys
import threading
import time
from collections.abc import Collection
from typing import Any, NoReturn, cast
from urllib.parse import urlparse

import ray
from ray.experimental.internal_kv import _internal_kv_put
from ray.train.v2._internal.execution.callback import ControllerCallback
from ray.train.v2._internal.execution.controller.state import (
    InitializingState,
    ReschedulingState,
    RestartingState,
    TrainControllerState,
)
from ray.train.v2.api.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.v2.jax import JaxTrainer

from rayslice import catalog, names
from rayslice.errors import InvalidInput
from rayslice.workloads import _cluster, jax_train

CHECKPOINT_PREFIX = "step_"  # a checkpoint's folder is step_<steps done>, zero-padded
KEEP_CHECKPOINTS = 2
# Ray Train's own settings (Ray 2.60, ray/train/v2/_internal/constants.py), shorter than its
# defaults so that it acts sooner on a preemption. Its controller reads them from its environment,
# which it gets from this driver's (`get_env_vars_to_propagate`, constants.py:178-190); a value the
# user set in the job's environment wins.
RAY_TRAIN_ENV = {
    # The controller polls its workers this often (default 2.0; constants.py:36-37, read at
    # controller.py:192-194, waited in `_poll_workers`, controller.py:421-438): a worker lost with
    # its node is seen within it.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    # Ray Train's PreemptionWatcher asks the GCS for draining nodes this often (default 5.0;
    # constants.py:69-70, read by callbacks/preemption_callback.py:32-38): the workers learn of the
    # drain, and save their checkpoint, within it.
    "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1",
}


# How long Ray Train's controller pauses between two looks at the cluster while the run waits for
# slices (`PauseWhileWaitingForSlices`). Its elastic policy reads the slices Ray holds for the run
# at most once a second (`GET_RESERVED_RESOURCES_INTERVAL_S`, scaling_policy/elastic.py:29-30), so
# a shorter pause sees nothing sooner.
WAITING_PAUSE_S = 0.5
# The states in which the controller asks its scaling policy whether to start (controller.py:
# 642-648, `_make_and_handle_scaling_decision_for_non_running_worker_group`).
WAITING_STATES = (InitializingState, ReschedulingState, RestartingState)


class PauseWhileWaitingForSlices(ControllerCallback):
    """Ray Train 2.60's controller spins while an elastic run waits for slices: in a waiting state
    its policy answers "not yet" (a `NoopDecision`), and the control loop (`TrainController.run`,
    controller.py:945-947) asks again at once, with no await in between. It held one core of the
    head at 100 % until the slices came: in tests/integration/test_elastic.py about 20 CPU-s, on
    a cloud for as long as flex-start or queued capacity takes. The controller calls this after
    every turn of its loop (`_set_state`); a turn that left the run in the same waiting state
    pauses here. Ray passes callbacks of a run's `RunConfig` that are not user callbacks to the
    controller for such workarounds (`_create_default_callbacks`, data_parallel_trainer.py:
    254-258). The pause blocks the controller's event loop, which the spin never yielded either."""

    def after_controller_state_update(
        self, previous_state: TrainControllerState, current_state: TrainControllerState
    ) -> None:
        if current_state is previous_state and isinstance(current_state, WAITING_STATES):
            time.sleep(WAITING_PAUSE_S)


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:06d}"


def checkpoint_step(path: str) -> int:
    """The steps done when the checkpoint at `path` was saved, from its folder's name."""
    return int(posixpath.basename(path.rstrip("/")).removeprefix(CHECKPOINT_PREFIX))


def orbax_uri(storage_path: str, fs_path: str) -> str:
    """Where orbax finds `fs_path`: Ray Train's paths drop the storage URI's scheme (`gs://`),
    which orbax needs back; a local path stays as it is."""
    scheme = urlparse(storage_path).scheme
    return f"{scheme}://{fs_path}" if scheme else fs_path


def show(line: str) -> None:
    """Print one line of a worker's progress, once and at once. Ray Train replaces `print` in its
    workers with one that logs the line and, when stdout is wrapped (as in a Ray worker), also
    prints it: the driver would show every line twice."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def checkpoint_committed(preempted: Collection[str], step: int) -> None:
    """Tell this host's preemption watcher, if this node is one of the `preempted`, that its
    just-in-time checkpoint (of `step`) is committed: it stops Ray here at once, and Ray Train
    restarts on the other slices. A surviving node says nothing: its key would let a later
    preemption of it stop Ray before that preemption's own checkpoint."""
    node_id = ray.get_runtime_context().get_node_id()
    if node_id in preempted:
        key = names.JIT_CHECKPOINT_KEY_PREFIX + node_id
        _internal_kv_put(key, str(step), namespace=names.JIT_CHECKPOINT_NAMESPACE)


def leave_worker_group(preempted: Collection[str], step: int) -> None:
    """Leave `jax.distributed` with every peer (a barrier: all workers call it on the same step),
    then say the checkpoint of `step` is committed, so Ray stops on the `preempted` nodes only once
    no survivor waits for them. Ray Train's own shutdown of the group then finds `jax.distributed`
    shut down (ray/train/v2/jax/config.py:136-147) and its workers free to stop at once, instead
    of the 5 s it grants each (`_shutdown_workers`, worker_group/state.py:154-166) while a survivor
    waits in `jax.distributed.shutdown` for a peer that is gone."""
    import jax

    jax.distributed.shutdown()
    checkpoint_committed(preempted, step)


def wait_to_be_stopped() -> NoReturn:
    """Train no more: Ray Train restarts the worker group without the preempted nodes, at once
    when their Ray stops, else at the drain's deadline (its PreemptingState, controller.py:816-868),
    and kills this worker then. Returning would end the run as if training were done."""
    while True:
        threading.Event().wait(3600)


def train_loop(config: dict[str, Any]) -> None:
    """One worker's training, on one host (Ray Train runs it on every host of the slices)."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    import ray.train
    from ray.train.v2.api.report_config import CheckpointUploadMode

    # orbax reports every save at INFO, on every host; the step lines would drown in it.
    logging.getLogger("absl").setLevel(logging.WARNING)
    context = ray.train.get_context()
    storage = context.get_storage()
    rank0 = context.get_world_rank() == 0
    model = jax_train.build_model(config["batch_per_device"], config["hidden"], config["seed"])
    state = (model.params, model.opt_state)
    checkpointer = ocp.StandardCheckpointer()
    start = 0
    latest = ray.train.get_checkpoint()
    if latest is not None:
        start = checkpoint_step(latest.path)
        # The target gives each array its sharding on this attempt's devices, which may be more
        # or fewer than the run that saved it had.
        state = checkpointer.restore(orbax_uri(config["storage_path"], latest.path), state)
        if rank0:
            show(f"resumed from step {start}")
    if rank0:
        show(f"workers {context.get_world_size()}, devices {jax.device_count()}, from step {start}")
    # Each host its own samples, seeded by where this attempt starts (as jax_train does).
    local_rng = np.random.default_rng([config["seed"], jax.process_index(), start])
    params, opt_state = state
    for i in range(start, config["steps"]):
        x, y = model.batch(local_rng)
        params, opt_state, loss = model.step(params, opt_state, x, y)
        done = i + 1
        if rank0:
            show(jax_train.step_line(i, float(loss)))
        # Every worker asks, the same number of times (Ray makes it a barrier).
        info = ray.train.get_preemption_info()
        preempted = set(info.preempted_node_ids) if info is not None else set()
        if done % config["checkpoint_every"] and done != config["steps"] and info is None:
            continue
        path = storage.build_checkpoint_path_from_name(checkpoint_name(done))
        # Every process writes its part into the shared folder (orbax's multi-host save).
        checkpointer.save(orbax_uri(config["storage_path"], path), (params, opt_state), force=True)
        checkpointer.wait_until_finished()
        saved = ray.train.Checkpoint(path, filesystem=storage.storage_filesystem) if rank0 else None
        metrics = {"step": done, "loss": float(loss), "workers": context.get_world_size()}
        # Already in the run's folder: Ray registers it where it is instead of copying it.
        ray.train.report(metrics, checkpoint=saved, checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
        if preempted:
            # A worker's results wait in a queue of one until the controller takes them: this
            # report returns once the controller has the one above, and with it the checkpoint.
            ray.train.report(metrics)
            if rank0:
                show(f"checkpoint of step {done} committed on the preemption notice")
            if done == config["steps"]:
                checkpoint_committed(preempted, done)  # the run is done: it returns
            else:
                leave_worker_group(preempted, done)
                wait_to_be_stopped()
    checkpointer.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jax_trainer", description=__doc__.splitlines()[0])
    jax_train.add_training_args(parser, "--batch-per-device", 32)
    parser.add_argument(
        "--storage-path",
        required=True,
        metavar="PATH",
        help="where Ray Train keeps the run and its checkpoints: gs://BUCKET/DIR on Cloud TPU, "
        "else a folder every host shares",
    )
    parser.add_argument("--name", help="the run's name under the storage path (default: a new one)")
    parser.add_argument(
        "--checkpoint-every", type=_at_least(1), default=10, metavar="K", help="save every K steps"
    )
    parser.add_argument(
        "--min-slices", type=_at_least(1), default=1, metavar="A", help="train on at least A slices"
    )
    parser.add_argument(
        "--max-slices",
        type=_at_least(1),
        metavar="B",
        help="and at most B (default: the slices of that type the cluster has now)",
    )
    parser.add_argument(
        "--max-failures", type=_at_least(0), default=3, metavar="F", help="restarts after worker errors"
    )
    parser.add_argument(
        "--resize-check-s",
        type=float,
        default=60.0,
        metavar="S",
        help="how often a run below --max-slices looks for more slices",
    )
    return parser


def _at_least(low: int) -> Any:
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def scaling_config(
    tpu_slice: _cluster.TpuSlice, min_slices: int, max_slices: int, resize_check_s: float
) -> ScalingConfig:
    """One worker per host of `min_slices` to `max_slices` whole slices of `tpu_slice`'s shape."""
    hosts = tpu_slice.expected_hosts
    workers = min_slices * hosts if min_slices == max_slices else (min_slices * hosts, max_slices * hosts)
    return ScalingConfig(
        num_workers=workers,
        use_tpu=True,
        topology=tpu_slice.topology,
        accelerator_type=f"TPU-{tpu_slice.generation.upper()}",  # Ray's spelling: TPU-V6E
        elastic_resize_monitor_interval_s=resize_check_s,
    )


def _shape(args: argparse.Namespace) -> tuple[_cluster.TpuSlice, int]:
    """The slices' shape and the most slices to train on. The shape is the chosen (or largest)
    complete slice's, and every slice of that type counts; with `--accelerator-type` and
    `--max-slices` and no complete slice of that type yet, the catalog's: Ray Train then asks
    for the slices (request_resources), which an elastic cluster adds (docs/elastic.md)."""
    wanted = args.accelerator_type
    if wanted is not None and args.max_slices is not None and args.slice_name is None:
        name = catalog.canonical_name(wanted)
        if not any(s.complete and catalog.canonical_name(s.pod_type) == name for s in _cluster.tpu_slices()):
            first = _cluster.catalog_slice(wanted)
            print(
                f"no complete {first.pod_type} slice yet: asking Ray for {args.max_slices} "
                "(an elastic cluster adds them)",
                flush=True,
            )
            return first, args.max_slices
    (first,) = _cluster.choose_slices(1, slice_name=args.slice_name, accelerator_type=wanted)
    present = [s for s in _cluster.tpu_slices() if s.pod_type == first.pod_type]
    return first, args.max_slices or len(present)


def run(args: argparse.Namespace) -> dict[str, Any]:
    first, max_slices = _shape(args)
    if not args.min_slices <= max_slices:
        raise InvalidInput(f"--min-slices {args.min_slices} is more than --max-slices {max_slices}")
    name = args.name or f"jax_trainer-{time.strftime('%Y%m%d-%H%M%S')}"
    for key, value in RAY_TRAIN_ENV.items():
        os.environ.setdefault(key, value)
    print(
        f"slices of {first.pod_type} (topology {first.topology}): {args.min_slices} to {max_slices}",
        flush=True,
    )
    print(f"run {name} in {args.storage_path}", flush=True)
    trainer = JaxTrainer(
        train_loop,
        train_loop_config={
            "steps": args.steps,
            "batch_per_device": args.batch_per_device,
            "hidden": args.hidden,
            "seed": 0,
            "checkpoint_every": args.checkpoint_every,
            "storage_path": args.storage_path,
        },
        scaling_config=scaling_config(first, args.min_slices, max_slices, args.resize_check_s),
        run_config=RunConfig(
            name=name,
            storage_path=args.storage_path,
            failure_config=FailureConfig(max_failures=args.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=KEEP_CHECKPOINTS),
            # Typed as user callbacks; RunConfig takes any RayTrainCallback (config.py:527).
            callbacks=[cast(Any, PauseWhileWaitingForSlices())],
        ),
    )
    result = trainer.fit()
    metrics = dict(result.metrics or {})
    where = result.checkpoint.path if result.checkpoint else None
    print(
        f"finished at step {metrics.get('step')}, loss {metrics.get('loss', float('nan')):.5f}, "
        f"on {metrics.get('workers')} workers; checkpoint {where}",
        flush=True,
    )
    return metrics


def main(argv: list[str] | None = None) -> int:
    return _cluster.run_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
