"""The catalog: table tests across every generation and platform, the xpk CSV, name parsing."""

from __future__ import annotations

import csv

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayslice import catalog


def _csv_rows(fixtures_dir):
    path = fixtures_dir / "xpk-v1.13" / "gke-tpu-system-characteristics.csv"
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


def test_gke_agrees_with_every_row_of_the_reference_csv(fixtures_dir):
    rows = _csv_rows(fixtures_dir)
    assert len(rows) == 2020
    table = catalog.table("gke")
    for row in rows:
        shape = table[row["accelerator_type"]]
        assert (
            shape.gke_accelerator,
            shape.machine_type,
            shape.topology,
            shape.hosts,
            shape.chips_per_host,
            shape.chips,
        ) == (
            row["gke_accelerator"],
            row["machine_type"],
            row["topology"],
            int(row["hosts"]),
            int(row["chips_per_host"]),
            int(row["total_chips"]),
        ), row["accelerator_type"]


def test_gke_offers_nothing_the_reference_csv_lacks(fixtures_dir):
    assert set(catalog.table("gke")) == {r["accelerator_type"] for r in _csv_rows(fixtures_dir)}


@pytest.mark.parametrize(
    "name, platform, hosts, per_host, topology, runtime",
    [
        ("v2-8", "tpu-vm", 1, 4, "2x2", "tpu-ubuntu2204-base"),
        ("v2-32", "tpu-vm", 4, 4, "4x4", "tpu-ubuntu2204-base"),
        ("v3-64", "tpu-vm", 8, 4, "4x8", "tpu-ubuntu2204-base"),
        ("v4-8", "tpu-vm", 1, 4, "2x2x1", "tpu-ubuntu2204-base"),
        ("v4-16", "tpu-vm", 2, 4, "2x2x2", "tpu-ubuntu2204-base"),
        ("v5litepod-1", "tpu-vm", 1, 1, "1x1", "v2-alpha-tpuv5-lite"),
        ("v5litepod-8", "tpu-vm", 1, 8, "2x4", "v2-alpha-tpuv5-lite"),
        ("v5litepod-16", "tpu-vm", 4, 4, "4x4", "v2-alpha-tpuv5-lite"),
        ("v5p-8", "tpu-vm", 1, 4, "2x2x1", "v2-alpha-tpuv5"),
        ("v5p-16", "tpu-vm", 2, 4, "2x2x2", "v2-alpha-tpuv5"),
        ("v6e-4", "tpu-vm", 1, 4, "2x2", "v2-alpha-tpuv6e"),
        ("v6e-8", "tpu-vm", 1, 8, "2x4", "v2-alpha-tpuv6e"),
        ("v6e-16", "tpu-vm", 4, 4, "4x4", "v2-alpha-tpuv6e"),
        ("v6e-8", "gke", 2, 4, "2x4", None),
        ("v6e-16", "gke", 4, 4, "4x4", None),
        ("v5p-16", "gke", 2, 4, "2x2x2", None),
        ("tpu7x-16", "gke", 2, 4, "2x2x2", None),
        ("tpu7x-2", "gke", 1, 1, "1x1x1", None),
    ],
)
def test_shapes(name, platform, hosts, per_host, topology, runtime):
    shape = catalog.lookup(name, platform)
    assert (shape.hosts, shape.chips_per_host, shape.topology, shape.runtime_version) == (
        hosts,
        per_host,
        topology,
        runtime,
    )
    assert shape.hosts * shape.chips_per_host == shape.chips


@pytest.mark.parametrize("platform", catalog.PLATFORMS)
def test_every_shape_is_consistent(platform):
    for name, shape in catalog.table(platform).items():
        gen = catalog.generation(shape.generation)
        assert shape.hosts * shape.chips_per_host == shape.chips, name
        assert shape.tensorcores == shape.chips * gen.tensorcores_per_chip, name
        assert len(catalog.parse_topology(shape.topology)) == gen.rank, name
        assert shape.accelerator_type == f"{gen.name}-{shape.tensorcores}", name
        assert shape.multislice == gen.multislice
        if platform == "gke":
            assert shape.machine_type == f"{gen.gke_machine_family}-{shape.chips_per_host}t"
            expected = (
                None if shape.hosts == 1 else ("workload-policy" if gen.gke_workload_policy else "COMPACT")
            )
            assert shape.placement == expected, name
            assert shape.runtime_version is None
        else:
            assert shape.machine_type is None and shape.placement is None
            assert shape.runtime_version == gen.runtime_version


def test_every_generation_is_on_some_platform():
    names = {g.name for g in catalog.GENERATIONS}
    assert names == {"v2", "v3", "v4", "v5litepod", "v5p", "v6e", "tpu7x", "tpu7"}
    on_vm = {g.name for g in catalog.generations("tpu-vm")}
    on_gke = {g.name for g in catalog.generations("gke")}
    assert on_vm == {"v2", "v3", "v4", "v5litepod", "v5p", "v6e"}
    assert on_gke == {"v4", "v5litepod", "v5p", "v6e", "tpu7x", "tpu7"}


def test_secure_boot_only_where_the_tpu_vm_api_creates_the_vms():
    """Secure Boot is a V2Vm setting: a GKE-only generation (no runtime version) cannot carry it."""
    for gen in catalog.GENERATIONS:
        assert not gen.shielded_vm or gen.runtime_version is not None, gen.name


def test_multislice_only_from_v4():
    assert {g.name for g in catalog.GENERATIONS if not g.multislice} == {"v2", "v3"}


@pytest.mark.parametrize(
    "alias, canonical",
    [
        ("tpu-v6e-slice-16", "v6e-16"),
        ("tpu-v6e-slice-4x4", "v6e-16"),
        ("v6e-4x4", "v6e-16"),
        ("v5e-16", "v5litepod-16"),
        ("tpu-v5-lite-podslice-8", "v5litepod-8"),
        ("V5P-2x2x2", "v5p-16"),
        ("tpu-v5p-slice-16", "v5p-16"),
        ("tpu-v4-podslice-2x2x2", "v4-16"),
    ],
)
def test_alias_names_resolve(alias, canonical):
    assert catalog.lookup(alias).accelerator_type == canonical


def test_tpu7x_on_tpu_vm_points_to_gke():
    with pytest.raises(catalog.CatalogError, match="--platform gke"):
        catalog.lookup("tpu7x-16", "tpu-vm")


def test_v2_on_gke_points_to_tpu_vm():
    with pytest.raises(catalog.CatalogError, match="--platform tpu-vm"):
        catalog.lookup("v2-8", "gke")


def test_unknown_type_names_three_closest():
    with pytest.raises(catalog.CatalogError) as err:
        catalog.lookup("v5p-7")
    assert "v5p-8, v5p-16, v5p-32" in str(err.value)


def test_unknown_generation_suggests_by_spelling():
    with pytest.raises(catalog.CatalogError) as err:
        catalog.lookup("v6x-16")
    message = str(err.value)
    assert "closest valid types" in message
    assert message.count(",") >= 2


def test_unknown_platform():
    with pytest.raises(catalog.CatalogError, match="tpu-vm, gke"):
        catalog.table("tpu-pod")


@pytest.mark.parametrize(
    "runtime, generations",
    [
        ("v2-alpha-tpuv6e", ["v6e"]),
        ("v2-alpha-tpuv5", ["v5p"]),
        ("v2-alpha-tpuv5-lite", ["v5litepod"]),
        ("tpu-ubuntu2204-base", ["v2", "v3", "v4"]),
    ],
)
def test_runtime_generations(runtime, generations):
    assert catalog.runtime_generations(runtime) == generations


_VM_NAMES = sorted(catalog.table("tpu-vm"))


@given(st.sampled_from(_VM_NAMES))
def test_every_name_round_trips(name):
    shape = catalog.lookup(name)
    assert catalog.lookup(shape.accelerator_type).chips == shape.chips
    assert catalog.lookup(f"{shape.generation}-{shape.topology}") == shape


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-x", max_size=20))
def test_lookup_never_crashes(text):
    try:
        shape = catalog.lookup(text)
    except catalog.CatalogError as exc:
        assert "closest valid types" in str(exc) or "not available" in str(exc)
    else:
        assert catalog.canonical_name(text) in catalog.table("tpu-vm")
        assert shape.chips >= 1


@given(st.sampled_from([g for g in catalog.GENERATIONS if g.rank == 2]), st.integers(1, 4096))
def test_two_d_sizes_are_powers_of_two(gen, size):
    name = f"{gen.name}-{size}"
    try:
        shape = catalog.lookup(name)
    except catalog.CatalogError:
        return
    assert shape.chips & (shape.chips - 1) == 0
