"""Files under a folder that someone less trusted may also write, opened without following links.

The simulator's record folder is written by the simulated machines (each into its own folder)
and by the machine's root (`rayslice local down`, `rayslice run`). A machine could plant a
symbolic link, a FIFO or a device node where root later writes or reads. So every path here is
walked one component at a time from a folder descriptor (``openat`` with ``O_NOFOLLOW |
O_DIRECTORY``): a link anywhere in it is refused, never followed, so nothing is created or read
outside the folder. A file is read only if it is a regular file (checked on an ``O_PATH``
descriptor before it is opened for reading, so a FIFO cannot block and a device is never
opened), and at most `cap` bytes of it. A listing names regular files only and never enters a
linked folder.

Runs on the machines too (the record shipper's zipapp), on Python 3.10.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
# How deep a listing goes: a record key has a handful of parts; deeper is not a record's.
MAX_DEPTH = 24


class NotPlain(OSError):
    """A path part is a link, or what should be a file is not a regular file: refused."""


def _open_dir(name: str, parent: int, create: bool) -> int:
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotPlain(exc.errno, f"{name!r} is a link or not a folder: refused", name) from None
        raise


@contextlib.contextmanager
def folder(root: Path, parts: Sequence[str], create: bool = False) -> Iterator[int]:
    """A descriptor of `root`/`parts` reached without following a link in `parts` (each level
    made 0700 with `create`); `root` itself is the caller's."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            inner = _open_dir(part, fd, create)
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def write_once(root: Path, parts: Sequence[str], data: bytes, temp_name: str) -> None:
    """Create the file `root`/`parts` holding `data`, atomically and only if it does not exist
    (`FileExistsError`): written to `temp_name` beside it first, then hard-linked into place."""
    *dirs, name = parts
    if not os.path.lexists(root):  # the caller's own folder: made like the levels below it
        _make_dirs(root)
    with folder(root, dirs, create=True) as fd:
        out = os.open(temp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
        try:
            with os.fdopen(out, "wb") as file:
                file.write(data)
            os.link(temp_name, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
        finally:
            os.unlink(temp_name, dir_fd=fd)


def _make_dirs(path: Path) -> None:
    """mkdir -p, every level it creates 0700 (a record holds logs: private like the state dir)."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = path.parent
    for level in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(level, 0o700)


def read_regular(root: Path, parts: Sequence[str], cap: int) -> bytes:
    """The bytes of the regular file `root`/`parts`, refused (`NotPlain`) for anything else and
    (`OSError` EFBIG) when it holds more than `cap` bytes."""
    *dirs, name = parts
    with folder(root, dirs) as fd:
        handle = os.open(name, PATH_FLAGS, dir_fd=fd)
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise NotPlain(errno.EINVAL, f"{name!r} is not a regular file: refused", name)
        if info.st_size > cap:
            raise OSError(errno.EFBIG, f"{name!r} holds {info.st_size} bytes, more than {cap}", name)
        # Reopened through the O_PATH descriptor: the very file checked above, never a swapped one.
        reader = os.open(f"/proc/self/fd/{handle}", READ_FLAGS)
    finally:
        os.close(handle)
    with os.fdopen(reader, "rb") as file:
        data = file.read(cap + 1)
    if len(data) > cap:
        raise OSError(errno.EFBIG, f"{name!r} grew past {cap} bytes", name)
    return data


def regular_files(root: Path, parts: Sequence[str], limit: int) -> list[str]:
    """Every regular file under `root`/`parts`, as paths relative to `root` ("/"-joined),
    without entering a link or going deeper than `MAX_DEPTH`; names starting with "." are left
    out (temporary files). An `OSError` when there are more than `limit`."""
    found: list[str] = []
    try:
        with folder(root, parts) as fd:
            _walk(fd, "/".join(parts), found, limit, MAX_DEPTH)
    except (FileNotFoundError, NotPlain):
        return []
    return found


def _too_many(limit: int, prefix: str) -> OSError:
    return OSError(errno.E2BIG, f"more than {limit} objects under {prefix or 'the record'}")


def _walk(fd: int, prefix: str, found: list[str], limit: int, depth: int) -> None:
    listed = []
    with os.scandir(fd) as entries:
        for entry in entries:  # counted as read: a folder of millions of names is not held
            listed.append(
                (entry.name, entry.is_dir(follow_symlinks=False), entry.is_file(follow_symlinks=False))
            )
            if len(found) + len(listed) > limit:
                raise _too_many(limit, prefix)
    listed.sort()
    for name, is_dir, is_file in listed:
        if name.startswith("."):
            continue
        key = f"{prefix}/{name}" if prefix else name
        if is_file:
            found.append(key)
            if len(found) > limit:
                raise _too_many(limit, prefix)
        elif is_dir and depth > 0:
            try:
                inner = _open_dir(name, fd, create=False)
            except (FileNotFoundError, NotPlain):
                continue  # removed or swapped for a link since it was listed
            try:
                _walk(inner, key, found, limit, depth - 1)
            finally:
                os.close(inner)


def modified(root: Path, parts: Sequence[str]) -> float:
    """When the file `root`/`parts` was last written (its creation, for a file written once),
    not following a link."""
    *dirs, name = parts
    with folder(root, dirs) as fd:
        return os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime
