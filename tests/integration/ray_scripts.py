"""Scripts in the shape of Ray's own TPU documentation, which the integration tests submit with
`rayslice run` as a user would; nothing in them knows about the simulator.

- `JAXTRAINER`: Ray's `JaxTrainer` example (the API reference, docs.ray.io,
  ray.train.v2.jax.JaxTrainer: `ScalingConfig(use_tpu=True, num_workers=4, topology="4x4",
  accelerator_type="TPU-V6E", placement_strategy="SPREAD", resources_per_worker={"TPU": 4})`,
  `JAX_PLATFORMS=tpu` in the workers' runtime environment), its values unchanged, with MaxText's
  `main` (not installed here) replaced by a function that gathers every worker's JAX process index
  and device count and reports them, rank 0 with a checkpoint, as `ray.train.report`'s own example
  does. The test prepends `STORAGE_PATH`. It needs a v6e-16.
- `SLICE_GROUP`: `ray.util.tpu.slice_placement_group` over two whole slices, reporting the node of
  each bundle; the test prepends `TOPOLOGY` and `VERSION`, the slices' own.
- `SUBSLICE`: Ray's `subslice_placement_group`, a 2x4 subslice of a v6e-16.
"""

JAXTRAINER = """
import json
import os
import tempfile

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.v2.jax import JaxTrainer


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
        num_workers=4,
        topology="4x4",
        accelerator_type="TPU-V6E",
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


main()
"""


SLICE_GROUP = """
import json

import ray
from ray.util.tpu import slice_placement_group

ray.init()
# Two whole slices, one bundle per host.
group = slice_placement_group(topology=TOPOLOGY, accelerator_version=VERSION, num_slices=2)
ray.get(group.placement_group.ready(), timeout=120)
table = ray.util.placement_group_table(group.placement_group)
nodes = {n["NodeID"]: n for n in ray.nodes()}
bundles = [nodes[table["bundles_to_node_id"][i]] for i in sorted(table["bundles"])]
where = [[n["NodeManagerAddress"], n["Labels"]["ray.io/tpu-slice-name"]] for n in bundles]
print("BUNDLES " + json.dumps(where))
group.shutdown()
"""


SUBSLICE = """
import socket

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.util.tpu import SubslicePlacementGroup, subslice_placement_group

# Half of a v6e-16 (4x4, four 4-chip hosts): a 2x4 subslice of two hosts, ICI-connected.
sg = subslice_placement_group(subslice_topology="2x4", accelerator_version="v6e", chips_per_vm=4)
assert isinstance(sg, SubslicePlacementGroup)
ray.get(sg.placement_group.ready(), timeout=300)


@ray.remote(num_cpus=0, resources={"TPU": 4})
def host():
    return socket.gethostname()


# One task per bundle: a task left to pick its bundle may reuse one a finished task freed.
hosts = ray.get(
    [
        host.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=sg.placement_group, placement_group_bundle_index=i
            )
        ).remote()
        for i in range(sg.num_hosts)
    ]
)
print("SUBSLICE", sg.parent_topology, sg.subslice_topology, sg.num_hosts, sg.slice_name, sorted(hosts))
sg.shutdown()
"""
