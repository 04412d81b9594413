"""Files only the simulation's owner may read or write: the state dir, state.json, token files.

The simulator runs as root and acts on what its state directory says (which namespaces to
delete, which processes to kill), so that directory must be out of reach of other local users:
it is created 0700, and an existing one is refused when it is a symlink, owned by anyone but
the caller or root, or writable by group or others. Secrets are never created with a wider mode
and narrowed later (a reader could open them in between): `write_private` creates a fresh file
with ``O_CREAT | O_EXCL`` and mode 0600, writes it, then renames it into place.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from rayslice.errors import SimulatorError

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def _trusted_owner(uid: int) -> bool:
    """The caller itself, or root (a non-root `status` may read a simulation root made for it)."""
    return uid in (os.geteuid(), 0)


def check_private(path: Path, *, directory: bool) -> os.stat_result:
    """lstat `path` and refuse it unless it is a real file/dir, ours (or root's), not writable by others."""
    info = os.lstat(path)
    kind = "directory" if directory else "file"
    if stat.S_ISLNK(info.st_mode):
        raise SimulatorError(
            f"refusing {path}: the simulator's {kind} is a symlink; remove it or pick another path"
        )
    if directory and not stat.S_ISDIR(info.st_mode):
        raise SimulatorError(f"refusing {path}: not a directory")
    if not directory and not stat.S_ISREG(info.st_mode):
        raise SimulatorError(f"refusing {path}: not a regular file")
    if not _trusted_owner(info.st_uid):
        raise SimulatorError(
            f"refusing {path}: owned by uid {info.st_uid}, not by you (uid {os.geteuid()}) or root; "
            "another user could have written what the simulator would act on as root"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SimulatorError(
            f"refusing {path}: writable by group or others (mode {stat.S_IMODE(info.st_mode):o}); "
            f"`chmod {PRIVATE_DIR_MODE if directory else PRIVATE_FILE_MODE:o} {path}` if it is yours"
        )
    return info


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) 0700, or accept an existing one that passes `check_private`.

    An existing empty directory is narrowed to 0700 through a descriptor opened with O_NOFOLLOW,
    so the mode lands on the directory that was checked. A non-empty one that is not 0700 yet is
    refused: it holds someone's files (``--state-dir .`` in a project), whose mode is not ours to
    change.
    """
    path = Path(os.path.abspath(path))
    if not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # created meanwhile: checked below like any other
            os.mkdir(path, PRIVATE_DIR_MODE)
    info = check_private(path, directory=True)
    if stat.S_IMODE(info.st_mode) != PRIVATE_DIR_MODE:
        if any(path.iterdir()):
            raise SimulatorError(
                f"refusing {path}: it holds other files and is not private (mode "
                f"{stat.S_IMODE(info.st_mode):o}); give the simulation a new or empty directory"
            )
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, PRIVATE_DIR_MODE)
        finally:
            os.close(fd)
    return path


def make_private_subdir(path: Path) -> Path:
    """mkdir -p inside a private dir, every new level 0700 (umask can only narrow it)."""
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        os.mkdir(directory, PRIVATE_DIR_MODE)
    return path


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` as a 0600 file, atomically, never through a wider mode or a symlink."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_private(path: Path) -> str:
    """Read a file written by `write_private`, refusing one that someone else could have written."""
    check_private(path, directory=False)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as source:
        return source.read()
