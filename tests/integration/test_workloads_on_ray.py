"""The bundled workloads, submitted with `rayslice run`, on simulated slices.

Each job runs on the smallest of the shared simulations that shows what it checks, all booted by
the real boot script with Ray's own TPU detection reading the fake metadata: one single-host
v6e-4, one 2-host v5p-16 slice on TPU VMs, and two Spot v6e-16 slices with a CPU head VM (nine
hosts, Ray token auth on; the recovery acceptance test runs on it too, and leaves it whole).
Every job goes through the `rayslice` command and the Ray Jobs API, as a user's would; the
expected figures come from the catalog.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from rayslice import names
from rayslice import spec as spec_module
from rayslice.cli import load_spec
from rayslice.jobs.upload import workloads
from rayslice.local.google.metadata_server import load_tree
from rayslice.local.simulation.simulator import Simulation
from tests.integration import test_recovery
from tests.integration.clusters import SHARED, bring_up, on, rayslice_run, run_command, tpu_nodes


def losses(output: str) -> list[float]:
    return [float(x) for x in re.findall(r"^step +\d+ +loss ([0-9.]+)$", output, re.M)]


MULTISLICE = on("2 x tpu7x-16 spot")
SLICE = on("v5p-16 tpu-vm")  # one multi-host slice, the smallest
SINGLE = on("v6e-4")


@MULTISLICE
def test_jax_multihost_sees_every_chip_of_the_slice_on_every_host(cluster):
    result = rayslice_run(cluster, "jax_multihost")
    assert result.returncode == 0
    tpu = cluster.spec().tpu
    assert str([tpu.chips] * tpu.hosts) in result.stdout.splitlines()


@MULTISLICE
def test_slice_check_reports_every_chip_and_both_links_of_two_slices(cluster):
    """CPU devices: every figure is printed, none is judged (the catalog has no CPU peak)."""
    result = rayslice_run(cluster, "slice_check")
    assert result.returncode == 0
    spec = cluster.spec()
    hosts = re.findall(r"^host (\S+/\d) \((\d+) x cpu\)$", result.stdout, re.M)
    assert len(hosts) == spec.total_hosts
    assert {int(chips) for _, chips in hosts} == {spec.tpu.chips_per_host}
    links = re.findall(r"^  (\S+/\d) +([0-9.]+) +([0-9.]+)  -$", result.stdout, re.M)  # ICI and DCN
    assert sorted(h for h, _, _ in links) == sorted(h for h, _ in hosts)
    assert "not judged" in result.stdout


@SINGLE
def test_jax_single_host_returns_the_hosts_chips(cluster):
    result = rayslice_run(cluster, "jax_single_host")
    assert result.returncode == 0
    assert result.stdout.splitlines()[-1] == str(cluster.spec().tpu.chips_per_host)


@MULTISLICE
def test_jax_multislice_over_two_slices(cluster):
    result = rayslice_run(cluster, "jax_multislice")
    assert result.returncode == 0
    hosts = re.findall(
        r"^slice_id=(\d) slice=\S+ worker=\d process_id=(\d+) devices=(\d+) "
        r"MEGASCALE_SLICE_ID=(\d)$",
        result.stdout,
        re.M,
    )
    spec = cluster.spec()
    assert len(hosts) == spec.total_hosts
    assert {h[0] for h in hosts} == {str(i) for i in range(spec.slices)} == {h[3] for h in hosts}
    assert sorted(int(h[1]) for h in hosts) == list(range(spec.total_hosts))
    assert {h[2] for h in hosts} == {str(spec.slices * spec.tpu.chips)}


@SINGLE
def test_a_job_asking_for_more_chips_than_a_host_has_fails_clearly(cluster):
    per_host = cluster.spec().tpu.chips_per_host
    result = rayslice_run(cluster, "jax_single_host", "--chips", str(2 * per_host), timeout=120)
    assert result.returncode == 1
    assert (
        f"asks for {2 * per_host} TPU chips on one host, but the largest host in the cluster has {per_host}"
        in result.stdout
    )


@MULTISLICE
def test_a_users_script_runs_with_its_directory(cluster, tmp_path):
    (tmp_path / "data.txt").write_text("from the working dir")
    script = tmp_path / "mine.py"
    script.write_text(
        "import sys\nfrom rayslice.workloads import _cluster\n_cluster.connect()\n"
        "print(open('data.txt').read(), len(_cluster.tpu_slices()), sys.argv[1:])\n"
    )
    result = rayslice_run(cluster, str(script), "--flag", "x y")
    assert result.returncode == 0
    assert f"from the working dir {cluster.spec().slices} ['--flag', 'x y']" in result.stdout


# ---- PyTorch/XLA (the `xla` extra, installed by scripts/setup.sh) --------------------------------


@SINGLE
def test_xla_single_prints_a_tensor_on_an_xla_device(cluster):
    result = rayslice_run(cluster, "xla_single")
    assert result.returncode == 0
    assert "xla:0" in result.stdout.splitlines()
    assert "device='xla:0')" in result.stdout


@SINGLE
def test_xla_train_loss_falls(cluster):
    result = rayslice_run(cluster, "xla_train", "--steps", "12")
    assert result.returncode == 0
    curve = losses(result.stdout)
    assert len(curve) == 12
    assert sum(curve[-3:]) / 3 < curve[0]


@SLICE
def test_a_single_host_job_on_multi_host_slices_is_refused_before_it_is_submitted(cluster):
    result = rayslice_run(cluster, "jax_single_host", timeout=120)
    assert result.returncode == 2, result.stderr
    assert "jax_single_host needs a single-host slice" in result.stderr
    assert "Run jax_multihost instead" in result.stderr
    assert "submitted" not in result.stderr  # refused before anything went to the cluster


@SINGLE
def test_jax_train_streams_its_steps_learns_reports_flops_and_resumes_from_its_checkpoint(cluster):
    """One training run, then a second on its checkpoints. The first: `rayslice run`'s output is
    read as it comes, so the first step line is there while the job (and the command) still runs,
    not all at once at the end; its loss falls over 200 steps and it reports its FLOP rate. The
    second goes on from the first's last checkpoint, with a lower loss than the first's start."""
    # In the simulation's shared folder: the one place of the machine a host may write that every
    # host sees, as every TPU host sees the same gs:// bucket. (On a multi-host slice, across a
    # preemption: test_recovery.py.)
    checkpoints = Path(tempfile.mkdtemp(prefix="checkpoints-", dir=cluster.plan.shared_dir))
    options = ("--batch-per-device", "32", "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "100")
    argv, env = run_command(cluster, "jax_train", "--steps", "200", *options)
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
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
        output = "".join([first, *rest])
        print(output[-5000:])  # shown when the test fails
        assert "resumed from step" not in output
        curve = losses(output)
        assert len(curve) == 200
        assert sum(curve[-3:]) / 3 < curve[0]
        chips = cluster.spec().tpu.chips  # the slice's devices
        assert re.search(
            rf"^{chips} x cpu, hidden 256 x 1 layers, batch 32 per device, f32 matmuls, lr [0-9.e+-]+, "
            rf"global batch {32 * chips}: [0-9.]+ steps/s, \d+ samples/s, [0-9.]+ GFLOP/s achieved, "
            "peak unknown for device kind 'cpu'",
            output,
            re.M,
        )

        second = rayslice_run(cluster, "jax_train", "--steps", "204", *options)
        assert second.returncode == 0
        assert re.search(r"resumed from step 200$", second.stdout, re.M)
        steps = [int(n) for n in re.findall(r"^step +(\d+) +loss", second.stdout, re.M)]
        assert steps == [200, 201, 202, 203]
        assert losses(second.stdout)[0] < curve[0]
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)


@MULTISLICE
def test_jax_lm_trains_over_two_slices_on_the_standard_librarys_text_and_resumes(cluster):
    """The language model as one program over both slices (data parallel between them): its loss
    falls on the hosts' own Python sources, and a second run goes on from the first's checkpoint."""
    checkpoints = Path(tempfile.mkdtemp(prefix="lm-checkpoints-", dir=cluster.plan.shared_dir))
    tiny = ("--d-model", "64", "--layers", "1", "--heads", "4", "--kv-heads", "2", "--head-dim", "16")
    options = (*tiny, "--mlp", "128", "--seq", "64", "--batch-per-device", "2", "--slices", "2")
    options += ("--checkpoint-dir", str(checkpoints), "--checkpoint-every", "6")
    try:
        first = rayslice_run(cluster, "jax_lm", "--steps", "12", *options)
        assert first.returncode == 0
        curve = losses_of_lm(first.stdout)
        assert len(curve) == 12 and sum(curve[-3:]) / 3 < curve[0] - 0.3, curve
        devices = cluster.spec().slices * cluster.spec().tpu.chips  # as jax_multislice counts them
        assert re.search(rf"^{devices} x cpu, mesh data 1 x fsdp {devices} x tensor 1, ", first.stdout, re.M)
        second = rayslice_run(cluster, "jax_lm", "--steps", "14", *options)
        assert second.returncode == 0
        assert re.search(r"resumed from step 12$", second.stdout, re.M)
        assert losses_of_lm(second.stdout)[0] < curve[0] - 0.3
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)


def losses_of_lm(output: str) -> list[float]:
    """jax_lm's step lines: jax_train's, with its tokens/s and MFU after the loss."""
    return [float(x) for x in re.findall(r"^step +\d+ +loss ([0-9.]+)", output, re.M)]


# ---- TPU7x on Compute Engine, from its example stack (issue 19's acceptance) -----------------------

TPU7X_EXAMPLE = "infra/Pulumi.example-compute-tpu7x-16.yaml"  # the smallest TPU7x shape: 2 hosts
# The bundled jobs that fit one 2-host slice. This one runs on the TPU7x slice itself (PyTorch/XLA
# over both hosts), with its arguments and what it must print:
RUN_ON_TPU7X = {
    "xla_multihost": (
        lambda spec: ("--slice", spec.slice_name(0)),
        lambda spec: f"{spec.tpu.chips} tasks on {spec.tpu.chips} distinct chips",
    ),
}
# The others run once in the suite, in the test named, on a shared cluster that asks of them what
# a v7x-16 would (the condition, which both shapes meet): the whole of one multi-host slice, or
# one chip of a host. (Running them on the v7x-16 as well cost a minute and a half of the suite.)
RUN_ELSEWHERE = {
    # On a slice of the shared cluster, whose slices are tpu7x-16 too.
    "jax_multihost": (
        "test_jax_multihost_sees_every_chip_of_the_slice_on_every_host",
        lambda tpu: tpu.hosts > 1,
    ),
    "jax_train": (
        "test_recovery.py::test_acceptance_spot_slices_heal_and_the_training_job_resumes_from_its_checkpoint",
        lambda tpu: tpu.hosts > 1,
    ),
    "jax_lm": (
        "test_jax_lm_trains_over_two_slices_on_the_standard_librarys_text_and_resumes",
        lambda tpu: tpu.hosts > 1,
    ),
    "jax_trainer": (
        "test_recovery.py::test_a_preempted_tpu_vm_slice_is_recreated_by_its_controller_while_ray_train_shrinks_and_grows_back",
        lambda tpu: tpu.hosts > 1,
    ),
    "slice_check": (
        "test_slice_check_reports_every_chip_and_both_links_of_two_slices",
        lambda tpu: tpu.hosts > 1,
    ),
    "xla_single": ("test_xla_single_prints_a_tensor_on_an_xla_device", lambda tpu: tpu.chips_per_host >= 1),
    "xla_train": ("test_xla_train_loss_falls", lambda tpu: tpu.chips_per_host >= 1),
}
# Single-host jobs refuse a multi-host slice before submitting (exit 2); multislice needs more than one.
DOES_NOT_FIT = {"jax_single_host": 2, "xla_multi_device": 2, "jax_multislice": None}


def _config_of(test_name: str) -> dict[str, object]:
    """The config of the cluster a test of this folder runs on: the shared cluster its `on(shape)`
    mark names, or the tpu-vm recovery test's own."""
    module, _, name = test_name.rpartition("::")
    namespace = vars(test_recovery) if module == "test_recovery.py" else globals()
    if name.startswith("test_a_preempted_tpu_vm_slice"):
        return test_recovery.TPU_VM_SPOT
    [mark] = [m for m in namespace[name].pytestmark if m.name == "parametrize" and m.args[0] == "cluster"]
    [shape] = mark.args[1]
    return SHARED[shape]


def test_every_bundled_job_that_fits_a_tpu7x_slice_runs_on_it_or_on_a_slice_that_asks_the_same():
    """The table behind the TPU7x test below: every bundled job is placed once, the jobs run
    elsewhere fit a v7x-16 by the catalog and run on a shape that meets the same condition, and
    those that do not fit are refused by what the catalog says of the v7x-16."""
    assert sorted([*RUN_ON_TPU7X, *RUN_ELSEWHERE, *DOES_NOT_FIT]) == sorted(workloads())
    tpu7x = load_spec(TPU7X_EXAMPLE, [], require_zone=False)
    for job, (test_name, condition) in RUN_ELSEWHERE.items():
        shape = spec_module.load(_config_of(test_name), require_zone=False)
        assert condition(tpu7x.tpu) and condition(shape.tpu), job
        assert workloads()[job].multihost_counterpart is None, job
    for job, exit_code in DOES_NOT_FIT.items():  # single-host jobs are refused on a multi-host slice
        assert (workloads()[job].multihost_counterpart is not None) == (exit_code == 2), job
    assert tpu7x.tpu.hosts > 1 and tpu7x.slices == 1


def test_a_tpu7x_compute_slice_boots_with_v7x_16_and_runs_the_multi_host_jobs(simulation_dir):
    """`local up` of the TPU7x example goes through the cloud twin: its two hosts are the ones
    the program names, each serving accelerator-type v7x-16 (as a real TPU7x host reports it) and
    its worker-id; they join Ray with Ray's own TPU resources; `xla_multihost` runs on it
    through `rayslice run` (the other jobs that fit, `jax_multihost` among them on the shared
    cluster's tpu7x-16 slices: `RUN_ELSEWHERE`), and single-host jobs are refused before they are
    submitted."""
    cluster = load_spec(TPU7X_EXAMPLE, [], require_zone=False)
    sim = Simulation.create(cluster, simulation_dir)
    tpu = cluster.tpu
    assert (
        sorted(h.name for h in sim.plan.hosts)
        == names.slice_host_names(  # in Pulumi's order
            cluster.slice_name(0), tpu.hosts
        )
        and tpu.hosts == 2
    )
    for host in sim.plan.hosts:
        attributes = load_tree(sim.paths(host.name).metadata_tree.read_text())["instance"]["attributes"]
        assert (attributes["accelerator-type"], attributes["worker-id"]) == ("v7x-16", str(host.worker))
        assert attributes["worker-network-endpoints"].split(",")[host.worker].endswith(f":{host.ip}")
    bring_up(sim)
    nodes = tpu_nodes(sim)
    seen = [(n["ip"], n["head"], n["resources"], n["labels"]) for n in nodes]  # said when it fails
    # Ray gives the slice's head resource to TPU worker 0: the host Google numbers 0, which need
    # not be -w0, the Ray head (the twin numbers a MIG's hosts in the order Pulumi created them).
    heads = {n["labels"].get("ray.io/tpu-worker-id"): n["resources"].get("TPU-v7x-16-head") for n in nodes}
    assert heads == {"0": 1.0, "1": None}, f"{seen}\n{sim.report()}"
    # Each host shows Ray 8 VFIO devices, two per chip, as a TPU7x host does: the chips Ray offers
    # are the boot script's explicit count.
    assert [n["resources"]["TPU"] for n in tpu_nodes(sim)] == [tpu.chips_per_host] * tpu.hosts

    for job, (job_args, expected) in RUN_ON_TPU7X.items():
        result = rayslice_run(sim, job, *job_args(cluster))
        assert result.returncode == 0, job
        assert expected(cluster) in result.stdout, job
    for job, exit_code in DOES_NOT_FIT.items():
        if exit_code is not None:
            assert rayslice_run(sim, job, timeout=120).returncode == exit_code, job
