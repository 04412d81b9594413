"""`rayslice fit`: a job's step compiled for a TPU topology on this CPU, with libtpu's compile-only
devices (the `fit` extra, which scripts/setup.sh installs: these tests run everywhere the suite
does, and fail rather than skip where libtpu is missing)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from rayslice import catalog, cli
from rayslice.errors import EXIT_INVALID, EXIT_OK, InvalidInput
from rayslice.fit import plan

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples/fit/sharded_mlp.py"
# jax_train at CPU sizes on a TPU topology: compiles in about a second.
SMALL = ["--", "--hidden", "256", "--layers", "1", "--batch-per-device", "32"]


@pytest.fixture(autouse=True)
def registered_commands(monkeypatch):
    """The commands as pyproject.toml registers them (the checkout under test may not be the one
    installed); tests/test_packaging.py checks that the wheel registers the same."""
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    group = table[cli.COMMANDS_GROUP]
    points = {n: EntryPoint(n, v, cli.COMMANDS_GROUP) for n, v in group.items()}
    monkeypatch.setattr(cli.RaysliceGroup, "_registered", lambda self: points)


def test_a_bundled_job_over_a_v5e_chips_hbm_is_refused_before_anything_is_created(capsys):
    code = cli.main(["fit", "jax_train", "--set", "acceleratorType=v5litepod-4", "--", "--hidden", "65536"])
    err = capsys.readouterr().err
    assert code == EXIT_INVALID
    assert err.startswith("rayslice: jax_train does not fit v5e:2x2: RESOURCE_EXHAUSTED")
    assert "float32[65536, 65536]" in err  # the shapes that did not fit
    assert len(err.strip().splitlines()) == 1


def test_a_bundled_job_over_a_v6e_chips_hbm_is_refused(capsys):
    stack = ["--set", "acceleratorType=v6e-16", "--set", "platform=gke"]
    code = cli.main(["fit", "jax_train", *stack, "--", "--hidden", "32768"])
    assert code == EXIT_INVALID
    assert "jax_train does not fit v6e:4x4" in capsys.readouterr().err


def test_a_step_that_fits_shows_hbm_flops_and_sharding_per_chip(capsys):
    assert cli.main(["fit", "jax_train", "--topology", "v5e:1x1", *SMALL]) == EXIT_OK
    out = capsys.readouterr().out
    assert "topology v5e:1x1: 1 chips, 1 devices (TPU v5 lite, 1 per chip)" in out
    assert "of 16 GiB" in out and ": fits" in out
    assert "at the bf16 peak (197 TFLOP/s)" in out
    assert "in  [2]" in out and "P('data',)" in out  # the batch, sharded over the data axis


def test_multislice_compiles_for_every_slice(capsys):
    argv = ["fit", "jax_train", "--set", "acceleratorType=v6e-16", "--set", "platform=gke"]
    assert cli.main([*argv, "--set", "slices=2", *SMALL]) == EXIT_OK
    assert "topology v6e:4x4 x 2 slices: 32 chips, 32 devices" in capsys.readouterr().out


def test_a_users_program_is_fitted_through_its_fit_step(capsys):
    argv = ["fit", str(EXAMPLE), "--topology", "v5e:2x2", "--", "--width", "1024", "--batch", "64"]
    assert cli.main(argv) == EXIT_OK
    out = capsys.readouterr().out
    assert "P(None, 'model')" in out and "P('model', None)" in out and "P('data', None)" in out
    # w1 1024 x 4096 float32 split over model=2: 1024 x 2048 per device, 8 MiB
    assert "1024x4096      float32   P(None, 'model')   -> 1024x2048 (8.0 MiB)" in out


def test_a_users_program_that_does_not_fit_is_refused(capsys):
    argv = ["fit", str(EXAMPLE), "--topology", "v5e:2x2", "--", "--width", "65536"]
    assert cli.main(argv) == EXIT_INVALID
    assert "does not fit v5e:2x2" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--topology", "v5e:3x3"], "libtpu cannot build topology v5e:3x3"),
        (["--topology", "v9:2x2"], "unknown topology 'v9:2x2'"),
        (["--topology", "tpu7:2x2x1"], "knows no HBM or peak figures for tpu7"),
        (["--set", "acceleratorType=v5litepod-3"], "acceleratorType"),
        (["--set", "acceleratorType=v6e-16", "--slices", "2"], "--slices goes with --topology"),
    ],
)
def test_an_unknown_topology_exits_2(capsys, argv, message):
    assert cli.main(["fit", "jax_train", *argv]) == EXIT_INVALID
    assert message in capsys.readouterr().err


def test_without_libtpu_the_message_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "libtpu", None)  # `import libtpu` now fails
    assert cli.main(["fit", "jax_train", "--topology", "v5e:1x1"]) == EXIT_INVALID
    assert "pip install 'rayslice[fit]'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "job, message",
    [
        ("no_such_job", "no job 'no_such_job'"),
        ("jax_single_host", "jax_single_host has no function fit_step(devices, argv)"),
        ("missing.py", "no file missing.py"),
        (f"{EXAMPLE}:nothing", "has no function nothing(devices, argv)"),
    ],
)
def test_a_job_without_an_entry_point_is_named(job, message):
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan.load_entry(job)


def _fit(peak_bytes: int, devices: int = 4, chips: int = 4) -> plan.Fit:
    chip = catalog.chip("v5e")
    assert chip is not None
    return plan.Fit(
        topology="v5e:2x2",
        chips=chips,
        devices=devices,
        device_kind="TPU v5 lite",
        chip=chip,
        memory={"peak": peak_bytes},
        flops_per_device=197e12,
        bytes_accessed_per_device=819e9 / 2,
        arrays=(),
    )


def test_hbm_per_chip_counts_every_device_of_the_chip():
    assert _fit(9 * 2**30).fits
    assert not _fit(9 * 2**30, devices=8).fits  # two devices of 9 GiB on one 16 GiB chip
    assert _fit(16 * 2**30).fits and not _fit(16 * 2**30 + 1).fits


def test_step_time_at_peak_and_at_bandwidth():
    found = _fit(2**30)
    assert found.seconds_at_peak == pytest.approx(1.0)
    assert found.seconds_at_bandwidth == pytest.approx(0.5)
    assert "bound by the matrix units" in "\n".join(found.lines())


def test_preview_with_a_job_that_does_not_fit_exits_2_before_the_program_runs(monkeypatch, capsys):
    from rayslice.infra import commands

    def never(*args, **kwargs):
        raise AssertionError("the preview ran although the job does not fit")

    monkeypatch.setattr(commands, "preview", never)
    stack = REPO / "infra/Pulumi.example-v6e-4.yaml"
    code = cli.main(["preview", "--stack-file", str(stack), "--fit", "jax_train --hidden 32768"])
    assert code == EXIT_INVALID
    assert "jax_train does not fit v6e:2x2" in capsys.readouterr().err


def test_fit_fills_the_clusters_compilation_cache_once(tmp_path, capsys):
    """`--fill-cache`: the compile for the stack's chips is written where the hosts' JAX looks
    (rayslice.compilation_cache), and a second fit of the same step finds it there and adds nothing."""
    cache = tmp_path / "jax-compilation-cache"
    argv = ["fit", "jax_train", "--topology", "v5e:1x1", "--fill-cache", str(cache), *SMALL]
    assert cli.main(argv) == EXIT_OK
    first = capsys.readouterr().out
    written = sorted(p.name for p in cache.iterdir())
    assert written and all(name.endswith("-cache") for name in written)
    assert f"compilation cache: {len(written)} entries added\n" in first
    assert cli.main(argv) == EXIT_OK
    second = capsys.readouterr().out
    assert f"compilation cache: 0 entries added, {len(written)} there already (left as they were)" in second
    assert sorted(p.name for p in cache.iterdir()) == written


def test_without_fill_cache_fit_writes_no_cache_and_says_nothing_of_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["fit", "jax_train", "--topology", "v5e:1x1", *SMALL]) == EXIT_OK
    assert "compilation cache" not in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_libtpus_own_logs_stay_out_of_the_tmp_folder_every_local_ray_node_streams(tmp_path):
    """libtpu logs to /tmp/tpu_logs by default, and every Ray node of the machine streams that
    folder into its jobs' output (a compile error's whole HBM listing turned up in another test's
    Ray job): fit's libtpu logs under ~/.cache/rayslice/tpu_logs instead, and its own process
    keeps no TPU_LOG_DIR for what it starts after."""
    env = {k: v for k, v in os.environ.items() if k != "TPU_LOG_DIR"} | {"HOME": str(tmp_path)}
    script = (
        "import os, sys\nfrom rayslice import cli\n"
        "code = cli.main(sys.argv[1:])\nprint('TPU_LOG_DIR' in os.environ)\nsys.exit(code)\n"
    )
    argv = [sys.executable, "-c", script, "fit", "jax_train", "--topology", "v5e:1x1", *SMALL]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == EXIT_OK, result.stderr
    assert result.stdout.splitlines()[-1] == "False"
    pids = _pids_in(tmp_path / ".cache/rayslice/tpu_logs")
    assert pids, "libtpu wrote no log where fit sent it"
    assert not [p for p in Path("/tmp/tpu_logs").glob("*") if p.name.rsplit(".", 1)[-1] in pids]


def _pids_in(folder: Path) -> set[str]:
    """The process ids in libtpu's log names (``tpu_driver.vm.USER.log.LEVEL.DATE-TIME.PID``)."""
    suffixes = {p.name.rsplit(".", 1)[-1] for p in folder.glob("*")}
    return {s for s in suffixes if s.isdigit()}


def _fit_in_a_new_process(home: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`rayslice fit` in a process of its own (libtpu prints its start-up lines once per process),
    without the TPU_* variables a TPU VM has, as on a deployer's machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "LIBTPU"))} | {"HOME": str(home)}
    argv = [sys.executable, "-m", "rayslice", "fit", "jax_train", "--topology", "v5e:1x1", *flags, *SMALL]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)


def test_fit_prints_its_report_and_nothing_from_libtpu_unless_verbose(tmp_path):
    quiet = _fit_in_a_new_process(tmp_path)
    assert quiet.returncode == EXIT_OK, quiet.stderr
    assert quiet.stderr == ""
    assert quiet.stdout.startswith("topology v5e:1x1: 1 chips")
    # libtpu's lines went to its log folder, where `--verbose` would have shown them instead.
    logged = (tmp_path / ".cache/rayslice/tpu_logs" / plan.STDERR_LOG).read_text()
    assert "TPU_ACCELERATOR_TYPE" in logged
    loud = _fit_in_a_new_process(tmp_path, "--verbose")
    assert loud.returncode == EXIT_OK and "TPU_ACCELERATOR_TYPE" in loud.stderr
    assert loud.stdout == quiet.stdout


def test_fit_compiles_with_the_libtpu_arguments_jax_gives_a_tpu_host(monkeypatch):
    """JAX adds an argument to LIBTPU_INIT_ARGS on a machine with chips, and every cache key covers
    the variable: fit sets the same for its compile only, keeping what the user set."""
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    with plan._as_on_a_tpu_host():
        assert os.environ["LIBTPU_INIT_ARGS"] == "--xla_tpu_use_enhanced_launch_barrier=true"
    assert "LIBTPU_INIT_ARGS" not in os.environ
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_use_enhanced_launch_barrier=false --xla_x=1")
    with plan._as_on_a_tpu_host():
        assert os.environ["LIBTPU_INIT_ARGS"] == "--xla_tpu_use_enhanced_launch_barrier=false --xla_x=1"
    assert os.environ["LIBTPU_INIT_ARGS"] == "--xla_tpu_use_enhanced_launch_barrier=false --xla_x=1"


PALLAS_JOB = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.sharding import NamedSharding, PartitionSpec


def _add(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def fit_step(devices, argv):
    mesh = jax.make_mesh((1,), ("x",), devices=list(devices)[:1])

    @jax.jit
    def step(x, y):
        return pl.pallas_call(_add, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

    a = jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
    return step, (a, a)
"""


def test_a_pallas_kernels_entry_has_one_key_wherever_its_files_lie(tmp_path, capsys):
    """JAX hashes a Pallas kernel with its source locations (seen on a v5e chip: jax_lm's splash
    attention filled here missed there, only the computation differing). Lowered as on the hosts,
    which keep source files' names without their folders, the same program from two folders
    fills one entry, as a host running it from Ray's own folder computes."""
    names = []
    for folder in (tmp_path / "a", tmp_path / "b/deeper"):
        folder.mkdir(parents=True)
        (folder / "pallas_job.py").write_text(PALLAS_JOB)
        cache = folder / "cache"
        argv = ["fit", str(folder / "pallas_job.py"), "--topology", "v5e:1x1", "--fill-cache", str(cache)]
        assert cli.main(argv) == EXIT_OK, capsys.readouterr()
        names.append(sorted(p.name for p in cache.iterdir()))
    assert len(names[0]) == 1 and names[0] == names[1]
