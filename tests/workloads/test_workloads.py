"""Unit tests of the workloads' cluster reading and jax_train (`rayslice run`: tests/jobs/)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

import rayslice.workloads
from rayslice import catalog, names
from rayslice.errors import EXIT_INVALID, EXIT_JOB_FAILED, EXIT_NO_CLUSTER, InvalidInput, JobFailed, NoCluster
from rayslice.workloads import _cluster, _jax_hosts


def node(
    slice_name: str,
    worker: int,
    pod_type: str,
    topology: str,
    chips: int = 4,
    alive: bool = True,
    ip: str | None = None,
    platform: str | None = None,
) -> dict:
    """A `ray.nodes()` entry as Ray's TPU detection leaves it (and the boot script's platform
    label, when given)."""
    return {
        "NodeID": f"{slice_name}-{worker}",
        "NodeManagerAddress": ip or f"10.0.0.{worker}",
        "Alive": alive,
        "Resources": {"CPU": 2.0, "TPU": float(chips), slice_name: 1.0},
        "Labels": {
            names.SLICE_NAME_LABEL: slice_name,
            _cluster.WORKER_ID_LABEL: str(worker),
            _cluster.TOPOLOGY_LABEL: topology,
            _cluster.POD_TYPE_LABEL: pod_type,
            **({names.PLATFORM_LABEL: platform} if platform else {}),
        },
    }


def v6e_16(name: str, workers=range(4)) -> list[dict]:
    return [node(name, w, "v6e-16", "4x4") for w in workers]


def slices_of(nodes: list[dict]) -> list[_cluster.TpuSlice]:
    return _cluster.tpu_slices(_cluster.tpu_hosts(nodes))


def test_hosts_without_tpu_or_dead_are_not_tpu_hosts():
    cpu_head = {
        "NodeID": "h",
        "NodeManagerAddress": "10.0.0.9",
        "Alive": True,
        "Resources": {"CPU": 8.0},
        "Labels": {},
    }
    dead = node("s", 1, "v6e-16", "4x4", alive=False)
    hosts = _cluster.tpu_hosts([cpu_head, dead, node("s", 0, "v6e-16", "4x4")])
    assert [(h.slice_name, h.worker_id, h.chips) for h in hosts] == [("s", 0, 4)]


def test_a_slice_is_ordered_by_worker_id_and_complete_only_with_every_host():
    (full,) = slices_of(list(reversed(v6e_16("a"))))
    assert [h.worker_id for h in full.hosts] == [0, 1, 2, 3] and full.complete
    assert full.chips == 16 and full.generation == "v6e"
    (partial,) = slices_of(v6e_16("b", [0, 1, 3]))
    assert not partial.complete


def test_expected_hosts_follow_the_platform_the_chips_per_host_reveal():
    # v6e-8: one 8-chip host on the TPU VM API, two 4-chip nodes on GKE.
    assert _cluster._expected_hosts("v6e-8", 8) == 1
    assert _cluster._expected_hosts("v6e-8", 4) == 2
    assert _cluster._expected_hosts("v5p-16", 4) == catalog.lookup("v5p-16").hosts == 2
    with pytest.raises(InvalidInput, match="report 3 TPU chips"):
        _cluster._expected_hosts("v6e-16", 3)
    with pytest.raises(catalog.CatalogError):
        _cluster._expected_hosts("v6e-17", 4)


def test_the_platform_label_decides_the_shape():
    # v6e-8 on the TPU VM API is one 8-chip host; 4-chip hosts are not a tpu-vm v6e-8.
    (gke,) = slices_of([node("g", w, "v6e-8", "2x4", platform="gke") for w in range(2)])
    assert gke.expected_hosts == 2 and gke.complete
    with pytest.raises(InvalidInput, match="report 4 TPU chips each, which no v6e-8 of tpu-vm has"):
        slices_of([node("t", w, "v6e-8", "2x4", platform="tpu-vm") for w in range(2)])
    (single,) = slices_of([node("t", 0, "v6e-8", "2x4", chips=8, platform="tpu-vm")])
    assert single.expected_hosts == 1


def test_a_tpu7x_compute_slice_is_read_with_rays_name_for_it():
    """Ray labels a TPU7x host `v7x-16` (its own spelling of Compute Engine's tpu7x-16), and the
    TPU VM API offers no TPU7x: the slice is looked up on the platform its nodes are labelled with."""
    nodes = [node("c", w, "v7x-16", "2x2x2", platform="compute") for w in range(2)]
    (tpu_slice,) = slices_of(nodes)
    assert tpu_slice.expected_hosts == catalog.lookup("tpu7x-16", "compute").hosts == 2
    assert tpu_slice.complete and tpu_slice.generation == "v7x"
    assert _cluster.choose_slices(1, accelerator_type="tpu7x-16", slices=[tpu_slice]) == [tpu_slice]
    # A TPU7x slice is not offered on tpu-vm: a node labelled so gets the catalog's reason.
    with pytest.raises(catalog.CatalogError, match="not available on tpu-vm"):
        slices_of([node("t", w, "v7x-16", "2x2x2", platform="tpu-vm") for w in range(2)])


def test_the_largest_complete_slice_is_chosen_by_default():
    slices = slices_of([node("aaa", 0, "v6e-4", "2x2"), *v6e_16("zzz"), *v6e_16("bbb", [0, 1])])
    assert [s.name for s in _cluster.choose_slices(1, slices=slices)] == ["zzz"]
    assert [s.name for s in _cluster.choose_slices(1, accelerator_type="v6e-4", slices=slices)] == ["aaa"]
    assert [s.name for s in _cluster.choose_slices(None, slices=slices)] == ["zzz"]


def test_choosing_slices_that_are_not_there_says_what_the_cluster_has():
    slices = slices_of([*v6e_16("a"), *v6e_16("b", [0, 1, 2])])
    with pytest.raises(
        InvalidInput,
        match=r"asked for 2 complete v6e-16 slices, the cluster "
        r"has 1: a \(v6e-16.*4/4 hosts.*b \(v6e-16.*3/4 hosts",
    ):
        _cluster.choose_slices(2, slices=slices)
    with pytest.raises(InvalidInput, match="no complete TPU slice matches v5p-8"):
        _cluster.choose_slices(1, accelerator_type="v5p-8", slices=slices)
    with pytest.raises(NoCluster, match="no TPU hosts"):
        _cluster.choose_slices(1, slices=[])


def v6e_4(name: str) -> list[dict]:
    return [node(name, 0, "v6e-4", "2x2")]


def test_a_single_host_job_takes_a_single_host_slice_when_the_cluster_has_one():
    slices = slices_of([*v6e_16("big"), *v6e_4("small")])
    assert _cluster.choose_single_host_slice("job", "other", slices=slices).name == "small"
    # the largest is still what a multi-host job gets from the same cluster
    assert [s.name for s in _cluster.choose_slices(1, slices=slices)] == ["big"]


@pytest.mark.parametrize(
    "options, with_single_host_slice",
    [
        ({}, False),
        ({"chips": 4}, False),  # a host's worth, said explicitly
        ({"slice_name": "big"}, True),  # asked for by name although a single-host slice is there
        ({"accelerator_type": "v6e-16"}, True),
    ],
)
def test_a_single_host_job_refuses_a_whole_host_of_a_multi_host_slice(options, with_single_host_slice):
    slices = slices_of([*v6e_16("big"), *(v6e_4("small") if with_single_host_slice else [])])
    with pytest.raises(InvalidInput) as refused:
        _cluster.choose_single_host_slice("jax_single_host", "jax_multihost", slices=slices, **options)
    message = str(refused.value)
    assert message.startswith("jax_single_host needs a single-host slice and none in the cluster matches")
    assert "big (v6e-16" in message and "Run jax_multihost instead" in message


def test_part_of_a_host_runs_on_any_slice():
    """Fewer chips than a host has form a program of their own (Ray sets the sub-host bounds)."""
    slices = slices_of(v6e_16("big"))
    assert _cluster.choose_single_host_slice("job", "other", chips=1, slices=slices).name == "big"
    # more chips than a host has are the chip check's to refuse, with its own message
    assert _cluster.choose_single_host_slice("job", "other", chips=8, slices=slices).name == "big"


@pytest.mark.parametrize("module", ["jax_single_host", "xla_multi_device"])
def test_single_host_jobs_apply_the_rule_before_scheduling_anything(module, monkeypatch):
    import importlib

    job = importlib.import_module(f"rayslice.workloads.{module}")
    slices = slices_of(v6e_16("big"))
    monkeypatch.setattr(_cluster, "tpu_slices", lambda hosts=None: slices)
    args = job.build_parser().parse_args([])
    with pytest.raises(InvalidInput, match=f"Run {job.MULTIHOST_COUNTERPART} instead"):
        job.run(args)


def test_asking_for_more_chips_than_any_host_has_is_refused():
    (tpu_slice,) = slices_of(v6e_16("a"))
    assert _cluster.one_host_options(4, tpu_slice) == {
        "num_cpus": 0,
        "resources": {"TPU": 4},
        "label_selector": {names.SLICE_NAME_LABEL: "a"},
    }
    with pytest.raises(
        InvalidInput,
        match="asks for 8 TPU chips on one host, but the largest host in the cluster has 4",
    ):
        _cluster.one_host_options(8, tpu_slice)


def test_megascale_env_names_slice_0_worker_0_as_coordinator():
    slices = slices_of(
        [
            *[node("a", w, "v6e-16", "4x4", ip=f"10.0.1.{w}") for w in range(4)],
            *[node("b", w, "v6e-16", "4x4", ip=f"10.0.2.{w}") for w in range(4)],
        ]
    )
    assert _jax_hosts.megascale_env(slices[:1], 0) == {}
    env = _jax_hosts.megascale_env(slices, 1)
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "10.0.1.0"
    assert (env["MEGASCALE_NUM_SLICES"], env["MEGASCALE_SLICE_ID"]) == ("2", "1")
    assert env["MEGASCALE_PORT"]


def test_jax_train_loss_falls_on_the_local_devices():
    from rayslice.workloads.jax_train import train

    report = train(steps=15, batch_per_device=32, hidden=64)
    assert len(report.losses) == 15
    assert sum(report.losses[-3:]) / 3 < report.losses[0]
    assert report.flops_per_step > 0 and report.steps_per_s > 0
    assert report.samples_per_s == pytest.approx(report.steps_per_s * report.global_batch)
    assert "samples/s" in report.summary()


@pytest.mark.parametrize("module", ["jax_train", "xla_train"])
def test_training_needs_two_steps_because_the_first_compiles(module, capsys):
    import importlib

    parser = importlib.import_module(f"rayslice.workloads.{module}").build_parser()
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--steps", "1"])
    assert exit_info.value.code == 2
    assert "steps must be at least 2" in capsys.readouterr().err
    assert parser.parse_args(["--steps", "2"]).steps == 2


# Names only a CPU stand-in for a TPU needs (issue 11.2): the simulated host's runtime sets them,
# the workloads (the code a user runs on a TPU) never do.
SIMULATION_NAMES = ("JAX_PLATFORMS", "xla_force_host_platform_device_count", "PJRT_DEVICE", "CPU_NUM_DEVICES")


def test_workloads_carry_no_simulation_code():
    package = Path(rayslice.workloads.__file__).parent
    sources = sorted(package.rglob("*.py"))
    assert len(sources) > 5  # the package was found, not an empty folder
    found = [
        f"{path.relative_to(package)}:{number}: {name}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for name in SIMULATION_NAMES
        if re.search(re.escape(name), line, re.IGNORECASE)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidInput("no complete TPU slice"), EXIT_INVALID),
        (JobFailed("did not finish"), EXIT_JOB_FAILED),
        (NoCluster("no Ray cluster"), EXIT_NO_CLUSTER),
        (catalog.CatalogError("unknown type"), EXIT_INVALID),
    ],
)
def test_a_workload_exits_with_the_code_of_the_error_it_hit(monkeypatch, capsys, error, code):
    monkeypatch.setattr(_cluster, "connect", lambda: None)

    def body(_args: argparse.Namespace) -> None:
        raise error

    assert _cluster.run_main(argparse.ArgumentParser(), body, []) == code
    assert capsys.readouterr().err == f"error: {error}\n"


def test_jax_train_resumes_from_its_latest_checkpoint_and_the_loss_continues(tmp_path, capsys):
    from rayslice.workloads.jax_train import train

    first = train(steps=8, batch_per_device=32, hidden=64, checkpoint_dir=str(tmp_path), checkpoint_every=3)
    assert "resumed" not in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["6", "8"]  # max_to_keep=2

    resumed = train(
        steps=14, batch_per_device=32, hidden=64, checkpoint_dir=str(tmp_path), checkpoint_every=3
    )
    printed = capsys.readouterr().out.splitlines()
    assert "resumed from step 8" in printed
    assert resumed.first_step == 8 and len(resumed.losses) == 6
    steps = [line for line in printed if line.startswith("step")]
    assert steps[0].startswith("step   8  loss") and len(steps) == 6
    # It continues where the first run stopped, far below where a fresh run starts.
    assert resumed.losses[0] < first.losses[0] / 2
    assert resumed.losses[0] < 2 * first.losses[-1]


def test_jax_train_sizes_come_from_the_device_kind():
    from rayslice.workloads.jax_train import SMALL, sizes_for

    assert sizes_for("cpu") == SMALL and not SMALL.bf16
    v5e = sizes_for("TPU v5 lite")  # 64 x 197 TFLOP/s / 819 GB/s ~ 15,400: batch 16384
    assert (v5e.hidden, v5e.layers, v5e.batch_per_device, v5e.bf16) == (8192, 8, 16384, True)
    assert sizes_for("TPU v2").layers == 4  # a v2 TensorCore has 8 GiB: 4 layers of 2 GiB
    assert sizes_for("TPU v5 lite", hidden=1024, layers=2, batch_per_device=64).batch_per_device == 64
    # Wider and deeper layers take smaller steps; a given learning rate is kept.
    assert v5e.learning_rate == pytest.approx(3e-3 * 256 / 8192 / 8)
    assert sizes_for("TPU v5 lite", learning_rate=1e-4).learning_rate == 1e-4


def test_jax_train_on_cpu_says_the_peak_is_unknown():
    from rayslice.workloads.jax_train import train

    report = train(steps=2, batch_per_device=8, hidden=32, progress=lambda line: None)
    assert report.peak_flops is None
    assert "peak unknown for device kind 'cpu'" in report.summary()
    assert "hidden 32 x 1 layers, batch 8 per device, f32 matmuls" in report.summary()


def test_jax_train_fit_step_describes_the_arrays_build_model_makes():
    import jax
    import numpy as np

    from rayslice.workloads.jax_train import build_model, fit_step

    def shapes(tree):
        return jax.tree.map(lambda a: (a.shape, a.dtype), tree)

    model = build_model(batch_per_device=4, hidden=16, layers=2)
    argv = ["--hidden", "16", "--layers", "2", "--batch-per-device", "4"]
    _step, (params, opt_state, x, y) = fit_step(jax.devices(), argv)
    assert shapes(params) == shapes(model.params)
    assert shapes(opt_state) == shapes(model.opt_state)
    real_x, real_y = model.batch(np.random.default_rng(0))
    assert (x.shape, x.dtype, y.shape) == (real_x.shape, real_x.dtype, real_y.shape)
