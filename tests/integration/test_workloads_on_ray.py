"""The bundled workloads, submitted with `rayslice run`, on a real Ray cluster shaped like TPU slices.

One cluster for the module: two v6e-16 slices (4 hosts x 4 chips each) and one v6e-4 host, nine
real Ray nodes labelled by Ray's own TPU detection (see ray_tpu_nodes.py). Every job goes through
the `rayslice` command and the Ray Jobs API, as a user's would.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.ray_tpu_nodes import TpuRayCluster

pytestmark = pytest.mark.slow
RAYSLICE = str(Path(sys.executable).with_name("rayslice"))


@pytest.fixture(scope="module")
def cluster():
    nodes = TpuRayCluster([("slice-a", "v6e-16"), ("slice-b", "v6e-16"), ("single", "v6e-4")])
    nodes.start()
    yield nodes
    nodes.stop()


def rayslice_run(cluster: TpuRayCluster, target: str, *job_args: str,
                 timeout: float = 600) -> subprocess.CompletedProcess:
    """`rayslice run TARGET --address URL [-- JOB_ARGS]`, as a user types it."""
    argv = [target, "--address", cluster.dashboard_url, *(("--", *job_args) if job_args else ())]
    result = subprocess.run([RAYSLICE, "run", *argv],
                            capture_output=True, text=True, timeout=timeout,
                            env={"PATH": str(Path(sys.executable).parent), "RAY_AUTH_MODE": "disabled"})
    print(result.stdout[-5000:], result.stderr[-3000:])  # shown when a test fails
    return result


def losses(output: str) -> list[float]:
    return [float(x) for x in re.findall(r"^step +\d+ +loss ([0-9.]+)$", output, re.M)]


def test_jax_multihost_sees_every_chip_of_the_slice_on_every_host(cluster):
    result = rayslice_run(cluster, "jax_multihost")
    assert result.returncode == 0
    assert "[16, 16, 16, 16]" in result.stdout.splitlines()


def test_jax_single_host_on_a_v6e_4_returns_4(cluster):
    result = rayslice_run(cluster, "jax_single_host", "--accelerator-type", "v6e-4")
    assert result.returncode == 0
    assert result.stdout.splitlines()[-1] == "4"


def test_jax_multislice_over_two_v6e_16_slices(cluster):
    result = rayslice_run(cluster, "jax_multislice")
    assert result.returncode == 0
    hosts = re.findall(r"^slice_id=(\d) slice=\S+ worker=\d process_id=(\d+) devices=(\d+) "
                       r"MEGASCALE_SLICE_ID=(\d)$", result.stdout, re.M)
    assert len(hosts) == 8
    assert {h[0] for h in hosts} == {"0", "1"} == {h[3] for h in hosts}
    assert sorted(int(h[1]) for h in hosts) == list(range(8))
    assert {h[2] for h in hosts} == {"32"}


def test_jax_train_loss_falls_and_flops_are_reported(cluster):
    result = rayslice_run(cluster, "jax_train", "--steps", "12")
    assert result.returncode == 0
    curve = losses(result.stdout)
    assert len(curve) == 12
    assert sum(curve[-3:]) / 3 < curve[0]
    assert re.search(r"^16 x cpu, global batch 512: [0-9.]+ steps/s, \d+ samples/s, [0-9.]+ GFLOP/s",
                     result.stdout, re.M)


def test_a_job_asking_for_more_chips_than_a_host_has_fails_clearly(cluster):
    result = rayslice_run(cluster, "jax_single_host", "--chips", "8", timeout=120)
    assert result.returncode == 1
    assert "asks for 8 TPU chips on one host, but the largest host in the cluster has 4" in result.stdout


def test_a_users_script_runs_with_its_directory(cluster, tmp_path):
    (tmp_path / "data.txt").write_text("from the working dir")
    script = tmp_path / "mine.py"
    script.write_text("import sys\nfrom rayslice.workloads import _cluster\n_cluster.connect()\n"
                      "print(open('data.txt').read(), len(_cluster.tpu_slices()), sys.argv[1:])\n")
    result = rayslice_run(cluster, str(script), "--flag", "x y")
    assert result.returncode == 0
    assert "from the working dir 3 ['--flag', 'x y']" in result.stdout


# ---- PyTorch/XLA (needs the `xla` extra: torch 2.9.0 + torch_xla 2.9.0) ------------------------

def test_xla_single_prints_a_tensor_on_an_xla_device(cluster):
    pytest.importorskip("torch_xla")
    result = rayslice_run(cluster, "xla_single")
    assert result.returncode == 0
    assert "xla:0" in result.stdout.splitlines()
    assert "device='xla:0')" in result.stdout


def test_xla_multihost_runs_one_task_per_chip_of_a_v6e_16(cluster):
    pytest.importorskip("torch_xla")
    result = rayslice_run(cluster, "xla_multihost", "--slice", "slice-a")
    assert result.returncode == 0
    assert "16 tasks on 16 distinct chips" in result.stdout.splitlines()


def test_xla_train_loss_falls(cluster):
    pytest.importorskip("torch_xla")
    result = rayslice_run(cluster, "xla_train", "--steps", "12")
    assert result.returncode == 0
    curve = losses(result.stdout)
    assert len(curve) == 12
    assert sum(curve[-3:]) / 3 < curve[0]
