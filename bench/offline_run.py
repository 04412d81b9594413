"""Runs of the Pulumi program in the offline engine (what `preview`, the tests and the simulator's
cloud bridge do, often hundreds of times in one process), as shipped and with Pulumi's per-resource
stack traces collected as the SDK does by default, in one process.

The offline engine gives Pulumi no stack trace for a resource: a real engine uses it to point its
diagnostics at the user's line, the mocks never read it, and collecting it (`traceback.extract_stack`
and a source-file check per frame, at every registration) costs in proportion to the caller's
stack: deep under pytest, shallow here. This prints the median seconds a run of each example
stack takes both ways, and their ratio.

    python bench/offline_run.py [--runs N] [--stack FILE ...]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rayslice.infra import mocks, preview
from rayslice.infra.program import main as program

STACKS = Path(__file__).resolve().parents[1] / "infra"
DEFAULT_STACKS = ("Pulumi.example-compute-elastic-v6e-16.yaml", "Pulumi.example-tpu-vm-queued-v6e-16.yaml")


@contextmanager
def pulumis_stack_traces() -> Iterator[None]:
    """The baseline: runs collect every resource's stack trace, as Pulumi's SDK does."""
    shipped = mocks._no_stack_trace
    mocks._no_stack_trace = mocks.PULUMIS_STACK_TRACE
    try:
        yield
    finally:
        mocks._no_stack_trace = shipped


def seconds_per_run(stack: Path, runs: int) -> float:
    """The median seconds of `runs` runs of the program on `stack`, each in a fresh engine and cloud."""
    config = preview.stack_config(str(stack), [])
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        mocks.run_offline(functools.partial(program, preview._no_stack_lock), config)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per stack and way (default: 10)")
    parser.add_argument("--stack", action="append", help="a stack file (default: two examples)")
    args = parser.parse_args(argv)
    stacks = [Path(s) for s in args.stack] if args.stack else [STACKS / name for name in DEFAULT_STACKS]
    print(f"{'stack':<44} {'shipped s/run':>14} {'Pulumi traces s/run':>20} {'ratio':>7}")
    for stack in stacks:
        seconds_per_run(stack, 1)  # the first run of a process builds what later runs reuse
        shipped = seconds_per_run(stack, args.runs)
        with pulumis_stack_traces():
            traced = seconds_per_run(stack, args.runs)
        print(f"{stack.name:<44} {shipped:14.3f} {traced:20.3f} {traced / shipped:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
