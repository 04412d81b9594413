"""The offline engine leaves nothing behind a run, and does no work that only a real engine reads:
`preview`, the tests and the simulator's cloud bridge run the program many times in one process."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import threading
from pathlib import Path

from rayslice.infra import mocks, preview
from rayslice.infra.mocks import OfflineEngine, run_offline
from rayslice.infra.program import main

STACK = Path(__file__).resolve().parents[2] / "infra" / "Pulumi.example-tpu-vm-queued-v6e-16.yaml"


def _event_loops_open() -> int:
    """This process's epoll descriptors: one per open event loop (and none of other kinds here)."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if _target(fd) == "anon_inode:[eventpoll]")


def _target(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except FileNotFoundError:  # closed since the listing (the listing's own descriptor, for one)
        return ""


def _executor_threads() -> set[threading.Thread]:
    """Threads of an event loop's executor: Pulumi's calls to the mocks run on them."""
    return {t for t in threading.enumerate() if t.name.startswith(("pulumi-mocks", "asyncio_"))}


def test_runs_keep_no_threads_event_loops_or_file_descriptors() -> None:
    config = preview.stack_config(str(STACK), [])
    program = functools.partial(main, preview._no_stack_lock)
    loops, threads = _event_loops_open(), _executor_threads()
    for _ in range(3):
        OfflineEngine().run(program, config)  # a fresh cloud each time
    # Before the fix each run kept six executor threads, each with an open event loop, and its
    # own loop: about 20 descriptors a run. Other tests' threads may end meanwhile, so the counts
    # are of the kinds a run makes, and may only fall.
    assert _executor_threads() <= threads
    assert _event_loops_open() <= loops


def test_a_run_never_walks_the_python_stack(stack_walks: list[int]) -> None:
    """Pulumi collects each resource's stack trace for a real engine's diagnostics; the offline
    engine gives it none (bench/offline_run.py says what that saves). Fails if Pulumi's SDK
    walks the stack by another name, so that the saving is not lost silently on an upgrade."""
    config = preview.stack_config(str(STACK), [])
    run = run_offline(functools.partial(main, preview._no_stack_lock), config)
    assert len(run.registrations) > 10 and stack_walks == []


def test_what_a_failed_run_left_unread_is_freed_without_a_log_line(caplog) -> None:
    """A failed run's Outputs fail with it, and nobody reads them: when asyncio frees such a
    Future or Task (an `Output.all`'s gather) it calls the loop's handler, which a failed run sets
    to drop exactly that (the CI log of the interrupted-apply tests showed a "Task exception was
    never retrieved" traceback at a pytest worker's exit). Anything else is still logged."""
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(mocks._unless_unread)

    async def fails() -> None:
        raise RuntimeError("the run's own failure")

    try:
        with caplog.at_level(logging.DEBUG, logger="asyncio"):
            task = loop.create_task(fails())
            future = loop.create_future()
            future.set_exception(RuntimeError("the run's own failure"))
            loop.run_until_complete(asyncio.wait([task]))
            del task, future
            gc.collect()
            assert [r.getMessage() for r in caplog.records] == []
            loop.call_exception_handler({"message": "something else went wrong"})
        assert [r.getMessage() for r in caplog.records] == ["something else went wrong"]
    finally:
        loop.close()
