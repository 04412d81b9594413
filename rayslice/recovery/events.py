"""Recovery events: what the controller saw, what it did, and how that ended; recorded once each.

Each event goes to every sink exactly once, when it happens:

- stdout, one JSON object per line: the controller runs under systemd on its own VM, so the
  journal keeps it;
- optionally a JSON-lines file (the controller VM's log);
- the controller VM's guest attributes, namespace ``rayslice``, one key per event
  (``recovery-<ms since epoch>-<seq>``), written through the metadata server with PUT.

Why guest attributes: `rayslice status` runs on the user's machine with the user's credentials and
nothing reaches the controller VM, so it can read neither a file nor a port there. Guest
attributes are readable through the Compute Engine API (``instances.getGuestAttributes``) with
ordinary credentials, they survive a reboot of the VM, the hosts already publish their boot
state the same way, and the simulator's metadata server implements them, so cloud and simulator
share the path. Reading Cloud Logging instead would need the Logging API and a log-viewer role.
The sink keeps the newest `KEEP` events (older keys are deleted) to stay far below the guest
attribute limits.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import os
import sys
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, TextIO

from rayslice.names import GUEST_ATTRIBUTE_NAMESPACE

EVENT_KEY_PREFIX = "recovery-"
KEEP = 50
OUTCOME_MAX_CHARS = 500
METADATA_HOST_ENV = "GCE_METADATA_HOST"  # google-auth's own variable, honoured the same way
METADATA_DEFAULT_HOST = "metadata.google.internal"


@dataclasses.dataclass(frozen=True)
class Event:
    """One thing the controller saw and did: `seen` (the slice's state), `action`, `outcome`."""

    time: str
    slice: str
    seen: str
    action: str
    outcome: str
    attempt: int = 0

    @classmethod
    def now(cls, slice_name: str, seen: str, action: str, outcome: str, attempt: int = 0) -> Event:
        # Not datetime.UTC: the controller runs on its VM's Python, which is 3.10 on Ubuntu
        # 22.04 (rayslice.recovery.bundle).
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")  # noqa: UP017
        return cls(stamp, slice_name, seen, action, outcome[:OUTCOME_MAX_CHARS], attempt)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Event | None:
        """The event in `text`, or None if it is not one (a foreign or damaged value)."""
        try:
            data = json.loads(text)
            return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})
        except (ValueError, TypeError, KeyError):
            return None


class Sink(Protocol):
    def record(self, event: Event) -> None: ...


class StreamSink:
    """JSON lines on a stream (stdout by default)."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream

    def record(self, event: Event) -> None:
        stream = self.stream or sys.stdout
        stream.write(event.to_json() + "\n")
        stream.flush()


class FileSink:
    """JSON lines appended to a file, created private (0600)."""

    def __init__(self, path: Path):
        self.path = path

    def record(self, event: Event) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as handle:
            handle.write(event.to_json() + "\n")


class GuestAttributeSink:
    """Events as guest attributes of this VM, through its metadata server."""

    def __init__(self, host: str | None = None, keep: int = KEEP):
        self.host = host or os.environ.get(METADATA_HOST_ENV) or METADATA_DEFAULT_HOST
        self.keep = keep
        self.keys: list[str] = []
        self._seq = itertools.count()

    def _url(self, key: str) -> str:
        return (
            f"http://{self.host}/computeMetadata/v1/instance/guest-attributes/"
            f"{GUEST_ATTRIBUTE_NAMESPACE}/{key}"
        )

    def _send(self, method: str, key: str, body: bytes | None = None) -> None:
        request = urllib.request.Request(
            self._url(key), data=body, method=method, headers={"Metadata-Flavor": "Google"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def record(self, event: Event) -> None:
        millis = int(datetime.datetime.fromisoformat(event.time).timestamp() * 1000)
        key = f"{EVENT_KEY_PREFIX}{millis}-{next(self._seq)}"
        self._send("PUT", key, event.to_json().encode())
        self.keys.append(key)
        while len(self.keys) > self.keep:
            self._send("DELETE", self.keys.pop(0))


class Recorder:
    """Sends each event to every sink once; a sink that fails is reported on stderr, not retried
    (a retry could record the event twice), and does not stop the others."""

    def __init__(self, sinks: Iterable[Sink]):
        self.sinks = list(sinks)
        self.events: list[Event] = []

    def record(self, event: Event) -> None:
        self.events.append(event)
        for sink in self.sinks:
            try:
                sink.record(event)
            except OSError as exc:
                print(
                    f"rayslice-recovery: could not record event in {type(sink).__name__}: {exc}",
                    file=sys.stderr,
                )


def events_from_guest_attributes(entries: Iterable[dict[str, Any]]) -> list[Event]:
    """The recovery events among guest attribute entries, oldest first."""
    found = []
    for entry in entries:
        key = str(entry.get("key", ""))
        if entry.get("namespace") == GUEST_ATTRIBUTE_NAMESPACE and key.startswith(EVENT_KEY_PREFIX):
            event = Event.from_json(str(entry.get("value", "")))
            if event is not None:
                found.append((_order(key), event))
    return [event for _, event in sorted(found, key=lambda pair: pair[0])]


def _order(key: str) -> tuple[int, int]:
    parts = key[len(EVENT_KEY_PREFIX) :].split("-")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)
