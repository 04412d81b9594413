"""Ray's own TPU scheduling on a rayslice cluster, submitted with `rayslice run` as a user would:
`ray.util.tpu.slice_placement_group` over both slices of the shared simulated cluster of two Spot
tpu7x-16 slices (CPU head VM, 4 TPU hosts). Ray's `JaxTrainer` example, which needs a v6e-16, runs
on test_faults.py's v6e-16 (the suite's one slice of four hosts), and so does Ray's subslice
placement; the scripts are in ray_scripts.py.

The bundled `jax_trainer` job is tested through a preemption in test_recovery.py, on TPU VMs with
two multi-host v5p-16 Spot slices: one run that trains on both slices, shrinks to one from its
checkpoint, and grows back.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from rayslice import catalog
from rayslice.local.simulation.simulator import Simulation
from tests.integration import ray_scripts
from tests.integration.clusters import on, rayslice_run


@on("2 x tpu7x-16 spot")
def test_slice_placement_group_reserves_both_slices_one_bundle_per_host(
    cluster: Simulation, tmp_path: Path
) -> None:
    spec = cluster.spec()
    script = tmp_path / "slices" / "slices.py"
    script.parent.mkdir()
    version = catalog.reported_name(spec.accelerator_type).split("-")[0]  # v7x, as Ray names it
    script.write_text(f"TOPOLOGY = {spec.tpu.topology!r}\nVERSION = {version!r}\n{ray_scripts.SLICE_GROUP}")
    result = rayslice_run(cluster, str(script))
    assert result.returncode == 0
    [bundles] = re.findall(r"^BUNDLES (.+)$", result.stdout, re.M)
    placed = json.loads(bundles)
    # One bundle per host, on the TPU hosts of both slices, each slice's hosts once.
    tpu_hosts = {h.ip for h in cluster.plan.hosts if h.name != cluster.plan.head.name}
    assert len(placed) == 2 * spec.tpu.hosts and {ip for ip, _ in placed} == tpu_hosts
    per_slice = [sum(s == name for _, s in placed) for name in {s for _, s in placed}]
    assert per_slice == [spec.tpu.hosts, spec.tpu.hosts]
