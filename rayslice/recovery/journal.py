"""What a restarted recovery controller needs to finish what its predecessor began.

The controller recreates a slice from the spec it last saw the slice with (its MIG's fields and
per-instance configs, or its node or queued request), in several calls: delete what is left,
insert the MIG, create its hosts. Kept in memory only, a controller killed between two of those
calls (its VM rebooted, the service restarted, the process killed for memory) leaves a slice
that its successor cannot rebuild: after a delete that completed the slice is gone and its spec
with it ("no recorded spec"), and after a MIG inserted with target size 0 the successor sees an
empty MIG that wants no host, which is not broken.

So the controller keeps, per slice, one small JSON file in its state directory (``--state-dir``;
on the controller VM ``/var/lib/rayslice/recovery``, which `rayslice.startup_scripts.controller`
passes): the spec, written whenever what it sees of a healthy slice changes, and the recreation
under way with the step it reached, written before each call is sent. A successor reads the file
when it first looks at the slice and finishes the recreation from that step; every step checks
the cloud before it acts (a delete only while the old resource is there, an insert only while
none is, createInstances only for the hosts not yet there), so a step sent twice does no harm.

A file is replaced whole (written beside it, flushed, renamed over it), so a crash leaves the
old file or the new one, never half of one. The directory and files are private (0700, 0600):
the spec holds the hosts' boot metadata. The state lives on the controller VM's boot disk: it
survives a restart and a reboot, not the VM's replacement (a new controller bundle replaces the
VM; `pulumi up` then also declares the slices again).

Standard library only (the controller's bundle, Python 3.10).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Steps of a recreation, in order; `Recreation.step` is the last one begun.
DELETE = "delete"  # what is left of the slice: its MIG, node or queued request
INSERT = "insert"  # the MIG, node or queued request again
CREATE_HOSTS = "createInstances"  # a MIG's named hosts
STEPS = (DELETE, INSERT, CREATE_HOSTS)


@dataclass
class Recreation:
    """A recreation under way: the step begun last, what the slice looked like when it began,
    and which attempt it is."""

    step: str
    seen: str
    attempt: int = 1


@dataclass
class Entry:
    """What the journal holds for one slice."""

    spec: dict[str, Any] | None = None
    recreation: Recreation | None = None
    # Seen whole since it was (re)created: a successor must not read an ended run's MIG, which
    # may wait to make its hosts again, as a slice still waiting for its first hosts.
    was_whole: bool = False
    # Its capacity ended (a flex-start run, a calendar period): nothing is asked again.
    ended: bool = False

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Entry:
        recreation = data.get("recreation")
        return cls(
            data.get("spec"),
            Recreation(**recreation) if recreation else None,
            bool(data.get("was_whole", False)),
            bool(data.get("ended", False)),
        )


@dataclass
class Journal:
    """Per slice, its `Entry`: in `directory` (one ``<slice>.json`` each), or in memory only when
    `directory` is None (a controller that runs inside a test or the simulator's process)."""

    directory: Path | None = None
    _memory: dict[str, Entry] = field(default_factory=dict)

    def load(self, name: str) -> Entry:
        """The slice's entry; an empty one when nothing is kept or the file cannot be read (a
        damaged file holds nothing a successor could trust: it starts as a fresh controller)."""
        if self.directory is None:
            return self._memory.get(name, Entry())
        try:
            return Entry.from_json(json.loads((self.directory / f"{name}.json").read_text()))
        except (OSError, ValueError, TypeError, AttributeError):
            return Entry()

    def save(self, name: str, entry: Entry) -> None:
        """Replaces the slice's entry whole; OSError if the directory cannot be written."""
        if self.directory is None:
            self._memory[name] = Entry(entry.spec, entry.recreation, entry.was_whole, entry.ended)
            return
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        text = json.dumps(asdict(entry), sort_keys=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=self.directory)
        try:
            with os.fdopen(fd, "w") as handle:  # mkstemp creates it 0600
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.directory / f"{name}.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
