"""The simulated TPU runtime's rules, without namespaces: chips held, host identity, who joins."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from rayslice.local.host import tpu_runtime

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


def test_the_hook_loads_only_where_the_host_enables_it(tmp_path):
    probe = "import sys; print('rayslice_simulated_tpu' in sys.modules)"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **tpu_runtime.environment()}
    on = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    env[tpu_runtime.ENABLE_VAR] = "0"
    off = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert (on.stdout.strip(), off.stdout.strip()) == ("True", "False")


def test_jax_in_a_task_holding_two_chips_sees_two_devices(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TPU_VISIBLE_CHIPS": "2,3",
        **tpu_runtime.environment(),
    }
    result = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.device_count(), jax.devices()[0].platform)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.split() == ["2", "cpu"], result.stderr
