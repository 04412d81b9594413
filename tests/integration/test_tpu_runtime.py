"""The simulated TPU runtime: unmodified programs see a simulated host's chips as on a TPU host.

The guide's own scripts (tests/fixtures/guide, verbatim) run on simulated slices booted by the
real boot script, submitted with `rayslice run` as a user would, on the shared clusters: a v5p-16
on TPU VMs (2 hosts x 4 chips, its head on worker 0) and a v6e-4 (one host). A first test checks
the runtime alone, without Ray: two processes in a mount namespace that has `/dev/accel*` join one
JAX program by themselves.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rayslice import catalog
from rayslice.local.host import tpu_runtime
from rayslice.local.simulation.simulator import Simulation
from tests.integration.clusters import on
from tests.integration.test_workloads_on_ray import rayslice_run


def run_script(sim: Simulation, script: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`rayslice run SCRIPT --address URL [--token-file F]`, as a user types it."""
    return rayslice_run(sim, str(script), timeout=timeout)


def guide_script(fixtures_dir: Path, name: str, tmp_path: Path) -> Path:
    """The guide's script `name`, unchanged, alone in a folder (rayslice run uploads the folder)."""
    folder = tmp_path / name.removesuffix(".py")
    folder.mkdir()
    script = folder / name
    script.write_text((fixtures_dir / "guide" / f"{name}.txt").read_text())
    return script


def printed_lists(output: str) -> list[list[int]]:
    return [ast.literal_eval(line) for line in output.splitlines() if re.fullmatch(r"\[[\d, ]*\]", line)]


# ---- the runtime alone --------------------------------------------------------------------------

TWO_PROCESSES = r"""
set -e
mount -t tmpfs tmpfs "$WORK"
mkdir "$WORK/u" "$WORK/w"
mount -t overlay overlay -o "lowerdir=/dev,upperdir=$WORK/u,workdir=$WORK/w" /dev
for i in 0 1 2 3; do : >"/dev/accel$i"; done
TPU_WORKER_ID=0 "$PYTHON" "$PROGRAM" "$MODE" >"$OUT/0" 2>&1 &
TPU_WORKER_ID=1 "$PYTHON" "$PROGRAM" "$MODE" >"$OUT/1" 2>&1
wait
"""

PROGRAM = """
import sys
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

if sys.argv[1] == "explicit":
    jax.distributed.initialize()
mesh = jax.make_mesh((jax.device_count(),), ("d",))
ones = jax.make_array_from_process_local_data(
    NamedSharding(mesh, PartitionSpec("d")), jnp.ones((jax.local_device_count(),))
)
print("RESULT", jax.process_index(), jax.device_count(), jax.local_device_count(), int(jnp.sum(ones)))
"""


@pytest.mark.parametrize("mode", ["implicit", "explicit"])
def test_two_hosts_worth_of_processes_join_one_jax_program(tmp_path, mode):
    """Whole-host processes of a 2-host slice see 8 devices, with or without initialize()."""
    (tmp_path / "work").mkdir()
    (tmp_path / "out").mkdir()
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    env = {
        **tpu_runtime.environment(catalog.generation("v6e")),
        tpu_runtime.COORDINATOR_PORT_VAR: "18476",  # not the port a simulated host may be using
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "TPU_WORKER_HOSTNAMES": "127.0.0.1,127.0.0.1",
        "WORK": str(tmp_path / "work"),
        "OUT": str(tmp_path / "out"),
        "PYTHON": sys.executable,
        "PROGRAM": str(program),
        "MODE": mode,
    }
    subprocess.run(
        ["unshare", "--mount", "--fork", "bash", "-c", textwrap.dedent(TWO_PROCESSES)],
        env=env,
        timeout=300,
        check=True,
    )
    outputs = [(tmp_path / "out" / str(i)).read_text() for i in (0, 1)]
    results = sorted(re.findall(r"^RESULT .*$", "\n".join(outputs), re.M))
    assert results == ["RESULT 0 8 4 8", "RESULT 1 8 4 8"], outputs
    assert not Path("/dev/accel0").exists()  # the chips stayed inside the namespace


# ---- the guide's scripts on simulated slices -----------------------------------------------------


@on("v6e-4")
def test_guide_single_host_jax_script_prints_the_hosts_chips(cluster, fixtures_dir, tmp_path):
    result = run_script(cluster, guide_script(fixtures_dir, "ray-jax-single-host.py", tmp_path))
    assert result.returncode == 0
    assert str(cluster.spec().tpu.chips_per_host) in result.stdout.splitlines()


@on("v5p-16 tpu-vm")
def test_guide_multi_host_jax_script_sees_the_whole_slice_from_every_host(cluster, fixtures_dir, tmp_path):
    result = run_script(cluster, guide_script(fixtures_dir, "ray-jax-multi-host.py", tmp_path))
    assert result.returncode == 0
    [counts] = printed_lists(result.stdout)
    # One Ray cluster spans the slice, so the script's `ray.available_resources()["TPU"]` is the
    # slice's chips (the guide's comment says 4: there, each host runs the script against its own
    # Ray): that many tasks of 4 chips, one per host at a time; each sees every device of the slice.
    chips = cluster.spec().tpu.chips
    assert counts == [chips] * chips


@on("v5p-16 tpu-vm")
def test_rays_tpu_helpers_answer_inside_a_task_as_on_a_tpu_host(cluster, tmp_path):
    script = tmp_path / "helpers.py"
    script.write_text(
        textwrap.dedent(
            """
            import glob
            import os

            import ray
            import ray.util.tpu

            @ray.remote(resources={"TPU": 4})
            def helpers():
                # A v5p host's chips are VFIO groups, as on hardware: Ray counts those whose PCI
                # vendor is Google's.
                assert not glob.glob("/dev/accel*") and os.listdir("/dev/vfio")
                return ray.util.tpu.get_current_pod_worker_count(), ray.util.tpu.get_num_tpu_chips_on_node()

            print("HELPERS", ray.get(helpers.remote()))
            """
        )
    )
    result = run_script(cluster, script)
    assert result.returncode == 0
    tpu = cluster.spec().tpu
    assert f"HELPERS ({tpu.hosts}, {tpu.chips_per_host})" in result.stdout.splitlines()


@on("v6e-4")
def test_guide_pytorch_xla_single_device_script_prints_an_xla_device(cluster, fixtures_dir, tmp_path):
    result = run_script(cluster, guide_script(fixtures_dir, "workload.py", tmp_path))
    assert result.returncode == 0
    assert "xla:0" in result.stdout.splitlines()
    assert "device='xla:0')" in result.stdout


@on("v6e-4")
def test_guide_torch_xla_launch_runs_on_every_chip_of_the_host(cluster, fixtures_dir, tmp_path):
    result = run_script(cluster, guide_script(fixtures_dir, "workload-multi-device.py", tmp_path))
    assert result.returncode == 0
    # On CPU, torch_xla.launch runs one thread per device (xla:0..xla:3); a TPU host runs one
    # process per chip, each printing xla:0. Either way: four devices ran the function. The
    # threads print at once, so one line may hold two devices ("xla:2xla:3"): count the devices
    # printed bare (`print(t.device)`), not the lines.
    chips = [str(i) for i in range(cluster.spec().tpu.chips_per_host)]
    devices = re.findall(r"(?<!')xla:(\d+)", result.stdout)
    assert sorted(devices) == chips
    assert sorted(re.findall(r"device='xla:(\d+)'", result.stdout)) == chips
