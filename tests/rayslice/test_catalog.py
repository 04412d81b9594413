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
        assert platform in gen.platforms, name
        multi_host_placement = "workload-policy" if gen.gke_workload_policy else "COMPACT"
        if platform == "gke":
            assert shape.machine_type == f"{gen.gke_machine_family}-{shape.chips_per_host}t"
            assert shape.placement == (None if shape.hosts == 1 else multi_host_placement), name
            assert shape.runtime_version is None and shape.image_family is None
        elif platform == "compute":
            assert shape.machine_type == f"{gen.compute_machine_family}-{shape.chips_per_host}t", name
            assert shape.chips_per_host in gen.compute_chips_per_host, name
            assert shape.placement == (None if shape.hosts == 1 else "workload-policy"), name
            assert shape.runtime_version is None and shape.gke_accelerator is None
            assert (shape.image_project, shape.image_family) == (
                "ubuntu-os-accelerator-images",
                gen.compute_image_family,
            )
        else:
            assert shape.machine_type is None and shape.placement is None
            assert shape.runtime_version == gen.runtime_version
            assert shape.image_family is None


def test_every_generation_is_on_some_platform():
    names = {g.name for g in catalog.GENERATIONS}
    assert names == {"v2", "v3", "v4", "v5litepod", "v5p", "v6e", "tpu7x", "tpu7"}
    on_vm = {g.name for g in catalog.generations("tpu-vm")}
    on_gke = {g.name for g in catalog.generations("gke")}
    on_compute = {g.name for g in catalog.generations("compute")}
    assert on_vm == {"v2", "v3", "v4", "v5litepod", "v5p", "v6e"}
    assert on_gke == {"v4", "v5litepod", "v5p", "v6e", "tpu7x", "tpu7"}
    assert on_compute == {"v5p", "v6e", "tpu7x"}


@pytest.mark.parametrize(
    "generation, platforms, default",
    [
        ("v2", ("tpu-vm",), "tpu-vm"),
        ("v4", ("tpu-vm", "gke"), "tpu-vm"),
        ("v5litepod", ("tpu-vm", "gke"), "tpu-vm"),
        ("v5p", ("compute", "tpu-vm", "gke"), "compute"),
        ("v6e", ("compute", "tpu-vm", "gke"), "compute"),
        ("tpu7x", ("compute", "gke"), "compute"),
        ("tpu7", ("gke",), "gke"),
    ],
)
def test_platforms_per_generation(generation, platforms, default):
    gen = catalog.generation(generation)
    assert (gen.platforms, gen.default_platform) == (platforms, default)


@pytest.mark.parametrize(
    "name, hosts, per_host, topology, machine_type, image_family",
    [
        ("v6e-1", 1, 1, "1x1", "ct6e-standard-1t", "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"),
        ("v6e-4", 1, 4, "2x2", "ct6e-standard-4t", "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"),
        ("v6e-8", 1, 8, "2x4", "ct6e-standard-8t", "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"),
        ("v6e-16", 4, 4, "4x4", "ct6e-standard-4t", "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"),
        ("v6e-256", 64, 4, "16x16", "ct6e-standard-4t", "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"),
        ("v5p-8", 1, 4, "2x2x1", "ct5p-hightpu-4t", "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"),
        ("v5p-16", 2, 4, "2x2x2", "ct5p-hightpu-4t", "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"),
        ("tpu7x-2", 1, 1, "1x1x1", "tpu7x-standard-1t", "ubuntu-accel-2404-amd64-tpu-tpu7x"),
        ("tpu7x-8", 1, 4, "2x2x1", "tpu7x-standard-4t", "ubuntu-accel-2404-amd64-tpu-tpu7x"),
        ("tpu7x-16", 2, 4, "2x2x2", "tpu7x-standard-4t", "ubuntu-accel-2404-amd64-tpu-tpu7x"),
    ],
)
def test_compute_shapes(name, hosts, per_host, topology, machine_type, image_family):
    shape = catalog.lookup(name, "compute")
    assert (shape.hosts, shape.chips_per_host, shape.topology, shape.machine_type, shape.image_family) == (
        hosts,
        per_host,
        topology,
        machine_type,
        image_family,
    )


def test_compute_json_has_the_other_platforms_keys_plus_the_image():
    compute = catalog.lookup("v6e-16", "compute").as_json()
    other = catalog.lookup("v6e-16", "tpu-vm").as_json()
    assert list(compute) == [*other, "image_project", "image_family"]
    assert compute["machine_type"] == "ct6e-standard-4t"
    assert compute["image_project"] == "ubuntu-os-accelerator-images"


def test_compute_generation_rows():
    rows = {r["generation"]: r for r in catalog.generation_rows("compute")}
    assert set(rows) == {"v5p", "v6e", "tpu7x"}
    assert rows["v6e"]["machine"] == "ct6e-standard-1t,ct6e-standard-4t,ct6e-standard-8t"
    assert rows["v6e"]["smallest"] == "v6e-1" and rows["tpu7x"]["smallest"] == "tpu7x-2"
    assert rows["tpu7x"]["image"] == "ubuntu-os-accelerator-images/ubuntu-accel-2404-amd64-tpu-tpu7x"


@pytest.mark.parametrize(
    "missing, nearest",
    [
        # Google's v2 page lists v2-8, 32, 128, 256, 512; the v3 table v3-8, 32, 64 ... 2048.
        ("v2-16", "v2-8, v2-32"),
        ("v2-64", "v2-32, v2-8, v2-128"),
        ("v3-16", "v3-8, v3-32"),
    ],
)
def test_tpu_vm_sizes_the_api_does_not_offer(missing, nearest):
    with pytest.raises(catalog.CatalogError) as err:
        catalog.lookup(missing, "tpu-vm")
    assert nearest in str(err.value)


def test_tpu_vm_takes_whole_cube_topologies_in_ascending_order():
    assert catalog.lookup("v4-4x4x8", "tpu-vm").chips == 128
    assert catalog.lookup("v4-2x2x1", "tpu-vm").accelerator_type == "v4-8"  # sub-cube names stay
    with pytest.raises(catalog.CatalogError, match="ascending order, v4-4x4x8"):
        catalog.lookup("v4-8x4x4", "tpu-vm")
    assert catalog.lookup("v4-8x4x4", "gke").topology == "8x4x4"  # xpk's GKE table has it


def test_tpu_vm_v2_and_v3_sizes_are_the_documented_ones():
    def sizes(gen):
        return sorted({s.tensorcores for s in catalog.table("tpu-vm").values() if s.generation == gen})

    assert sizes("v2") == [8, 32, 128, 256, 512]
    assert sizes("v3") == [8, 32, 64, 128, 256, 512, 1024, 2048]


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


@pytest.mark.parametrize(
    "name, platform, offered",
    [
        ("tpu7x-16", "tpu-vm", "compute, gke"),
        ("v2-8", "gke", "tpu-vm"),
        ("v2-8", "compute", "tpu-vm"),
        ("v5litepod-16", "compute", "tpu-vm, gke"),
        ("tpu7-8", "compute", "gke"),
    ],
)
def test_generation_not_on_a_platform_names_the_platforms_that_offer_it(name, platform, offered):
    with pytest.raises(catalog.CatalogError) as err:
        catalog.lookup(name, platform)
    message = str(err.value)
    assert f"is not available on {platform}" in message
    assert f"it is offered on: {offered}: set platform to one of them" in message


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
    with pytest.raises(catalog.CatalogError, match="use one of: compute, tpu-vm, gke"):
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
        assert any(hint in str(exc) for hint in ("closest valid types", "not available", "ascending order"))
    else:
        assert catalog.canonical_name(text) in catalog.table("tpu-vm")
        assert shape.chips >= 1


@pytest.mark.parametrize("platform", catalog.PLATFORMS)
def test_two_d_sizes_are_powers_of_two(platform):
    """Every 2-D shape has a power-of-two chip count, and no other size resolves."""
    two_d = {g.name for g in catalog.GENERATIONS if g.rank == 2}
    shapes = [s for s in catalog.table(platform).values() if s.generation in two_d]
    assert shapes  # v6e is 2-D and on every platform
    for shape in shapes:
        assert shape.chips & (shape.chips - 1) == 0, shape.accelerator_type
    for gen in sorted(two_d & {g.name for g in catalog.generations(platform)}):
        for size in (3, 6, 12, 24, 48, 96):
            with pytest.raises(catalog.CatalogError, match="closest valid types"):
                catalog.lookup(f"{gen}-{size}", platform)


@pytest.mark.parametrize(
    "name, generation",
    [
        ("tpu-v6e-slice-16", "v6e"),
        ("v5e-8", "v5litepod"),
        ("ironwood-4x4x4", "tpu7x"),
        ("v7x-16", "tpu7x"),
        ("v9-8", None),
        ("x", None),
    ],
)
def test_generation_of(name, generation):
    gen = catalog.generation_of(name)
    assert (gen.name if gen else None) == generation


@pytest.mark.parametrize(
    "name, canonical, reported",
    [
        # Compute Engine and GKE say tpu7x-N; a TPU7x host and Ray say v7x-N.
        ("tpu7x-16", "tpu7x-16", "v7x-16"),
        ("v7x-16", "tpu7x-16", "v7x-16"),
        ("V7X-2x2x2", "tpu7x-2x2x2", "v7x-2x2x2"),
        ("tpu7-8", "tpu7-8", "v7-8"),
        ("tpu-v6e-slice-16", "v6e-16", "v6e-16"),
        ("v5e-8", "v5litepod-8", "v5litepod-8"),
        ("v9-8", "v9-8", "v9-8"),
    ],
)
def test_a_generations_names_are_one_fact(name, canonical, reported):
    assert catalog.canonical_name(name) == canonical
    assert catalog.reported_name(name) == reported
    assert catalog.canonical_name(catalog.reported_name(name)) == canonical


def test_the_hosts_spelling_finds_the_same_shape():
    for platform in ("compute", "gke"):
        assert catalog.lookup("v7x-16", platform) == catalog.lookup("tpu7x-16", platform)
    with pytest.raises(catalog.CatalogError, match="not available on tpu-vm"):
        catalog.lookup("v7x-16", "tpu-vm")
