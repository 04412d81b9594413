"""The files of one simulated host, all in its own directory under the simulation's state dir.

The simulator writes them (script, metadata tree) and the host's PID 1 (`boot`) and metadata
server read and write the rest (console, exit status, guest attributes). A host's directory is
named after the host, so the name must be a GCE instance name: no "/", "." or ".." can pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rayslice.errors import SimulatorError

# GCE instance names (RFC 1035 labels, at most 63 characters): no "/", "." or ".." can pass.
HOST_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class HostPaths:
    """The files of one simulated host, all under ``<state dir>/hosts/<name>/``."""

    dir: Path

    @classmethod
    def of(cls, state_dir: str | Path, name: str) -> HostPaths:
        if not HOST_NAME.fullmatch(name):
            raise SimulatorError(f"{name!r} is not a simulated host's name")
        return cls(Path(state_dir) / "hosts" / name)

    @property
    def root(self) -> Path:
        """Bound over the plan's root inside the host: what the boot script writes lands here."""
        return self.dir / "root"

    @property
    def script(self) -> Path:
        return self.dir / "startup-script"

    @property
    def boot_log(self) -> Path:
        """The boot script's own log (startup.sh.j2's LOG_FILE below the host's root)."""
        return self.root / "var/log/rayslice/boot.log"

    @property
    def console(self) -> Path:
        """Startup-script output, like a VM's serial console."""
        return self.dir / "console.log"

    @property
    def exit_file(self) -> Path:
        """The startup script's exit status; empty while it runs."""
        return self.dir / "startup-script.exit"

    @property
    def metadata_tree(self) -> Path:
        return self.dir / "metadata.json"

    @property
    def guest_file(self) -> Path:
        return self.dir / "guest-attributes.json"

    @property
    def metadata_log(self) -> Path:
        return self.dir / "metadata.log"
