"""The controller's reconciliation (`controller.reconcile`): from what the stack's capacity cell
wants and what a slice's kind observed, which action, without a cloud."""

from __future__ import annotations

import pytest

from rayslice import capacity_table as table
from rayslice.recovery import controller as c
from rayslice.recovery import kinds
from rayslice.recovery.journal import INSERT, Recreation
from rayslice.recovery.kinds import Observation

SPEC = {"mig": {"name": "x"}, "instances": []}
REPAIRED = table.cell(table.COMPUTE, table.ON_DEMAND)  # Compute Engine repairs the slice
SPOT = table.cell(table.COMPUTE, table.SPOT)
BROKEN = Observation(True, "MIG host w1 TERMINATED", gone=False)
GRACE = float(REPAIRED.repair_grace_s or 0)


def _state(**fields: object) -> c.SliceState:
    return c.SliceState(recorded=SPEC, **fields)


def test_a_healthy_slice_and_an_ended_one_are_left_alone() -> None:
    assert c.reconcile(Observation(False, "MIG 4 of 4", whole=True), _state(), SPOT, 0).action == c.HEALTHY
    ended = Observation(False, "MIG 0 of 4 instances: the run ended", ended=True)
    assert c.reconcile(ended, _state(), REPAIRED, 0).action == c.ENDED


def test_a_slice_google_repairs_is_left_to_google_until_the_grace_has_run_out() -> None:
    assert c.reconcile(BROKEN, _state(), REPAIRED, 100).action == c.LEAVE_TO_GOOGLE
    waiting = _state(broken_since=100.0)
    assert c.reconcile(BROKEN, waiting, REPAIRED, 100 + GRACE - 1).action == c.WAITING
    plan = c.reconcile(BROKEN, waiting, REPAIRED, 100 + GRACE)
    assert plan == c.Plan(c.RECREATE, f"not recovered after {GRACE / 60:.0f} min; ")


@pytest.mark.parametrize(
    "observation, cell",
    [(BROKEN, SPOT), (Observation(True, "MIG missing"), REPAIRED), (BROKEN, None)],
    ids=["spot", "gone", "no-cell"],
)
def test_spot_a_gone_slice_or_an_older_configuration_is_recreated_at_once(
    observation: Observation, cell: table.Cell | None
) -> None:
    assert c.reconcile(observation, _state(), cell, 0) == c.Plan(c.RECREATE)


def test_a_queued_slice_is_reconciled_by_its_requests_cell_not_the_stacks() -> None:
    queued = table.cell(table.TPU_VM, table.FLEX_START, queued=True)  # the Cloud TPU service repairs
    terminated = Observation(True, "queued resource ACTIVE, node state TERMINATED", gone=False, cell=queued)
    assert c.reconcile(terminated, _state(), None, 0).action == c.LEAVE_TO_GOOGLE


def test_backoff_a_missing_spec_and_a_recreation_under_way() -> None:
    gone = Observation(True, "node missing")
    assert c.reconcile(gone, _state(next_try=50.0), SPOT, 49).action == c.WAITING
    assert c.reconcile(gone, c.SliceState(), SPOT, 0).action == c.NO_SPEC
    # A recreation under way is finished first, whatever is seen (once its backoff has passed).
    pending = _state(recreation=Recreation(INSERT, "MIG missing"))
    assert c.reconcile(Observation(False, "MIG 0 of 0"), pending, SPOT, 0).action == c.FINISH
    pending.next_try = 10.0
    assert c.reconcile(gone, pending, SPOT, 5).action == c.WAITING


def test_each_vm_platform_has_a_kind_and_gke_none() -> None:
    assert isinstance(kinds.of("compute"), kinds.MigSlices)
    assert isinstance(kinds.of("tpu-vm"), kinds.TpuNodeSlices)
    assert kinds.of("gke") is None and kinds.role_parts("gke") == () and kinds.held("gke") == ()
