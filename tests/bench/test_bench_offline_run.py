"""bench/offline_run.py: its baseline collects Pulumi's stack traces, and the report has a row
per stack with both figures and their ratio. How long a run takes is the benchmark's to say,
not a test's."""

from __future__ import annotations

import pytest

from tests.bench import load

offline_run = load("offline_run")
STACK = offline_run.STACKS / offline_run.DEFAULT_STACKS[1]


def test_the_baseline_walks_the_stack_as_pulumi_does(stack_walks: list[int]) -> None:
    """The shipped engine never does (tests/infra/test_mocks.py)."""
    with offline_run.pulumis_stack_traces():
        offline_run.seconds_per_run(STACK, 1)
    assert stack_walks


def test_the_report_has_a_row_per_stack_with_both_figures_and_their_ratio(capsys):
    assert offline_run.main(["--runs", "1", "--stack", str(STACK)]) == 0
    header, row = capsys.readouterr().out.splitlines()
    name, *figures = row.split()  # a stack file's name holds no space
    assert "ratio" in header and name == STACK.name
    shipped, traced, ratio = map(float, figures)
    assert shipped > 0 and traced > 0
    assert ratio == pytest.approx(traced / shipped, rel=0.05, abs=0.02)
