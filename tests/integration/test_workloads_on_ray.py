"""The bundled workloads, submitted with `rayslice run`, on simulated slices.

Two simulations for the module, both booted by the real boot script with Ray's own TPU detection
reading the fake metadata: two v6e-16 slices with a CPU head VM (nine hosts, Ray token auth on)
and one single-host v6e-4. Every job goes through the `rayslice` command and the Ray Jobs API,
as a user's would.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rayslice.local.simulation.simulator import Simulation

RAYSLICE = str(Path(sys.executable).with_name("rayslice"))


@pytest.fixture(scope="module")
def cluster(simulate):
    """2 x v6e-16 with a CPU head VM: 9 hosts, 32 chips."""
    sim = simulate(acceleratorType="v6e-16", slices=2)
    yield sim
    sim.destroy()


@pytest.fixture(scope="module")
def single(simulate):
    """One v6e-4 host (4 chips), its own Ray head."""
    sim = simulate(acceleratorType="v6e-4")
    yield sim
    sim.destroy()


def rayslice_run(
    sim: Simulation, target: str, *job_args: str, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`rayslice run TARGET --address URL [--token-file F] [-- JOB_ARGS]`, as a user types it."""
    argv = [target, "--address", sim.dashboard_url()]
    if sim.token_file.exists():
        argv += ["--token-file", str(sim.token_file)]
    argv += ["--", *job_args] if job_args else []
    result = subprocess.run(
        [RAYSLICE, "run", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": str(Path(sys.executable).parent), "HOME": os.environ.get("HOME", "/root")},
    )
    print(result.stdout[-5000:], result.stderr[-3000:])  # shown when a test fails
    return result


def losses(output: str) -> list[float]:
    return [float(x) for x in re.findall(r"^step +\d+ +loss ([0-9.]+)$", output, re.M)]


def test_jax_multihost_sees_every_chip_of_the_slice_on_every_host(cluster):
    result = rayslice_run(cluster, "jax_multihost")
    assert result.returncode == 0
    assert "[16, 16, 16, 16]" in result.stdout.splitlines()


def test_jax_single_host_on_a_v6e_4_returns_4(single):
    result = rayslice_run(single, "jax_single_host")
    assert result.returncode == 0
    assert result.stdout.splitlines()[-1] == "4"


def test_jax_multislice_over_two_v6e_16_slices(cluster):
    result = rayslice_run(cluster, "jax_multislice")
    assert result.returncode == 0
    hosts = re.findall(
        r"^slice_id=(\d) slice=\S+ worker=\d process_id=(\d+) devices=(\d+) "
        r"MEGASCALE_SLICE_ID=(\d)$",
        result.stdout,
        re.M,
    )
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
    assert re.search(
        r"^16 x cpu, global batch 512: [0-9.]+ steps/s, \d+ samples/s, [0-9.]+ GFLOP/s", result.stdout, re.M
    )


def test_jax_train_resumes_from_its_checkpoint_on_a_slice(cluster):
    # Under /var/tmp: every simulated host sees it (each has its own /tmp), as every TPU host sees
    # the same gs:// bucket.
    checkpoints = Path(tempfile.mkdtemp(prefix="rayslice-checkpoints-", dir="/var/tmp"))
    try:
        options = ("--checkpoint-dir", str(checkpoints), "--checkpoint-every", "3")
        first = rayslice_run(cluster, "jax_train", "--steps", "6", *options)
        assert first.returncode == 0
        assert "resumed from step" not in first.stdout
        second = rayslice_run(cluster, "jax_train", "--steps", "10", *options)
        assert second.returncode == 0
        assert re.search(r"resumed from step 6$", second.stdout, re.M)
        steps = [int(n) for n in re.findall(r"^step +(\d+) +loss", second.stdout, re.M)]
        assert steps == [6, 7, 8, 9]
        assert losses(second.stdout)[0] < losses(first.stdout)[0]
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)


def test_a_job_asking_for_more_chips_than_a_host_has_fails_clearly(single):
    result = rayslice_run(single, "jax_single_host", "--chips", "8", timeout=120)
    assert result.returncode == 1
    assert "asks for 8 TPU chips on one host, but the largest host in the cluster has 4" in result.stdout


def test_a_users_script_runs_with_its_directory(cluster, tmp_path):
    (tmp_path / "data.txt").write_text("from the working dir")
    script = tmp_path / "mine.py"
    script.write_text(
        "import sys\nfrom rayslice.workloads import _cluster\n_cluster.connect()\n"
        "print(open('data.txt').read(), len(_cluster.tpu_slices()), sys.argv[1:])\n"
    )
    result = rayslice_run(cluster, str(script), "--flag", "x y")
    assert result.returncode == 0
    assert "from the working dir 2 ['--flag', 'x y']" in result.stdout


# ---- PyTorch/XLA (the `xla` extra, installed by scripts/setup.sh) --------------------------------


def test_xla_single_prints_a_tensor_on_an_xla_device(cluster):
    result = rayslice_run(cluster, "xla_single")
    assert result.returncode == 0
    assert "xla:0" in result.stdout.splitlines()
    assert "device='xla:0')" in result.stdout


def test_xla_multihost_runs_one_task_per_chip_of_a_v6e_16(cluster):
    result = rayslice_run(cluster, "xla_multihost", "--slice", "rayslice-slice-0")
    assert result.returncode == 0
    assert "16 tasks on 16 distinct chips" in result.stdout.splitlines()


def test_xla_train_loss_falls(cluster):
    result = rayslice_run(cluster, "xla_train", "--steps", "12")
    assert result.returncode == 0
    curve = losses(result.stdout)
    assert len(curve) == 12
    assert sum(curve[-3:]) / 3 < curve[0]


def test_a_single_host_job_on_v6e_16_slices_is_refused_before_it_is_submitted(cluster):
    result = rayslice_run(cluster, "jax_single_host", timeout=120)
    assert result.returncode == 2, result.stderr
    assert "jax_single_host needs a single-host slice" in result.stderr
    assert "Run jax_multihost instead" in result.stderr
    assert "submitted" not in result.stderr  # refused before anything went to the cluster


def test_jax_train_step_lines_arrive_while_the_job_runs(cluster):
    """Read `rayslice run`'s output as it comes: the first step line is there while the job (and
    so the command) is still running, not all at once at the end."""
    argv = [RAYSLICE, "run", "jax_train", "--address", cluster.dashboard_url()]
    if cluster.token_file.exists():
        argv += ["--token-file", str(cluster.token_file)]
    run = subprocess.Popen(
        [*argv, "--", "--steps", "200"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={"PATH": str(Path(sys.executable).parent), "HOME": os.environ.get("HOME", "/root")},
    )
    try:
        assert run.stdout is not None
        lines = iter(run.stdout.readline, "")
        first = next(line for line in lines if re.match(r"step +\d+ +loss", line))
        assert run.poll() is None  # 199 steps and the summary are still to come
        assert first.startswith("step   0  loss")
        rest = list(lines)
        assert run.wait(timeout=600) == 0
    finally:
        run.kill()
    assert len(losses("".join([first, *rest]))) == 200
    assert re.search(r"^16 x cpu, global batch 512: ", "".join(rest), re.M)
