"""The record that outlives a cluster: its events, boot logs, jobs and their logs, in a bucket.

A cluster's record lives under one prefix, ``clusters/<cluster name>/<run id>/`` of the record
root (a GCS bucket on the cloud; on the simulator a folder beside its state dir, which `rayslice
local down` keeps: `rayslice.local.simulation.recording`):

- ``cluster.json``: the cluster's name, run id, accelerator type, when it started, and its stack
  config; ``ended.json``: when it was taken down;
- ``events/<host>``: the recovery controller's events (`rayslice.recovery.events.Event`),
  one JSON object a line, shipped by the controller VM as it writes them;
- ``hosts/<host>/boot.log``: each host's boot log, shipped by the host as it grows;
  ``hosts/<host>/console.log``: what the simulator's console (a VM's serial port) held at `down`;
- ``hosts/<host>/ray/<session>/<file>``: Ray's own job-driver logs (on the head) and Ray events
  (``events/event_*.log``) of each Ray session on that host, shipped as they grow;
- ``ray/jobs.json``: the head's list of jobs at `rayslice local down`;
- ``jobs/<job id>/submitted.json``: a Ray job's entrypoint, submission time and ``restart_of``
  (the first job of its `rayslice run`, for a job submitted again); ``ended.json``: its final
  status and when; ``mark-<name>.json``: a moment `rayslice run` saw (a node's death, the
  cluster whole again);
- ``jobs/<job id>/log-<n>.jsonl``: its log as `rayslice run` streamed it, ``{"t": unix s,
  "line": text}`` a line, one object per flush (a bucket has no append, so each flush is a new
  object, written as the job runs);
- ``jobs/<job id>/goodput.json``: the run's goodput report (`rayslice.observability.goodput`).

A log a machine ships as it grows (`rayslice.observability.shipper`) is a *stream*: a key under
which each shipped piece is one object named by the byte range of the stream it holds and the
shipper's random part, ``<stream>/<start>-<end>-<random>`` (12 digits each, `chunk_key`), always
whole lines; `streams` puts a stream back together. A piece counts only if it holds exactly
``end - start`` bytes and starts where the pieces before it end; a piece shipped twice (a
shipper stopped between writing a piece and noting it) starts where the first did and is read
once.

Who may write what (the record bucket's IAM conditions, `rayslice.infra.identity`; on the
simulator, what each machine has bound in): the hosts (every Ray job on them) only under
``hosts/``, the controller's VM only under ``events/`` and its own ``hosts/<host>/``; ``jobs/``
and ``cluster.json`` only `rayslice run` and `rayslice local` with their user's own credentials.
So a job can add objects to any host's logs of its cluster (the hosts share one account), never
to the controller's events, a job's record or ``cluster.json``. Readers take every object as a
job may have written it (`rayslice.observability.untrusted`): a cluster record is ordered by
when its ``cluster.json`` was created, never by what it says; a job's record must name the job
its key names; a name that is no record key is not listed.

Every object is written whole and exactly once: a bucket has no append, and one with a retention
policy refuses to overwrite an object younger than its period, so nothing here ever rewrites one
(`FolderBucket` refuses as such a bucket would).

Every text passes `rayslice.observability.redaction.redact` first, which filters secrets in
the forms it knows (and any secret the writer knows by value, the cluster's Ray token); a secret
in a form it does not know goes in as written.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rayslice.errors import InvalidInput
from rayslice.observability import nofollow, untrusted
from rayslice.observability.redaction import redact

CLUSTERS_PREFIX = "clusters"
CLUSTER_INFO = "cluster.json"
EVENTS_DIR = "events"
HOSTS_DIR = "hosts"
RAY_DIR = "ray"
JOBS_DIR = "jobs"
JOB_SUBMITTED = "submitted.json"
JOB_ENDED = "ended.json"
JOB_LOG_PREFIX = "log-"
MARK_PREFIX = "mark-"
MARK_NODE_DIED = "node_died"
MARK_WHOLE_AGAIN = "whole_again"
CLUSTER_ENDED = "ended.json"
GOODPUT = "goodput.json"
BOOT_LOG = "boot.log"
CONSOLE_LOG = "console.log"
# A piece of a stream: the byte range of the shipped file it holds (`chunk_key`).
CHUNK_DIGITS = 12
CHUNK_NAME = re.compile(rf"(\d{{{CHUNK_DIGITS}}})-(\d{{{CHUNK_DIGITS}}})(?:-[0-9a-f]{{8,32}})?")
# Where `rayslice run` writes a job's record when its cluster is not the simulator's: a cluster
# record's location, a folder or gs://BUCKET/clusters/NAME/RUN.
RECORD_ENV = "RAYSLICE_RECORD"
# A key part: what a GCE instance name, a Ray job id or a run id may hold; never "/" or "..".
KEY_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
# The most a reader takes of one object (a shipped piece holds at most 4 MiB; a console log copied
# at `down` more) and the most objects it lists under one prefix: a record is not a disk's worth.
MAX_OBJECT_BYTES = 64 * 1024 * 1024
MAX_KEYS = 200_000


class Bucket(Protocol):
    """Objects by key under a prefix: written whole, listed, read."""

    def write(self, key: str, data: bytes) -> None: ...

    def read(self, key: str) -> bytes: ...

    def list(self, prefix: str = "") -> list[str]: ...

    def created(self, key: str) -> float:
        """When the object was created, as the bucket keeps it (unix seconds)."""
        ...


def join(*parts: str) -> str:
    """A key from a prefix (possibly empty) and names."""
    return "/".join(p for p in parts if p)


def is_key(key: str) -> bool:
    """Whether every part of `key` is a plain name (no "..", no empty part, no absolute path)."""
    return all(KEY_PART.fullmatch(p) for p in key.split("/"))


def check_key(key: str) -> str:
    """`key` if it is a record key (`is_key`)."""
    if not is_key(key):
        raise InvalidInput(f"{key[:120]!r} is not a record key")
    return key


@dataclass(frozen=True)
class FolderBucket:
    """A folder that plays the bucket: objects are files (0600) under `root`, each written
    atomically and once (`FileExistsError` for a key that exists, as a retention policy refuses).

    On the simulator the machines write into the folder too, so every key is walked without
    following a link (`rayslice.observability.nofollow`): only regular files are read (at most
    `MAX_OBJECT_BYTES`) or listed (at most `MAX_KEYS`), and nothing is written outside `root`."""

    root: Path

    def write(self, key: str, data: bytes) -> None:
        parts = check_key(key).split("/")
        nofollow.write_once(self.root, parts, data, f".{parts[-1]}.{secrets.token_hex(4)}.tmp")

    def read(self, key: str) -> bytes:
        return nofollow.read_regular(self.root, check_key(key).split("/"), MAX_OBJECT_BYTES)

    def list(self, prefix: str = "") -> list[str]:
        """Every object under `prefix`; a file whose name is no record key (a machine can make
        one in its folder) is not an object the bucket could hold, and is left out."""
        parts = check_key(prefix.strip("/")).split("/") if prefix.strip("/") else []
        return [key for key in nofollow.regular_files(self.root, parts, MAX_KEYS) if is_key(key)]

    def created(self, key: str) -> float:
        return nofollow.modified(self.root, check_key(key).split("/"))

    def folder(self, key: str) -> Path:
        """The folder `key` names, made (0700 each level) without following a link: where a
        simulated machine's own part of the record is bound into it."""
        with nofollow.folder(self.root, check_key(key).split("/"), create=True):
            pass
        return self.root / key


def open_location(location: str) -> tuple[Bucket, str]:
    """The bucket and key prefix of a record location: a folder, or gs://BUCKET/PREFIX."""
    if location.startswith("gs://"):
        from rayslice.observability.gcs import GcsBucket  # needs google-auth, not every reader does

        name, _, prefix = location[len("gs://") :].partition("/")
        return GcsBucket.default(name), prefix.strip("/")
    if "://" in location:
        raise InvalidInput(f"{location!r}: a record location is a folder or gs://BUCKET/PREFIX")
    return FolderBucket(Path(location)), ""


def cluster_prefix(cluster: str, run_id: str) -> str:
    return check_key(f"{CLUSTERS_PREFIX}/{cluster}/{run_id}")


@dataclass
class ClusterRecord:
    """One cluster's record: writes its objects under `prefix`, every text redacted first."""

    bucket: Bucket
    prefix: str
    known_secrets: tuple[str, ...] = ()

    def key(self, *parts: str) -> str:
        return check_key(join(self.prefix, *parts))

    def write_text(self, key: str, text: str) -> None:
        self.bucket.write(self.key(key), redact(text, self.known_secrets).encode())

    def write_json(self, key: str, value: Mapping[str, Any]) -> None:
        self.write_text(key, json.dumps(value, indent=1, sort_keys=True) + "\n")

    def write_piece(self, stream: str, start: int, text: str, boot: str) -> int:
        """`text`, redacted, as the piece of `stream` that starts at byte `start` of the stream
        (`chunk_key`, named by its own bytes: a reader checks them); returns where it ends."""
        data = redact(text, self.known_secrets).encode()
        end = start + len(data)
        with contextlib.suppress(FileExistsError):  # shipped before its shipper noted it: read once
            self.bucket.write(self.key(chunk_key(stream, start, end, boot)), data)
        return end


class Journal(Protocol):
    """What `rayslice run` tells the record about a job as it follows it."""

    def lines(self, text: str) -> None: ...

    def flush(self) -> None: ...

    def mark(self, name: str) -> None: ...

    def end(self, status: str) -> None: ...


class NullJournal:
    """A job that is not recorded (no record location)."""

    def lines(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass

    def mark(self, name: str) -> None:
        pass

    def end(self, status: str) -> None:
        pass


NO_JOURNAL = NullJournal()


@dataclass
class JobJournal:
    """One Ray job's record as `rayslice run` follows it, in objects each written once: its
    submission, its log in timed chunks, the moments `rayslice run` saw, and its end.

    Recording never fails the job: the first write that fails is reported once on stderr, and
    the journal writes nothing more."""

    record: ClusterRecord
    job_id: str
    restart_of: str | None
    entrypoint: str
    submitted: float
    flush_s: float = 5.0
    broken: bool = False
    _pending: list[tuple[float, str]] = field(default_factory=list)
    _chunks: int = 0
    _last_flush: float = 0.0

    def __post_init__(self) -> None:
        self._last_flush = self.submitted
        submitted = {
            "job_id": self.job_id,
            "entrypoint": self.entrypoint,
            "submitted": self.submitted,
            "restart_of": self.restart_of,
        }
        self._put(JOB_SUBMITTED, json.dumps(submitted))

    def _put(self, name: str, text: str) -> None:
        if self.broken:
            return
        try:
            self.record.write_text(f"{JOBS_DIR}/{self.job_id}/{name}", text)
        except OSError as exc:
            self.broken = True
            print(f"rayslice: not recording job {self.job_id} any more: {exc}", file=sys.stderr, flush=True)

    def lines(self, text: str, now: float | None = None) -> None:
        """Lines as they arrived (a chunk of the stream may hold several); flushed every `flush_s`."""
        at = time.time() if now is None else now
        self._pending += [(at, line) for line in text.splitlines()]
        if at - self._last_flush >= self.flush_s:
            self.flush(at)

    def flush(self, now: float | None = None) -> None:
        if self._pending:
            self._chunks += 1
            body = "".join(json.dumps({"t": t, "line": line}) + "\n" for t, line in self._pending)
            self._put(f"{JOB_LOG_PREFIX}{self._chunks:06d}.jsonl", body)
            self._pending.clear()
        self._last_flush = time.time() if now is None else now

    def mark(self, name: str, now: float | None = None) -> None:
        """A moment `rayslice run` saw: `MARK_NODE_DIED`, `MARK_WHOLE_AGAIN`."""
        self._put(
            f"{MARK_PREFIX}{check_key(name)}.json", json.dumps({name: time.time() if now is None else now})
        )

    def end(self, status: str, now: float | None = None) -> None:
        self.flush(now)
        self._put(JOB_ENDED, json.dumps({"status": status, "ended": time.time() if now is None else now}))


def open_journal(
    location: str | None, job_id: str, restart_of: str | None, entrypoint: str, now: float | None = None
) -> Journal:
    """The journal of a job submitted to a cluster whose record is at `location` (a cluster
    record's folder or gs://BUCKET/PREFIX); `NO_JOURNAL` without one, or when it cannot be opened
    (said once on stderr: recording never fails the job)."""
    if not location:
        return NO_JOURNAL
    try:
        bucket, prefix = open_location(location)
        submitted = time.time() if now is None else now
        journal = JobJournal(
            ClusterRecord(bucket, prefix), check_key(job_id), restart_of, entrypoint, submitted
        )
    except (OSError, InvalidInput) as exc:
        print(f"rayslice: not recording job {job_id} in {location}: {exc}", file=sys.stderr, flush=True)
        return NO_JOURNAL
    return journal


# ---- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRecord:
    info: dict[str, Any]
    lines: tuple[tuple[float | None, str], ...]

    @property
    def job_id(self) -> str:
        return str(self.info.get("job_id", ""))


def clusters(bucket: Bucket, root_prefix: str = "") -> list[str]:
    """Every cluster record's prefix under `root_prefix`, oldest first: by when its
    ``cluster.json`` was created (the bucket's own time), never by what the record says of itself.
    A `root_prefix` that is one cluster record's own (the stack output ``record``, or the
    simulator's cluster folder) names that record alone."""
    try:
        bucket.created(join(root_prefix, CLUSTER_INFO))
        return [root_prefix]
    except (OSError, InvalidInput):
        pass
    base = join(root_prefix, CLUSTERS_PREFIX)
    depth = len(base.split("/")) + 3  # clusters/<name>/<run id>/cluster.json
    found = [
        k.rsplit("/", 1)[0]
        for k in bucket.list(base)
        if k.endswith("/" + CLUSTER_INFO) and len(k.split("/")) == depth
    ]
    return sorted(found, key=lambda prefix: (_created(bucket, join(prefix, CLUSTER_INFO)), prefix))


def _created(bucket: Bucket, key: str) -> float:
    try:
        return bucket.created(key)
    except OSError:
        return 0.0


def cluster_info(bucket: Bucket, prefix: str) -> dict[str, Any]:
    """The cluster's ``cluster.json``, with ``ended`` once it was taken down; times that are not
    times (`untrusted.when`) read as None, texts that are not texts as ""."""
    info = read_json(bucket, join(prefix, CLUSTER_INFO))
    if _created(bucket, join(prefix, CLUSTER_ENDED)):  # one call, not a listing of the record
        info["ended"] = read_json(bucket, join(prefix, CLUSTER_ENDED)).get("ended")
    for name in ("started", "ended"):
        info[name] = untrusted.when(info.get(name))
    for name in ("cluster", "run_id", "accelerator_type", "summary"):
        info[name] = untrusted.text(info.get(name))
    return info


def chunk_key(stream: str, start: int, end: int, boot: str = "") -> str:
    """The key of the piece of `stream` that holds bytes `start` to `end` of the file shipped;
    `boot`, the shipper's random part, makes it a name no one else can take first."""
    name = f"{start:0{CHUNK_DIGITS}d}-{end:0{CHUNK_DIGITS}d}"
    return join(stream, f"{name}-{boot}" if boot else name)


def streams(bucket: Bucket, prefix: str) -> dict[str, str]:
    """Every stream under `prefix`, put back together, by key; an object that is not a piece of
    one (a whole log copied at `down`, or written by an older rayslice) stands for itself.

    A piece counts only if it holds exactly the bytes its name claims (``end - start``), and only
    where it tiles the stream: in order of where they start, a piece that starts before the end of
    what is already put together is a piece shipped again (or a forged one) and is left out."""
    pieces: dict[str, list[tuple[int, int, str]]] = {}
    found: dict[str, str] = {}
    for key in bucket.list(prefix):
        stream, _, name = key.rpartition("/")
        match = CHUNK_NAME.fullmatch(name)
        if match:
            pieces.setdefault(stream, []).append((int(match[1]), int(match[2]), key))
        elif (data := _read(bucket, key)) is not None:
            found[key] = data.decode(errors="replace")
    for stream, parts in pieces.items():
        covered, texts = 0, []
        # A piece shipped again starts where the first did and reaches further: the longest first.
        for start, end, key in sorted(parts, key=lambda p: (p[0], -p[1], p[2])):
            if start < covered or end <= start:
                continue
            data = _read(bucket, key)
            if data is None or len(data) != end - start:
                if data is not None:
                    untrusted.skip(key, f"holds {len(data)} bytes, not the {end - start} its name claims")
                continue
            texts.append(data.decode(errors="replace"))
            covered = end
        found[stream] = "".join(texts)
    return dict(sorted(found.items()))


def untimed_log(text: str) -> str:
    """A log whose lines' times are unknown (Ray's stored job log), as a log object's body."""
    return "".join(json.dumps({"t": None, "line": line}) + "\n" for line in text.splitlines())


def _read(bucket: Bucket, key: str) -> bytes | None:
    """The object `key`, or None (named on stderr) when it cannot be read: a link or a FIFO a
    machine planted, one too big, one gone."""
    try:
        return bucket.read(key)
    except OSError as exc:
        untrusted.skip(key, exc.strerror or str(exc))
        return None


def read_json(bucket: Bucket, key: str) -> dict[str, Any]:
    """The JSON object `key` holds; ``{}`` (named on stderr) when it holds none."""
    data = _read(bucket, key)
    found = None if data is None else untrusted.json_object(data, key)
    return {} if found is None else found


def jobs(bucket: Bucket, prefix: str) -> list[JobRecord]:
    """The cluster's jobs, oldest first: each job's objects merged into one info dict (its
    submission, its end once it ended, and ``marks``). A job whose ``submitted.json`` names
    another job than its key is left out (named on stderr)."""
    base = join(prefix, JOBS_DIR)
    by_job: dict[str, list[str]] = {}
    for key in bucket.list(base):
        job_id, _, name = key.removeprefix(base + "/").partition("/")
        if name and "/" not in name:
            by_job.setdefault(job_id, []).append(name)
    found = []
    for job_id, names in by_job.items():
        if JOB_SUBMITTED not in names:
            continue
        job_dir = join(base, job_id)
        submitted = read_json(bucket, join(job_dir, JOB_SUBMITTED))
        if submitted.get("job_id") != job_id:
            untrusted.skip(
                join(job_dir, JOB_SUBMITTED), f"names job {untrusted.text(submitted.get('job_id'))!r}"
            )
            continue
        ended = read_json(bucket, join(job_dir, JOB_ENDED)) if JOB_ENDED in names else {}
        marks: dict[str, float] = {}
        for name in sorted(n for n in names if n.startswith(MARK_PREFIX)):
            for mark, stamp in read_json(bucket, join(job_dir, name)).items():
                if (at := untrusted.when(stamp)) is not None:
                    marks[str(mark)] = at
        restart_of = submitted.get("restart_of")
        info = {
            "job_id": job_id,
            "entrypoint": untrusted.text(submitted.get("entrypoint")),
            "submitted": untrusted.when(submitted.get("submitted")),
            "restart_of": restart_of
            if isinstance(restart_of, str) and KEY_PART.fullmatch(restart_of)
            else None,
            "status": untrusted.text(ended.get("status"), "UNKNOWN") if ended else "RUNNING",
            "ended": untrusted.when(ended.get("ended")),
            "marks": marks,
        }
        logs = sorted(n for n in names if n.startswith(JOB_LOG_PREFIX))
        found.append(JobRecord(info, tuple(_job_lines(bucket, [join(job_dir, n) for n in logs]))))
    return sorted(found, key=lambda j: (j.info["submitted"] or 0.0, j.job_id))


def _job_lines(bucket: Bucket, keys: list[str]) -> Iterator[tuple[float | None, str]]:
    for key in keys:
        data = _read(bucket, key)
        for entry in untrusted.json_lines(b"" if data is None else data, key):
            # No time: a line copied from Ray's stored log, time unknown.
            yield untrusted.when(entry.get("t")), untrusted.text(entry.get("line"))


def events(bucket: Bucket, prefix: str) -> list[dict[str, Any]]:
    """The controller's events in the record, oldest first; a line that is not an event's is
    skipped (named on stderr)."""
    found = []
    for stream, text in streams(bucket, join(prefix, EVENTS_DIR)).items():
        for entry in untrusted.json_lines(text.encode(), stream):
            if isinstance(entry.get("time"), str):
                found.append({k: v if isinstance(v, str) else untrusted.text(v) for k, v in entry.items()})
    return sorted(found, key=lambda e: str(e["time"]))
