"""Start long-lived processes detached from the caller, and stop exactly those later.

A PID alone can be reused after its process exits; a `ProcessRef` also holds the start time
the kernel reports in ``/proc/<pid>/stat``, so `stop` never signals a stranger's process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessRef:
    pid: int
    start_time: int  # field 22 of /proc/<pid>/stat (clock ticks since boot)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) of a process, or None if it does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may contain spaces
    return fields[0], int(fields[19])


def process_ref(pid: int) -> ProcessRef | None:
    """A reference to the process now running as `pid`, if any."""
    stat = _stat(pid)
    return ProcessRef(pid, stat[1]) if stat is not None else None


def start_detached(argv: Sequence[str], log_path: Path, env: Mapping[str, str]) -> ProcessRef:
    """Start `argv` in its own session, output appended to `log_path`; it outlives the caller."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
        )
    return process_ref(proc.pid) or ProcessRef(proc.pid, -1)  # -1: it already exited


def is_alive(ref: ProcessRef) -> bool:
    stat = _stat(ref.pid)
    return stat is not None and stat[1] == ref.start_time and stat[0] != "Z"


def stop(ref: ProcessRef, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; a no-op if the process is gone (or the PID reused)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not is_alive(ref):
            return
        os.kill(ref.pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            _reap(ref.pid)
            if not is_alive(ref):
                return
            time.sleep(0.05)


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our own child (tests start hosts in-process)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def cmdline(pid: int) -> list[str]:
    """The process's argv ([] if it is gone or a kernel thread)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []
