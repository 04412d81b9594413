"""The simulated TPU runtime's rules, without namespaces: chips held, host identity, who joins."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time

import pytest

from rayslice import catalog
from rayslice.local.host import tpu_runtime
from tests.local import simulated_libtpu

spec = importlib.util.spec_from_file_location(
    "rayslice_simulated_tpu", tpu_runtime.SITE_DIR / "rayslice_simulated_tpu.py"
)
assert spec is not None and spec.loader is not None
runtime = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = runtime  # dataclasses look their module up there
spec.loader.exec_module(runtime)


def test_a_task_holds_the_chips_ray_made_visible_else_the_whole_host(monkeypatch):
    monkeypatch.setattr(runtime, "host_chips", lambda: 4)
    assert runtime.chips_held({"TPU_VISIBLE_CHIPS": "1"}) == 1
    assert runtime.chips_held({"TPU_VISIBLE_CHIPS": "0,1"}) == 2
    assert runtime.chips_held({}) == 4  # Ray unsets the variable for a task holding every chip


def test_identity_comes_from_metadata_on_a_tpu_vm():
    answers = {
        "agent-worker-number": "2",
        "worker-network-endpoints": "unknown:unknown:10.0.0.2,unknown:unknown:10.0.0.3,"
        "unknown:unknown:10.0.0.4,unknown:unknown:10.0.0.5",
    }
    ident = runtime.identity({}, answers.get)
    assert ident == runtime.SliceIdentity(worker_id=2, hosts=("10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"))
    assert (ident.process_id, ident.process_count) == (2, 4)
    assert ident.coordinator(8476) == "10.0.0.2:8476"


def test_tpu_variables_win_over_metadata_and_megascale_makes_one_program_of_the_slices():
    env = {
        "TPU_WORKER_ID": "1",
        "TPU_WORKER_HOSTNAMES": "h-0,h-1",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_COORDINATOR_ADDRESS": "10.1.0.2:8081",
    }
    ident = runtime.identity(env, lambda key: pytest.fail(f"metadata read for {key}"))
    assert (ident.process_id, ident.process_count) == (3, 4)  # slice 1 x 2 hosts + worker 1
    assert ident.coordinator(8476) == "10.1.0.2:8476"


def test_no_identity_without_a_worker_id_or_hosts():
    assert runtime.identity({}, lambda key: None) is None
    assert runtime.identity({"TPU_WORKER_ID": "0"}, lambda key: None) is None


def test_only_a_whole_host_of_a_multi_host_slice_joins_the_slice():
    four_hosts = runtime.SliceIdentity(worker_id=0, hosts=("a", "b", "c", "d"))
    one_host = runtime.SliceIdentity(worker_id=0, hosts=("a",))
    assert runtime.joins_slice(4, 4, four_hosts)
    assert not runtime.joins_slice(1, 4, four_hosts)  # a one-chip task runs alone, as with libtpu
    assert not runtime.joins_slice(4, 4, one_host)
    assert not runtime.joins_slice(0, 0, four_hosts)
    assert not runtime.joins_slice(4, 4, None)


def test_chips_per_host_from_a_tpu_vms_metadata_or_a_compute_instances_machine_type():
    def tpu_vm(accelerator_type: str, hosts: int) -> dict:
        endpoints = ",".join(f"unknown:unknown:10.0.0.{i}" for i in range(hosts))
        attributes = {"accelerator-type": accelerator_type, "worker-network-endpoints": endpoints}
        return {"instance": {"attributes": attributes}}

    assert tpu_runtime.chips_per_host(tpu_vm("v6e-16", 4)) == 4
    assert tpu_runtime.chips_per_host(tpu_vm("v6e-8", 1)) == 8  # one 8-chip TPU VM
    assert tpu_runtime.chips_per_host(tpu_vm("v5p-16", 2)) == 4  # v5p counts TensorCores
    compute = {"instance": {"attributes": {}, "machine-type": "projects/1/machineTypes/ct6e-standard-4t"}}
    assert tpu_runtime.chips_per_host(compute) == 4
    # A TPU7x instance also has Google's attributes, with the type as the host spells it (v7x-16,
    # which the TPU VM API does not offer): its machine type decides.
    tpu7x = tpu_vm("v7x-16", 2)
    tpu7x["instance"]["machine-type"] = "projects/1/machineTypes/tpu7x-standard-4t"
    assert tpu_runtime.chips_per_host(tpu7x) == 4
    head_vm = {"instance": {"attributes": {"rayslice-role": "head-vm"}, "machine-type": "x/n2-standard-8"}}
    assert tpu_runtime.chips_per_host(head_vm) == 0


def _compute_host(machine_type: str) -> dict:
    return {"instance": {"attributes": {}, "machine-type": f"projects/1/machineTypes/{machine_type}"}}


def test_chips_appear_as_the_generations_hosts_show_them_and_the_runtime_counts_them(tmp_path, monkeypatch):
    """v4: a /dev/accelN per chip. v6e: /dev/vfio/vfio and a group per chip whose PCI vendor is
    Google's (what Ray 2.60 checks). TPU7x: two groups per chip, so Ray's own count doubles, while
    the runtime still counts chips."""
    cases = {
        "v4": (
            {"instance": {"attributes": {"accelerator-type": "v4-8", "worker-network-endpoints": "a:b:c"}}},
            4,
            0,
        ),
        "v6e": (_compute_host("ct6e-standard-4t"), 4, 4),
        "tpu7x": (_compute_host("tpu7x-standard-4t"), 4, 8),
    }
    for name, (tree, chips, groups) in cases.items():
        dev, sysfs = tmp_path / name / "dev", tmp_path / name / "iommu_groups"
        dev.mkdir(parents=True)
        env = tpu_runtime.install(tree, dev=dev, groups=sysfs)
        monkeypatch.setenv(runtime.DEVICES_PER_CHIP_VAR, env[tpu_runtime.DEVICES_PER_CHIP_VAR])
        assert runtime.host_chips(str(dev), str(sysfs)) == chips, name
        listed = sorted(p.name for p in (dev / "vfio").iterdir()) if groups else []
        assert listed == (sorted([*map(str, range(groups)), "vfio"]) if groups else [])
        assert len(list(dev.glob("accel*"))) == (0 if groups else chips)
        vendors = {v.read_text().strip() for v in sysfs.glob("*/devices/*/vendor")}
        assert vendors == ({"0x1ae0"} if groups else set())
    head_vm = {"instance": {"attributes": {"rayslice-role": "head-vm"}, "machine-type": "x/n2-standard-8"}}
    (tmp_path / "cpu").mkdir()
    assert tpu_runtime.install(head_vm, dev=tmp_path / "cpu", groups=tmp_path / "none") == {}
    assert list((tmp_path / "cpu").iterdir()) == [] and not (tmp_path / "none").exists()


def test_a_vfio_group_of_another_vendor_is_not_a_chip(tmp_path, monkeypatch):
    """An NVIDIA BlueField's management function bound to vfio-pci (ray-project/ray#65034) sits in
    /dev/vfio too; neither Ray nor the runtime counts it."""
    monkeypatch.delenv(runtime.DEVICES_PER_CHIP_VAR, raising=False)
    dev, sysfs = tmp_path / "dev", tmp_path / "groups"
    dev.mkdir()
    tpu_runtime.install(_compute_host("ct6e-standard-4t"), dev=dev, groups=sysfs)
    (dev / "vfio" / "96").touch()
    (sysfs / "96" / "devices" / "0000:17:00.1").mkdir(parents=True)
    (sysfs / "96" / "devices" / "0000:17:00.1" / "vendor").write_text("0x15b3\n")
    (dev / "vfio" / "97").touch()  # no sysfs entry at all: not counted either (Ray fails closed)
    assert runtime.host_chips(str(dev), str(sysfs)) == 4


def test_the_hook_loads_the_runtime_at_the_first_jax_import_and_only_where_the_host_enables_it(tmp_path):
    """Every process of a simulated host starts through the hook, most never import JAX or
    torch_xla: the runtime (and its standard-library imports) loads only when one of them does."""
    probe = "import sys; before = 'rayslice_simulated_tpu' in sys.modules; import jax; "
    probe += "print(before, 'rayslice_simulated_tpu' in sys.modules, type(sys.meta_path[0]).__name__)"
    v6e = tpu_runtime.environment(catalog.generation("v6e"))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **v6e}
    on = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    env[tpu_runtime.ENABLE_VAR] = "0"
    off = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert (on.stdout.split(), off.stdout.split()[:2]) == (["False", "True", "_Finder"], ["False", "False"])


def test_the_start_up_hook_names_the_packages_the_runtime_wraps():
    hook_spec = importlib.util.spec_from_file_location(
        "simulated_sitecustomize", tpu_runtime.SITE_DIR / "sitecustomize.py"
    )
    assert hook_spec is not None and hook_spec.loader is not None
    hook = importlib.util.module_from_spec(hook_spec)
    hook_spec.loader.exec_module(hook)  # inserts nothing: this process is no simulated host
    assert not any(type(f).__name__ == "_LoadRuntimeOnFirstUse" for f in sys.meta_path)
    assert sorted(hook.RUNTIME_PACKAGES) == sorted(runtime._Finder.hooks)


def test_jax_in_a_task_holding_two_chips_sees_two_devices(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TPU_VISIBLE_CHIPS": "2,3",
        **tpu_runtime.environment(catalog.generation("v6e")),
    }
    result = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.device_count(), jax.devices()[0].platform)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.split() == ["2", "cpu"], result.stderr


# ---- the simulated libtpu.sdk: what the chips run, where they sit ---------------------------------

BUSY_THEN_IDLE = """
import sys, time
import jax, jax.numpy as jnp
held = jnp.ones((1024, 1024), jnp.float32)  # 4 MiB on each of the two devices
held = jax.device_put(held, jax.sharding.NamedSharding(jax.make_mesh((2,), ("d",)), jax.P()))
x = jnp.ones((512, 512))
end = time.time() + float(sys.argv[1])
while time.time() < end:
    x = (x @ x) / 512.0
    x.block_until_ready()
print("idle", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _wait_for(predicate, timeout_s: float):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    return predicate()


def test_simulated_libtpu_reports_what_a_real_jax_process_runs_on_its_chips(tmp_path, monkeypatch):
    """A JAX process holding chips 1 and 3 of a 4-chip host: while it computes those chips read busy
    and hold its arrays, the others idle and empty; once it stops computing they read idle."""
    state = tmp_path / "state"
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TPU_VISIBLE_CHIPS": "1,3",
        **tpu_runtime.environment(catalog.generation("v6e")),
        runtime.STATE_DIR_VAR: str(state),
    }
    monkeypatch.setattr(runtime, "host_chips", lambda: 4)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monitoring = simulated_libtpu.sdk(monkeypatch).tpumonitoring
    proc = subprocess.Popen(
        [sys.executable, "-c", BUSY_THEN_IDLE, "6", "30"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:

        def busy() -> list[float] | None:  # computing, and the held array in place
            duty = [float(v) for v in monitoring.get_metric("duty_cycle_pct").data()]
            used = [int(v) for v in monitoring.get_metric("hbm_capacity_usage").data()]
            return duty if duty[1] > 50 and duty[3] > 50 and min(used[1], used[3]) >= 4 * 2**20 else None

        duty = _wait_for(busy, 60)
        assert duty is not None and duty[0] == duty[2] == 0.0, duty
        util = [float(v) for v in monitoring.get_metric("tensorcore_util").data()]
        assert util[1] > 0 and util[3] > 0 and util[0] == util[2] == 0.0, util
        used = [int(v) for v in monitoring.get_metric("hbm_capacity_usage").data()]
        assert used[1] >= 4 * 2**20 and used[3] >= 4 * 2**20 and used[0] == used[2] == 0, used
        total = {int(v) for v in monitoring.get_metric("hbm_capacity_total").data()}
        assert total == {32 * 2**30}  # a v6e chip's, from the catalog
        assert proc.stdout is not None and proc.stdout.readline().strip() == "idle"
        idle = _wait_for(
            lambda: all(float(v) < 5 for v in monitoring.get_metric("duty_cycle_pct").data()),
            runtime.WINDOW_S + 10,
        )
        assert idle, monitoring.get_metric("duty_cycle_pct").data()
        still_held = [int(v) for v in monitoring.get_metric("hbm_capacity_usage").data()]
        assert still_held[1] >= 4 * 2**20, still_held  # idle, the arrays still held
    finally:
        proc.kill()
        proc.wait()
    assert _wait_for(lambda: all(v == "0" for v in monitoring.get_metric("hbm_capacity_usage").data()), 5)


def test_the_simulated_library_lists_only_what_it_measures_and_refuses_other_names(monkeypatch):
    monitoring = simulated_libtpu.sdk(monkeypatch).tpumonitoring
    assert set(monitoring.list_supported_metrics()) == {
        "duty_cycle_pct",
        "tensorcore_util",
        "hbm_capacity_usage",
        "hbm_capacity_total",
    }
    assert "duty cycle" in monitoring.get_metric("duty_cycle_pct").description().lower()
    with pytest.raises(ValueError, match="ici_link_health"):
        monitoring.get_metric("ici_link_health")


@pytest.mark.parametrize(("topology", "hosts"), [("4x4", 4), ("8x8", 16), ("2x2", 1)])
def test_chip_coordinates_put_each_worker_where_rays_subslice_discovery_finds_it(topology, hosts):
    """Ray 2.60's own arithmetic (`_get_physical_worker_id_from_coords`) maps each host's
    coordinates back to its worker id, and the chips of a slice are each at one place."""
    from ray._private.accelerators.tpu import _get_physical_worker_id_from_coords

    seen = set()
    for worker in range(hosts):
        coords = runtime.chip_coordinates(topology, worker, 4)
        assert _get_physical_worker_id_from_coords([list(c) for c in coords], topology) == worker
        seen.update(coords)
    dims = [int(d) for d in topology.split("x")]
    assert seen == {(x, y, 0) for x in range(dims[0]) for y in range(dims[1])}


def test_a_v6e_16_hosts_chips_lie_in_2x2_blocks_and_a_3d_slice_stacks_hosts_along_z():
    assert runtime.chip_coordinates("4x4", 3, 4) == [(2, 2, 0), (3, 2, 0), (2, 3, 0), (3, 3, 0)]
    assert runtime.chip_coordinates("2x4", 0, 8) == [(x, y, 0) for y in range(4) for x in range(2)]
    # v5p-16 (2x2x2, two 4-chip hosts): host bounds 1,1,2
    assert runtime.chip_coordinates("2x2x2", 1, 4) == [(0, 0, 1), (1, 0, 1), (0, 1, 1), (1, 1, 1)]
    with pytest.raises(ValueError, match="no worker 4"):
        runtime.chip_coordinates("4x4", 4, 4)


def test_get_chip_coordinates_reads_the_hosts_topology_and_worker_id(monkeypatch):
    monkeypatch.setattr(runtime, "host_chips", lambda: 4)
    monkeypatch.setenv("TPU_TOPOLOGY", "4x4")
    monkeypatch.setenv("TPU_WORKER_ID", "2")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "a,b,c,d")
    chips = simulated_libtpu.sdk(monkeypatch).slice.get_chip_coordinates()
    assert [(c.chip_index(), tuple(c.coordinates())) for c in chips] == [
        (0, (0, 2, 0)),
        (1, (1, 2, 0)),
        (2, (0, 3, 0)),
        (3, (1, 3, 0)),
    ]
    assert {c.hostname() for c in chips} == {socket.gethostname()}
