"""The capacity table: one cell per (platform, capacity), each complete and sourced."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayslice import capacity_table as table
from rayslice import cli
from rayslice.spec import load


def test_every_cell_is_complete_and_sourced() -> None:
    assert len({c.key for c in table.CELLS}) == len(table.CELLS)
    for c in table.CELLS:
        assert c.platform in table.PLATFORMS and c.capacity in table.CAPACITIES, c.key
        assert c.calls and c.sources and c.summary, c.key
        assert set(c.events) <= set(table.EVENTS), c.key
        assert {r.action for r in c.events.values()} <= set(table.ACTIONS), c.key
        assert table.GONE in c.events and table.NO_CAPACITY in c.events, c.key
        # Google repairs it (whole, or in place in an All Capacity reservation), so the controller
        # waits; nobody does, so it does not.
        waits = table.WAIT_FOR_REPAIR in {r.action for r in c.events.values()}
        assert (c.repair_grace_s is not None) == waits, c.key
        assert (
            c.repaired_by in (table.COMPUTE_ENGINE, table.CLOUD_TPU)
            or not waits
            or c.capacity == (table.RESERVED_ALL_CAPACITY)
        ), c.key
        assert (table.PREEMPTION in c.events) == (c.capacity == table.SPOT), c.key
        assert (table.SUSPENDED in c.events) == c.queued, c.key


def test_every_mig_of_tpu_hosts_does_nothing_on_failure() -> None:
    """D3: a MIG's REPAIR recreates one host, which cannot rejoin the slice's ICI domain."""
    for c in table.CELLS:
        if c.mig_mode is not None:
            assert c.failure_action == table.DO_NOTHING, c.key


def test_bulk_mode_only_with_the_provisioning_models_it_takes() -> None:
    """ "About bulk mode": reservation-bound or flex-start templates only; target size from 0
    unless the MIG is inserted whole."""
    for c in table.CELLS:
        if c.mig_mode == table.BULK:
            assert c.provisioning_model in (table.RESERVATION_BOUND_MODEL, table.FLEX_START_MODEL), c.key
        elif c.mig_mode == table.INDIVIDUAL:
            assert c.provisioning_model in (table.STANDARD_MODEL, table.SPOT_MODEL), c.key


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"platform": "compute", "capacity": "spot"}, "compute/spot"),
        ({"platform": "compute", "capacity": "reserved", "reservation": "r"}, "compute/reserved"),
        (
            {"platform": "compute", "capacity": "reserved", "reservation": "r", "calendarMode": True},
            "compute/reserved-calendar",
        ),
        ({"platform": "tpu-vm", "capacity": "reserved"}, "tpu-vm/reserved-any"),
        ({"platform": "tpu-vm", "capacity": "reserved", "queued": True}, "tpu-vm/queued/reserved-any"),
        (
            {"platform": "tpu-vm", "capacity": "flex-start", "queued": True, "zone": "us-east5-a"},
            "tpu-vm/queued/flex-start",
        ),
        ({"platform": "gke", "capacity": "flex-start", "zone": "us-east5-a"}, "gke/flex-start"),
    ],
)
def test_a_stack_finds_its_cell(keys: dict[str, object], expected: str) -> None:
    spec = load({"name": "demo", "acceleratorType": "v6e-16", "zone": "us-east5-b", **keys})
    assert table.cell_for(spec).key == expected


def test_a_missing_cell_is_named() -> None:
    with pytest.raises(table.NoSuchCell, match="compute/queued/spot"):
        table.cell("compute", "spot", queued=True)


def test_describe_says_who_repairs_and_what_the_controller_does() -> None:
    lines = table.cell("compute", "on-demand").describe()
    assert lines[0].startswith("capacity compute/on-demand:")
    assert "  repaired: Compute Engine recovers a failed slice whole" in lines
    assert any(
        line.startswith("  on host-maintenance, host-error: the controller leaves it to Google")
        and "240 min" in line
        for line in lines
    )


def test_validate_prints_the_stacks_own_cell(capsys: pytest.CaptureFixture[str]) -> None:
    """Before `pulumi up`, a user sees how the slices are made, who repairs them and what the
    controller does."""
    stack = str(Path(__file__).resolve().parents[2] / "infra" / "Pulumi.example-compute-flex-v6e-16.yaml")
    assert cli.main(["validate", "--stack-file", stack]) == 0
    out = capsys.readouterr().out
    assert "capacity compute/flex-start:" in out
    assert "slices made by: instanceTemplates.insert -> resourcePolicies.insert" in out
    assert "repaired: Compute Engine recovers a failed slice whole" in out
    assert "on run-duration-reached: the slice has ended" in out
    assert cli.main(["validate", "--stack-file", stack, "--set", "recovery=false"]) == 0
    assert "runs no recovery controller" in capsys.readouterr().out


def test_fill_puts_the_stacks_values_in_and_keeps_numbers_numbers() -> None:
    body = {"a": {"seconds": table.MAX_RUN_SECONDS}, "b": [table.TPU_ANY_RESERVATION_PATH], "c": "x"}
    values = {table.MAX_RUN_SECONDS: 7200, table.PROJECT: "p", table.ZONE: "z"}
    assert table.fill(body, values) == {
        "a": {"seconds": 7200},
        "b": ["projects/p/locations/z/reservations/-"],
        "c": "x",
    }


def test_a_queued_resource_read_back_names_its_cell() -> None:
    """The controller and status know the request, not the stack: its shape names the cell,
    gcloud's STANDARD default included."""
    path = "projects/p/locations/z/reservations/"
    cases = {
        "tpu-vm/queued/on-demand": {},
        "tpu-vm/queued/on-demand ": {"provisioningModel": "STANDARD"},
        "tpu-vm/queued/spot": {"spot": {}},
        "tpu-vm/queued/reserved-any": {"reservationName": path + "-"},
        "tpu-vm/queued/reserved": {"reservationName": path + "r"},
        "tpu-vm/queued/reserved-calendar": {
            "reservationName": path + "r",
            "provisioningModel": "RESERVATION_BOUND",
        },
        "tpu-vm/queued/flex-start": {
            "provisioningModel": "FLEX_START",
            "runDuration": {"maxRunDuration": "60s"},
        },
    }
    for key, request in cases.items():
        assert table.queued_cell({**request, "tpu": {}}).key == key.strip()
    with pytest.raises(table.NoSuchCell):
        table.queued_cell({"provisioningModel": "FLEX_START", "spot": {}})


def test_a_cell_travels_as_its_key() -> None:
    for found in table.CELLS:
        assert table.by_key(found.key) is found
    with pytest.raises(table.NoSuchCell, match="compute/reserved-calendar"):
        table.by_key("compute/calendar")


def test_why_not_says_what_to_set_instead() -> None:
    assert "set queued=true" in table.why_not("tpu-vm", table.FLEX_START)
    assert "needs reservation=" in table.why_not("compute", table.RESERVED_ANY)
    assert table.why_not("compute", table.SPOT, queued=True).startswith(
        "queued=true applies to platform=tpu-vm"
    )
