"""Submitting a bundled workload or a user's script as a Ray job and following it to its end (the
work behind `rayslice run`).

The job goes through the Ray Jobs API (the head's dashboard port), so the client needs no Ray
node of its own, and the cluster's hosts need Ray and JAX/torch_xla but not rayslice: the job
carries what it imports (`rayslice.jobs.upload`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from rayslice.errors import Interrupted, InvalidInput, JobFailed
from rayslice.jobs import connection, preflight, restarts, upload, working_dir
from rayslice.observability import record

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

# How much of a failed job's log is searched for a node's death.
LOG_TAIL_CHARS = 50_000
# What reading a job's stored log through the Jobs API raises when it cannot (the SDK's
# RuntimeError for an HTTP error, requests' errors for the connection).
_LOG_READ_ERRORS = (RuntimeError, ConnectionError, OSError)
# While the log streams, how often the job's status is read (`_stream`): `rayslice run` ends at
# most this long after Ray has the job's final status.
STATUS_POLL_S = 0.5
# How long `rayslice run --stop` waits for Ray to report the stopped job's final status.
STOP_WAIT_S = 30.0
# A Ray job's submission ID as `rayslice run` prints it ("raysubmit_..."), or one a user gave Ray:
# anything else is refused before it is put into a request path. It starts with a letter or a
# digit, so "." and ".." (which a URL resolves as path steps) and "-x" (an option) are never one.
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def submit(
    target_name: str,
    job_args: Sequence[str],
    *,
    address: str | None = None,
    token_file: Path | None = None,
    working_dir: str | None = None,
    max_restarts: int = 0,
    rejoin_timeout_s: float = restarts.REJOIN_TIMEOUT_S,
    verbose: bool = False,
    stop_on_interrupt: bool = False,
) -> str:
    """Submit, stream the logs until the job ends, and return its final status.

    A bundled job the cluster cannot run is refused first (`preflight`). With `max_restarts`, a
    job that failed because a node died (`restarts.node_death_reason`) is submitted again, up to
    that many times, once every slice the cluster had at the start is whole again. Raises
    `JobFailed` (exit 1) when the job ends in any other state than SUCCEEDED for good, and
    `Interrupted` (exit 130) on Ctrl-C or SIGTERM: the job then keeps running on the cluster (a
    Ray job does not depend on the client that submitted it) and the message says how to stop
    it, unless `stop_on_interrupt` asks to stop it there and then.
    """
    job = upload.resolve(target_name, working_dir)
    target = connection.choose_target(address, token_file)
    if job.files is not None:
        print(describe(job.files, verbose=verbose), file=sys.stderr, flush=True)
    client = connection.connect(target)
    preflight.check(job, job_args, target)
    command = " ".join([job.entrypoint, *map(shlex.quote, job_args)])
    baseline = restarts.cluster_shape(target) if max_restarts > 0 else None
    restarted = 0
    first_job: str | None = None
    while True:
        with tempfile.TemporaryDirectory(prefix="rayslice-job-") as staging:
            job_id = client.submit_job(entrypoint=command, runtime_env=upload.runtime_env(job, Path(staging)))
        print(f"rayslice: submitted {job_id} to {target.url}: {command}", file=sys.stderr, flush=True)
        journal = record.open_journal(target.record, job_id, first_job, command)
        first_job = first_job or job_id
        try:
            with _sigterm_interrupts():
                return follow(client, job_id, journal)
        except KeyboardInterrupt:
            journal.flush()
            raise _interrupted(client, job_id, target, stop=stop_on_interrupt) from None
        except JobFailed as failure:
            if baseline is None or restarted >= max_restarts:
                raise
            text = f"{failure}\n{_job_logs(client, job_id)}"
            reason = restarts.node_death_reason(text)
            if reason is None:
                raise  # the job failed on its own: restarting would fail the same way
            restarted += 1
            journal.mark(record.MARK_NODE_DIED)
            print(
                f"rayslice: {failure}\nrayslice: a node died; waiting for every slice to be whole again",
                file=sys.stderr,
                flush=True,
            )
            restarts.wait_until_whole(target, baseline, rejoin_timeout_s, dead=restarts.dead_node_ids(text))
            journal.mark(record.MARK_WHOLE_AGAIN)
            print(f"restart {restarted} of {max_restarts} after {reason}", flush=True)


def stop(job_id: str, *, address: str | None = None, token_file: Path | None = None) -> str:
    """Stop a job (`rayslice run --stop`), wait for its final status and return it; a job that has
    already ended is left as it is. `InvalidInput` (exit 2) for an ID the cluster does not know."""
    if not JOB_ID.fullmatch(job_id):
        raise InvalidInput(
            f"{job_id[:80]!r} is not a Ray job ID: give the ID `rayslice run` printed (raysubmit_...)"
        )
    target = connection.choose_target(address, token_file)
    client = connection.connect(target)
    try:
        status = client.get_job_status(job_id)
    except RuntimeError:
        raise InvalidInput(f"no job {job_id} on the cluster at {target.url}") from None
    if not status.is_terminal():
        client.stop_job(job_id)
        deadline = time.monotonic() + STOP_WAIT_S
        while not (status := client.get_job_status(job_id)).is_terminal() and time.monotonic() < deadline:
            time.sleep(STATUS_POLL_S)
    print(f"rayslice: job {job_id} {status.value}", file=sys.stderr, flush=True)
    return str(status.value)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a scheduler or `kill` ending `rayslice run`) interrupts as Ctrl-C does, so that both
    reach the code that says what keeps running; the previous handler is restored after. Python
    lets only the main thread set a handler: elsewhere (a library caller's thread) SIGTERM keeps
    its handler.

    It goes through whatever handles SIGINT at that moment rather than raising KeyboardInterrupt
    itself: while the log streams, `asyncio.run`'s handler cancels its main task and raises
    KeyboardInterrupt once the loop has wound down. Raised from here instead, it landed inside
    the streaming task (mid-write of the job's record) and asyncio printed that task's traceback
    ("Task exception was never retrieved") under the interrupt message."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        on_sigint = signal.getsignal(signal.SIGINT)
        if callable(on_sigint):  # Python's default_int_handler, or asyncio.run's while it runs
            on_sigint(signal.SIGINT, frame)
        else:  # SIGINT ignored (started in the background by a shell) or left to the system
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted(
    client: JobSubmissionClient, job_id: str, target: connection.Target, *, stop: bool
) -> Interrupted:
    """What an interrupted `rayslice run` ends with: the job stopped (`stop`), or the job left
    running and the command that stops it, with the flags that reach this cluster again."""
    if stop:
        client.stop_job(job_id)
        return Interrupted(f"interrupted: asked Ray to stop job {job_id} on {target.url}")
    flags = [f"--address {shlex.quote(target.url)}"] if target.source == "--address" else []
    if target.token_file is not None and target.source != "simulator":
        flags.append(f"--token-file {shlex.quote(str(target.token_file))}")
    command = " ".join(["rayslice run", *flags, "--stop", job_id])
    return Interrupted(
        f"interrupted: job {job_id} keeps running on {target.url}; stop it with `{command}` "
        "(`rayslice run --stop-on-interrupt` stops the job on Ctrl-C instead)"
    )


def describe(files: working_dir.Selection, *, verbose: bool) -> str:
    """What a script's job uploads: how many files and bytes, what the content rules kept back
    (named: the user may have meant to ship it), and with `verbose` every file."""
    lines = [f"rayslice: uploading {len(files.files)} files ({_size(files.size)}) from {files.root}"]
    if files.kept_back:
        kept = ", ".join(files.kept_back)
        lines.append(f"rayslice: kept back as credentials or simulator state: {kept}")
    if verbose:
        lines += [f"  {entry.path} ({_size(entry.size)})" for entry in files.files]
    return "\n".join(lines)


def _size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value, unit = size / 1024, "KiB"
    for larger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{value:.1f} {unit}"


def follow(client: JobSubmissionClient, job_id: str, journal: record.Journal | None = None) -> str:
    """Stream a job's logs (into `journal` too, each line with the time it came); return
    "SUCCEEDED" or raise `JobFailed` with Ray's message."""
    from ray.job_submission import JobStatus

    journal = journal or record.NO_JOURNAL
    asyncio.run(_stream(client, job_id, journal.lines))
    status = client.get_job_status(job_id)
    while not status.is_terminal():  # the log stream can close a moment before the status settles
        time.sleep(0.2)
        status = client.get_job_status(job_id)
    journal.end(str(status.value))
    if status != JobStatus.SUCCEEDED:
        info = client.get_job_info(job_id)
        raise JobFailed(f"job {job_id} {status.value}: {info.message or ''}".rstrip())
    return str(status.value)


async def _stream(client: JobSubmissionClient, job_id: str, seen: Callable[[str], None]) -> None:
    """Print the job's log as the dashboard streams it, until the stream ends or the job is over,
    whichever comes first; then what the stream did not bring, from the job's stored log.

    Once the job is over its stored log is whole (the driver wrote it itself and has exited), and
    the stream has nothing more to give: it closes on its own a second or more later (Ray 2.60's
    dashboard reads the log once a second and once more after the status turns final), and it was
    seen to stall for good after a job's first lines while the job ran on and ended (simulator),
    which left `rayslice run` waiting for ever."""
    printed: list[str] = []

    async def stream() -> None:
        async for lines in client.tail_job_logs(job_id):
            print(lines, end="", flush=True)
            seen(lines)
            printed.append(lines)

    streaming = asyncio.ensure_future(stream())
    while not streaming.done():
        await asyncio.wait({streaming}, timeout=STATUS_POLL_S)
        if streaming.done() or not (await asyncio.to_thread(client.get_job_status, job_id)).is_terminal():
            continue
        if not streaming.done():  # it may have ended while the status was read
            streaming.cancel()
            try:
                logs = await asyncio.to_thread(client.get_job_logs, job_id)
            except _LOG_READ_ERRORS as exc:  # the job's outcome still counts
                print(
                    f"rayslice: the rest of the job's log could not be read: {exc}",
                    file=sys.stderr,
                    flush=True,
                )
            else:
                seen(_print_rest(logs, "".join(printed)))
        break
    if streaming.done() and not streaming.cancelled():
        streaming.result()  # the stream's own error, as before


def _print_rest(logs: str, printed: str) -> str:
    """Print the part of the job's stored log after what the stream printed (the whole log,
    marked, when the two do not line up); returns the job's lines it printed."""
    if logs.startswith(printed):
        print(logs[len(printed) :], end="", flush=True)
        return logs[len(printed) :]
    print(
        f"rayslice: the log stream and the job's stored log differ; the stored log:\n{logs}",
        end="",
        flush=True,
    )
    return ""


def _job_logs(client: JobSubmissionClient, job_id: str) -> str:
    try:
        return str(client.get_job_logs(job_id))[-LOG_TAIL_CHARS:]
    except _LOG_READ_ERRORS:
        return ""
