"""Submitting a bundled workload or a user's script as a Ray job and following it to its end (the
work behind `rayslice run`).

The job goes through the Ray Jobs API (the head's dashboard port), so the client needs no Ray
node of its own, and the cluster's hosts need Ray and JAX/torch_xla but not rayslice: the job
carries what it imports (`rayslice.jobs.upload`).
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rayslice.errors import JobFailed
from rayslice.jobs import connection, preflight, restarts, upload, working_dir

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
) -> str:
    """Submit, stream the logs until the job ends, and return its final status.

    A bundled job the cluster cannot run is refused first (`preflight`). With `max_restarts`, a
    job that failed because a node died (`restarts.node_death_reason`) is submitted again, up to
    that many times, once every slice the cluster had at the start is whole again. Raises
    `JobFailed` (exit 1) when the job ends in any other state than SUCCEEDED for good.
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
    while True:
        with tempfile.TemporaryDirectory(prefix="rayslice-job-") as staging:
            job_id = client.submit_job(entrypoint=command, runtime_env=upload.runtime_env(job, Path(staging)))
        print(f"rayslice: submitted {job_id} to {target.url}: {command}", file=sys.stderr, flush=True)
        try:
            return follow(client, job_id)
        except JobFailed as failure:
            if baseline is None or restarted >= max_restarts:
                raise
            text = f"{failure}\n{_job_logs(client, job_id)}"
            reason = restarts.node_death_reason(text)
            if reason is None:
                raise  # the job failed on its own: restarting would fail the same way
            restarted += 1
            print(
                f"rayslice: {failure}\nrayslice: a node died; waiting for every slice to be whole again",
                file=sys.stderr,
                flush=True,
            )
            restarts.wait_until_whole(target, baseline, rejoin_timeout_s, dead=restarts.dead_node_ids(text))
            print(f"restart {restarted} of {max_restarts} after {reason}", flush=True)


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


def follow(client: JobSubmissionClient, job_id: str) -> str:
    """Stream a job's logs; return "SUCCEEDED" or raise `JobFailed` with Ray's message."""
    from ray.job_submission import JobStatus

    asyncio.run(_stream(client, job_id))
    status = client.get_job_status(job_id)
    while not status.is_terminal():  # the log stream can close a moment before the status settles
        time.sleep(0.2)
        status = client.get_job_status(job_id)
    if status != JobStatus.SUCCEEDED:
        info = client.get_job_info(job_id)
        raise JobFailed(f"job {job_id} {status.value}: {info.message or ''}".rstrip())
    return str(status.value)


async def _stream(client: JobSubmissionClient, job_id: str) -> None:
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
                _print_rest(logs, "".join(printed))
        break
    if streaming.done() and not streaming.cancelled():
        streaming.result()  # the stream's own error, as before


def _print_rest(logs: str, printed: str) -> None:
    """The part of the job's stored log after what the stream printed (the whole log, marked,
    when the two do not line up)."""
    if logs.startswith(printed):
        print(logs[len(printed) :], end="", flush=True)
    else:
        print(
            f"rayslice: the log stream and the job's stored log differ; the stored log:\n{logs}",
            end="",
            flush=True,
        )


def _job_logs(client: JobSubmissionClient, job_id: str) -> str:
    try:
        return str(client.get_job_logs(job_id))[-LOG_TAIL_CHARS:]
    except _LOG_READ_ERRORS:
        return ""
