"""Progress as it happens: a job's lines reach a pipe while the job is still running.

A job's stdout is a pipe (`| tee`) or, under the Jobs API, a log file; Python buffers both in
blocks, so a line printed without a flush arrives when the process ends. Each test runs the code
in a child process that stops, right after its first line, until the test has read that line:
held back, the line never comes, and the test fails (after a guard against hanging for good)
instead of passing. (The driver's side under Ray: test_cluster.py; the client's: tests/jobs.)
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import textwrap

import pytest

# Not a speed limit: only how long to wait for a line that, held back, would never come.
HANG_GUARD_S = 300


def first_line_while_running(code: str, answers: int) -> tuple[str, list[str]]:
    """Run `code` with stdout a pipe, read its first line while it waits on stdin, then let it
    finish (`answers` lines on stdin); returns that first line and the rest of its output."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        # A selector, not select(): select() refuses descriptors past 1023, and a test worker
        # that has run many others may hold that many.
        with selectors.DefaultSelector() as selector:
            selector.register(child.stdout, selectors.EVENT_READ)
            readable = selector.select(HANG_GUARD_S)
        assert readable, "the first line was held back while the process went on"
        assert child.stdout is not None
        first = child.stdout.readline()
        assert child.poll() is None  # still running: it waits for our answer
        out, err = child.communicate("\n" * answers, timeout=HANG_GUARD_S)
    finally:
        child.kill()
    assert child.returncode == 0, err
    return first.rstrip("\n"), out.splitlines()


@pytest.mark.parametrize(
    "module, size", [("jax_train", "batch_per_device=8, hidden=16"), ("xla_train", "batch=8, hidden=16")]
)
def test_the_training_loop_prints_each_step_as_it_ends(module, size):
    """`train()`, as a job's driver or `bench/train.py` runs it, with the default progress."""
    first, rest = first_line_while_running(
        f"""
        import sys
        from rayslice.workloads import _cluster
        from rayslice.workloads.{module} import train

        shown = _cluster.show_line

        def show_then_wait(line):
            shown(line)
            sys.stdin.readline()  # until the test has read the line

        _cluster.show_line = show_then_wait
        train(steps=3, {size})
        print("END")
        """,
        answers=3,
    )
    assert first.startswith("step   0  loss")
    assert [line.split()[:2] for line in rest[:-1]] == [["step", "1"], ["step", "2"]]
    assert rest[-1] == "END"


def test_a_jobs_driver_writes_whole_lines_through_a_pipe():
    """`run_main` makes the driver's stdout line-buffered: its own prints, and the task output Ray
    forwards to it, arrive as they are written when a workload runs locally into a pipe."""
    first, rest = first_line_while_running(
        """
        import argparse, sys
        from rayslice.workloads import _cluster

        _cluster.connect = lambda: None  # no cluster: only the driver's output is under test

        def body(args):
            print("first")
            sys.stdin.readline()
            print("END")

        sys.exit(_cluster.run_main(argparse.ArgumentParser(), body, []))
        """,
        answers=1,
    )
    assert (first, rest) == ("first", ["END"])
