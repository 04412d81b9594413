"""The catalog's list prices against the dated table they were copied from (tests/fixtures/
skypilot-catalog-gcp/vms-rows.csv, its origin in SOURCE.md)."""

from __future__ import annotations

import csv
import re

import pytest

from rayslice import catalog

# The source writes each slice's price with 5 decimals; a per-chip price times the chips may
# differ from it by that rounding, per chip.
ROUNDING = 1e-5
CAPACITY_COLUMNS = {"on-demand": "Price", "spot": "SpotPrice"}


@pytest.fixture(scope="module")
def rows(fixtures_dir):
    with (fixtures_dir / "skypilot-catalog-gcp" / "vms-rows.csv").open() as f:
        return list(csv.DictReader(f))


def _chips(name: str) -> tuple[str, int]:
    """``tpu-v5p-1024`` -> (v5p, 512): N counts TensorCores where the catalog says so."""
    match = re.fullmatch(r"tpu-(?P<gen>[a-z0-9]+)-(?P<n>[0-9]+)", name)
    assert match, name
    gen = catalog.generation(match["gen"])
    return gen.name, int(match["n"]) // gen.tensorcores_per_chip


def test_every_tpu_row_is_its_chips_at_the_catalog_price(rows):
    checked = 0
    for row in (r for r in rows if r["AcceleratorName"].startswith("tpu-")):
        generation, chips = _chips(row["AcceleratorName"])
        for capacity, column in CAPACITY_COLUMNS.items():
            per_chip = catalog.chip_hour_price(generation, row["Region"], capacity)
            assert per_chip is not None, (row["AcceleratorName"], row["Region"], capacity)
            assert abs(per_chip * chips - float(row[column])) <= ROUNDING * chips, (row, capacity)
            checked += 1
    assert checked == 2 * 47


def test_every_machine_row_is_the_catalog_price(rows):
    machines = [r for r in rows if r["InstanceType"]]
    assert len(machines) == 13
    for row in machines:
        for capacity, column in CAPACITY_COLUMNS.items():
            price = catalog.machine_hour_price(row["InstanceType"], row["Region"], capacity)
            assert price == float(row[column]), (row, capacity)


def test_every_catalog_price_has_a_row(rows):
    """Nothing in the price file that the copied table does not back."""
    tpu_rows = {
        (_chips(r["AcceleratorName"])[0], r["Region"])
        for r in rows
        if r["AcceleratorName"].startswith("tpu-")
    }
    machine_rows = {(r["InstanceType"], r["Region"]) for r in rows if r["InstanceType"]}
    data = catalog.prices()
    for generation, regions in data["tpu_chip_hour"].items():
        for region, by_capacity in regions.items():
            assert (generation, region) in tpu_rows
            assert set(by_capacity) == set(CAPACITY_COLUMNS)
    for machine, regions in data["machine_hour"].items():
        for region in regions:
            assert (machine, region) in machine_rows


def test_the_price_file_is_dated_and_names_its_source():
    data = catalog.prices()
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", data["retrieved"])
    assert "skypilot-catalog" in data["source"] and "006059e0f18a" in data["source"]
    assert data["retrieved"] in catalog.price_source()


@pytest.mark.parametrize(
    ("generation", "region", "capacity"),
    [
        ("tpu7x", "us-central1", "on-demand"),  # no row in the source
        ("v6e", "us-central1", "reserved"),  # billed under the reservation's agreement
        ("v6e", "us-central1", "flex-start"),  # not in the source
        ("v6e", "asia-east1", "on-demand"),  # the source's 700.0 placeholder, not copied
        ("v2", "us-central1", "on-demand"),  # device and Pod rates differ per chip
    ],
)
def test_no_published_price_is_none_and_says_so(generation, region, capacity):
    assert catalog.chip_hour_price(generation, region, capacity) is None
    assert catalog.format_price(None) == "no published price"


def test_a_slice_costs_its_chips_at_the_per_chip_price():
    v6e_16 = catalog.lookup("v6e-16", "compute")
    assert catalog.slice_hour_price(v6e_16, "us-east5", "on-demand") == pytest.approx(16 * 2.7)
    assert catalog.format_price(catalog.slice_hour_price(v6e_16, "us-east5", "on-demand")) == "$43.20/h"
    v5p_16 = catalog.lookup("v5p-16", "tpu-vm")  # 8 chips
    assert catalog.slice_hour_price(v5p_16, "us-central1", "on-demand") == pytest.approx(8 * 4.2)
