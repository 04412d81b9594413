"""A machine's logs into the cluster's record as they grow: the record shipper.

Every host, the head VM and the recovery controller's VM run this beside their other services,
under their boot script's supervisor (``boot.sh ship-record``, ``controller.sh ship-record``), so
that what happened on a cluster is in its record while it happens, and stays there when the
cluster is gone (a preempted Spot host, a `pulumi destroy`, a `rayslice local down`). What it
ships (`sources`), as streams of the record (`rayslice.observability.record`):

- the machine's boot log (``hosts/<host>/boot.log``), where the boot script and its services log;
- Ray's job-driver logs and Ray events of every Ray session on the machine
  (``hosts/<host>/ray/<session>/...``; the drivers run on the head);
- on the controller's VM, the controller's decisions: its event log (``events/<host>``).

Every ``--interval-s`` seconds it reads what each file gained since the last pass, up to its
last whole line (a line is never cut, so a secret never straddles two pieces), and writes it as
one new object (`record.ClusterRecord.write_piece`), named by the byte range it holds of the
stream as recorded (redacted) and by a random part drawn at each start, which no job can guess
and take first. It reads only regular files, never through a link and never blocking on a FIFO
(a job can make either where Ray keeps its logs). After each write it notes how far it read the
file and how long the stream is in its state file, so a restart goes on where it stopped. Every
text passes `redaction.redact` (through `record.ClusterRecord`), with the secrets it knows by
value: the files named by ``--secret-file`` (the cluster's Ray token), read again at each pass. A
private key printed to a log is shipped only once its END line has come (or 64 KiB after its
BEGIN, or at the last pass), so that it is redacted whole rather than in two halves.

The record's location comes from the boot script: on the cloud the gs:// prefix infra writes in
the machine's metadata (its account may only create objects there: nothing it writes can be read,
replaced or deleted by it), on the simulator the cluster's record folder, which the simulated
machines see at a path of their own. A write that fails is tried again at the next pass; the
shipper never stops the machine's work.

This module and what it imports run on the machines, which do not install rayslice: the boot
script carries them as a zipapp (`rayslice.startup_scripts.variables.RECORD_SHIPPER_MODULES`) run
with the venv's Python (google-auth and requests, for gs://, are in every host's and the
controller's lock). They must run on the controller VM's Python 3.10.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import stat
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rayslice.errors import RaysliceError
from rayslice.observability import record, redaction

# The most one object holds; a longer run without a newline is shipped cut at this size.
MAX_PIECE_BYTES = 4 * 1024 * 1024
# Ray's logs under its temp dir (the boot script's RAY_TEMP_DIR): one session_<date> folder per
# Ray start (``session_latest`` is a link to the newest; only the real folders are read).
RAY_SESSIONS = "session_2*"
RAY_LOG_GLOBS = ("logs/job-driver-*.log", "logs/events/*.log")
RAY_LOGS = "logs"


@dataclass(frozen=True)
class Sources:
    """What one machine ships: files by the stream key they go to."""

    host: str
    boot_log: Path
    ray_temp_dir: Path | None = None
    events_file: Path | None = None

    def files(self) -> Iterator[tuple[str, Path]]:
        """(stream key, file) for every file there is to ship now."""
        host = record.check_key(self.host)
        yield record.join(record.HOSTS_DIR, host, record.BOOT_LOG), self.boot_log
        if self.events_file is not None:
            yield record.join(record.EVENTS_DIR, host), self.events_file
        if self.ray_temp_dir is not None:
            for session in sorted(self.ray_temp_dir.glob(RAY_SESSIONS)):
                if session.is_symlink() or not session.is_dir():
                    continue
                for pattern in RAY_LOG_GLOBS:
                    for path in sorted(session.glob(pattern)):
                        relative = path.relative_to(session / RAY_LOGS).as_posix()
                        stream = record.join(record.HOSTS_DIR, host, record.RAY_DIR, session.name, relative)
                        if not path.is_symlink() and record.is_key(stream):
                            yield stream, path


def piece(path: Path, offset: int) -> tuple[bytes, int]:
    """What `path` holds past `offset`, up to its last whole line (at most `MAX_PIECE_BYTES`;
    cut there when a line is longer), and the offset after it; nothing new: ``b""``. Only a
    regular file is read, opened without following a link and without blocking: a job can put a
    FIFO or a link where Ray keeps its logs, and neither may stop (or steer) the shipper."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # gone, or a link (ELOOP): nothing to ship
        return b"", offset
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b"", offset
        file.seek(offset)
        data = file.read(MAX_PIECE_BYTES)
    if len(data) < MAX_PIECE_BYTES:
        data = data[: data.rfind(b"\n") + 1]
    return data, offset + len(data)


def size(path: Path) -> int | None:
    """The size of the regular file `path` (not followed if it is a link); None for anything else."""
    try:
        info = path.lstat()
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


@dataclass
class Shipper:
    """Ships `sources` into `cluster` (a `record.ClusterRecord`), keeping offsets in `state_file`."""

    cluster: record.ClusterRecord
    sources: Sources
    state_file: Path
    secret_files: Sequence[Path] = ()
    # Per stream: how far its file was read, and how long the stream is in the record (the
    # pieces hold redacted text, so the two differ; a piece is named by the stream's bytes).
    offsets: dict[str, tuple[int, int]] = field(default_factory=dict)
    # A random part of every piece's name, new at each start: nothing else on the cluster can
    # create a piece's object before this shipper does (and so keep it from being shipped).
    boot: str = field(default_factory=lambda: secrets.token_hex(4))
    _failing: str = ""

    def __post_init__(self) -> None:
        try:
            saved = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            saved = {}
        if isinstance(saved, dict):
            for stream, value in saved.items():
                if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
                    self.offsets[str(stream)] = (value[0], value[1])

    def _known_secrets(self) -> tuple[str, ...]:
        found = []
        for path in self.secret_files:
            try:
                found.append(path.read_text().strip())
            except OSError:
                continue
        return tuple(s for s in found if s)

    def ship_once(self, final: bool = False) -> int:
        """One pass over every file; returns how many pieces it wrote. A failed write leaves its
        file's offset where it was, for the next pass. A private key whose END has not come is
        left for a later pass (`redaction.shippable`), unless this is the `final` one."""
        self.cluster.known_secrets = self._known_secrets()
        written = 0
        for stream, path in self.sources.files():
            offset, stored = self.offsets.get(stream, (0, 0))
            length = size(path)
            if length is None:
                continue
            if length < offset:  # a file written anew: its start goes on at the stream's end
                offset = 0
            while True:
                data, end = piece(path, offset)
                data = data[: redaction.shippable(data, final=final)]
                end = offset + len(data)
                if not data:
                    break
                try:
                    stored = self.cluster.write_piece(
                        stream, stored, data.decode(errors="replace"), self.boot
                    )
                except OSError as exc:
                    self._say(f"record shipper: {stream} waits for the next pass: {exc}")
                    break
                offset = end
                self.offsets[stream] = (offset, stored)
                self._save()
                written += 1
        return written

    def _save(self) -> None:
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        tmp.write_text(json.dumps(self.offsets, sort_keys=True))
        os.replace(tmp, self.state_file)

    def _say(self, message: str) -> None:
        """Tell the machine's supervisor log, once per distinct message."""
        if message != self._failing:
            print(message, file=sys.stderr, flush=True)
            self._failing = message


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--record", required=True, help="the cluster's record: a folder or gs://BUCKET/PREFIX"
    )
    parser.add_argument("--host", required=True, help="this machine's name (its instance name)")
    parser.add_argument("--state-file", required=True, type=Path, help="where the offsets are kept")
    parser.add_argument("--boot-log", required=True, type=Path)
    parser.add_argument("--ray-temp-dir", type=Path, help="Ray's temp dir (hosts and the head)")
    parser.add_argument("--events-file", type=Path, help="the recovery controller's event log")
    parser.add_argument("--secret-file", type=Path, action="append", default=[])
    parser.add_argument("--interval-s", type=float, required=True, help="seconds between passes")
    args = parser.parse_args(argv)
    try:
        bucket, prefix = record.open_location(args.record)
    except (RaysliceError, OSError) as exc:  # a bad location, no credentials: the supervisor retries
        print(f"record shipper: cannot open {args.record}: {exc}", file=sys.stderr, flush=True)
        return 1
    shipper = Shipper(
        record.ClusterRecord(bucket, prefix),
        Sources(args.host, args.boot_log, args.ray_temp_dir, args.events_file),
        args.state_file,
        args.secret_file,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        shipper.ship_once()
        stop.wait(args.interval_s)
    shipper.ship_once(final=True)  # the last lines before the machine stops
    return 0


if __name__ == "__main__":
    sys.exit(main())
