"""The offline engine leaves nothing behind a run: `preview`, the tests and the simulator's cloud
bridge run the program many times in one process."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path

from rayslice.infra import preview
from rayslice.infra.mocks import OfflineEngine
from rayslice.infra.program import main

STACK = Path(__file__).resolve().parents[2] / "infra" / "Pulumi.example-tpu-vm-queued-v6e-16.yaml"


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_runs_keep_no_threads_event_loops_or_file_descriptors() -> None:
    config = preview.stack_config(str(STACK), [])
    program = functools.partial(main, preview._no_stack_lock)

    def run() -> None:
        OfflineEngine().run(program, config)  # a fresh cloud each time

    run()  # the first run imports and caches what every later one uses
    descriptors, threads = _open_descriptors(), threading.active_count()
    for _ in range(3):
        run()
    # Before the fix each run kept its worker threads and about 20 descriptors (their event loops).
    assert threading.active_count() == threads
    assert _open_descriptors() <= descriptors
