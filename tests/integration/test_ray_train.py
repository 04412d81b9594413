"""Ray's own TPU scheduling on a rayslice cluster: Ray Train's JaxTrainer and `slice_placement_group`
on the shared simulated cluster of two Spot tpu7x-16 slices (CPU head VM, 4 TPU hosts), submitted
with `rayslice run` as a user would.

- A JaxTrainer script in the shape of Ray's own example (the `JaxTrainer` API reference,
  docs.ray.io, ray.train.v2.jax.JaxTrainer: `ScalingConfig(use_tpu=True, num_workers=4,
  topology="4x4", accelerator_type="TPU-V6E", placement_strategy="SPREAD", resources_per_worker=
  {"TPU": 4})`, `JAX_PLATFORMS=tpu` in the workers' runtime environment) with MaxText's `main`
  (not installed here) replaced by a function that gathers every worker's JAX process index and
  device count and reports them, rank 0 with a checkpoint, as `ray.train.report`'s own example
  does; nothing in it knows about the simulator. The example's slice is a v6e-16; this one's
  scaling config names the cluster's slices instead, as a user of a TPU7x cluster would write it
  (`num_workers=2, topology="2x2x2", accelerator_type="TPU-V7X"`). The same script reserves both
  slices with `ray.util.tpu.slice_placement_group` and reports the node of each bundle.

The bundled `jax_trainer` job is tested through a preemption in test_recovery.py, on TPU VMs with
two multi-host v5p-16 Spot slices: one run that trains on both slices, shrinks to one from its
checkpoint, and grows back.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

from rayslice.local.simulation.simulator import Simulation
from tests.integration.clusters import on, rayslice_run

RAY_DOCS_SCRIPT = """
import json
import os
import tempfile

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.v2.jax import JaxTrainer
from ray.util.tpu import slice_placement_group


def train_loop_per_worker(config):
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    import ray.train

    mine = jnp.array([jax.process_index(), jax.device_count(), jax.process_count()])
    everyone = multihost_utils.process_allgather(mine)
    metrics = {"workers": everyone.tolist()}
    with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
        with open(os.path.join(temp_checkpoint_dir, "workers.json"), "w") as f:
            json.dump(metrics, f)
        checkpoint = ray.train.Checkpoint.from_directory(temp_checkpoint_dir)
        # Only the rank 0 worker uploads the checkpoint.
        if ray.train.get_context().get_world_rank() == 0:
            ray.train.report(metrics, checkpoint=checkpoint)
        else:
            ray.train.report(metrics, checkpoint=None)


def main():
    ray.init()
    tpu_scaling_config = ScalingConfig(
        use_tpu=True,
        num_workers=2,
        topology="2x2x2",
        accelerator_type="TPU-V7X",
        placement_strategy="SPREAD",
        resources_per_worker={"TPU": 4},
    )
    trainer = JaxTrainer(
        train_loop_per_worker=train_loop_per_worker,
        scaling_config=tpu_scaling_config,
        run_config=RunConfig(
            name="docs_jaxtrainer",
            storage_path=STORAGE_PATH,
            worker_runtime_env={"env_vars": {"JAX_PLATFORMS": "tpu"}},
        ),
    )
    result = trainer.fit()
    print("JAXTRAINER " + json.dumps(result.metrics["workers"]))
    with result.checkpoint.as_directory() as saved:
        with open(os.path.join(saved, "workers.json")) as f:
            print("CHECKPOINT " + f.read())

    # Two whole tpu7x-16 slices, one bundle per host.
    group = slice_placement_group(topology="2x2x2", accelerator_version="v7x", num_slices=2)
    ray.get(group.placement_group.ready(), timeout=120)
    table = ray.util.placement_group_table(group.placement_group)
    nodes = {n["NodeID"]: n for n in ray.nodes()}
    bundles = [nodes[table["bundles_to_node_id"][i]] for i in sorted(table["bundles"])]
    where = [[n["NodeManagerAddress"], n["Labels"]["ray.io/tpu-slice-name"]] for n in bundles]
    print("BUNDLES " + json.dumps(where))
    group.shutdown()


main()
"""


@on("2 x tpu7x-16 spot")
def test_ray_docs_jaxtrainer_and_slice_placement_group_run_unchanged(
    cluster: Simulation, tmp_path: Path
) -> None:
    folder = tmp_path / "docs_jaxtrainer"
    folder.mkdir()
    storage = tempfile.mkdtemp(prefix="ray-train-", dir=cluster.plan.shared_dir)
    script = folder / "docs_jaxtrainer.py"
    script.write_text(f"STORAGE_PATH = {storage!r}\n{RAY_DOCS_SCRIPT}")
    try:
        result = rayslice_run(cluster, str(script))
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    assert result.returncode == 0
    [workers] = re.findall(r"^JAXTRAINER (.+)$", result.stdout, re.M)
    # Every worker sees the slice's devices and is one of its hosts' processes, one per host.
    tpu = cluster.spec().tpu
    assert sorted(map(tuple, json.loads(workers))) == [(i, tpu.chips, tpu.hosts) for i in range(tpu.hosts)]
    # Rank 0's checkpoint went through ray.train.report into the shared storage and back.
    [saved] = re.findall(r"^CHECKPOINT (.+)$", result.stdout, re.M)
    assert json.loads(saved) == {"workers": json.loads(workers)}
    [bundles] = re.findall(r"^BUNDLES (.+)$", result.stdout, re.M)
    placed = json.loads(bundles)
    # One bundle per host, on the TPU hosts of both slices, each slice's hosts once.
    tpu_hosts = {h.ip for h in cluster.plan.hosts if h.name != cluster.plan.head.name}
    assert len(placed) == 2 * tpu.hosts and {ip for ip, _ in placed} == tpu_hosts
    per_slice = [sum(s == name for _, s in placed) for name in {s for _, s in placed}]
    assert per_slice == [tpu.hosts, tpu.hosts]
