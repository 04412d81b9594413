"""What of a script's folder a job uploads: rayslice walks the folder itself, and Ray packs a copy.

Ray's packer follows symlinks wherever they point (``creds -> ~/.config/gcloud`` would ship the
user's Google credentials), loops forever on a symlink cycle and ends in a traceback on an
unreadable file. So `select` walks the folder first, without following anything blindly:

- a symlink must stay inside the folder (else `InvalidInput`, exit 2, naming it); one that points
  in is followed, and its target must pass the same rules; a cycle is an error, not a hang;
- `DENIED` (gitignore patterns, the same matcher Ray uses) and the folder's own ``.gitignore`` /
  ``.rayignore`` files leave paths behind;
- files that are credentials by their content (a service-account key or a user's refresh token,
  whatever they are called) and a simulator state folder under any name stay behind too;
- a hard link whose other names are not all in the folder is an error that names it: its other
  name may be ``~/.config/gcloud/...``, and a link gives no hint of where it leads;
- an unreadable file or folder is an error that names it.

`copy` writes the selected files (regular files only, no links) into a staging folder, and that
copy is what Ray packs: nothing it could follow leads anywhere else. It opens each file without
following a link (``O_NOFOLLOW``) and checks that it is the very file the walk saw (device and
inode), so a file swapped for a link, or for another file, between the walk and the copy is an
error, not an upload.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rayslice.errors import InvalidInput

# gitignore-style patterns never uploaded, at any depth: version control, virtual environments,
# the simulator's state, caches, and the names under which secrets usually live.
DENIED = (
    ".git",
    ".venv",
    "venv",
    ".state",
    "__pycache__",
    ".ray",
    # environment files and shell hooks that export secrets
    ".env",
    ".env.*",
    ".envrc",
    # tokens (ray-token among them) and keys, PKCS #12 key stores among them
    "token",
    "*_token",
    "*-token",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa*",
    "id_ecdsa*",
    "id_ed25519*",
    # tools' credential stores: gcloud, gsutil (boto), AWS, Kubernetes, Docker, PyPI, npm, Kaggle,
    # git, netrc, GnuPG, SSH
    "application_default_credentials.json",
    ".boto",
    ".npmrc",
    "kaggle.json",
    "credentials.db",
    "access_tokens.db",
    ".config",
    ".aws",
    ".kube",
    ".docker",
    ".pypirc",
    ".git-credentials",
    ".netrc",
    ".gnupg",
    ".ssh",
    # Terraform state holds every secret of the resources it manages, in clear
    "*.tfstate",
    "*.tfstate.*",
)

# A simulator state folder under another name than `.state`: its state file beside one of its
# secrets. The names are the simulator's (rayslice.local.simulation.state); the client may not import the
# simulator (it is installed without it), so tests/jobs/test_upload.py checks that they agree.
SIMULATOR_STATE_FILE = "state.json"
SIMULATOR_SECRET_FILES = ("ray-token", "cloud-api-credentials.json")

# Credential files recognised by their content, read from the first `_HEAD_BYTES` of each file:
# a Google service-account key and an authorized-user file (gcloud's application default
# credentials), whatever their names.
_HEAD_BYTES = 64 * 1024
_CREDENTIALS = (
    (re.compile(rb'"type"\s*:\s*"service_account"'), b'"private_key"'),
    (re.compile(rb'"type"\s*:\s*"authorized_user"'), b'"refresh_token"'),
)
_IGNORE_FILES = (".gitignore", ".rayignore")


@dataclass(frozen=True)
class Entry:
    """One file that is uploaded: its path in the job's working dir, where it is read from, and
    which file the walk found there (`copy` copies that file or none)."""

    path: str
    source: Path
    size: int
    device: int
    inode: int


@dataclass(frozen=True)
class Selection:
    """What a folder uploads, and what the content rules kept back (credentials, state folders)."""

    root: Path
    files: tuple[Entry, ...]
    kept_back: tuple[str, ...]

    @property
    def size(self) -> int:
        return sum(entry.size for entry in self.files)


Matcher = Callable[[str], bool]


def select(root: Path) -> Selection:
    """Walk `root` and return what a job may upload from it; `InvalidInput` when it cannot."""
    from ray._private.thirdparty.pathspec import PathSpec  # the matcher Ray's packer uses; Ray is heavy

    root = root.resolve()
    denied = PathSpec.from_lines("gitwildmatch", DENIED)
    files: list[Entry] = []
    kept_back: list[str] = []
    # Files with more than one name: (device, inode) -> (names, the real paths seen in the folder).
    linked: dict[tuple[int, int], tuple[int, set[Path]]] = {}

    def ignore_matchers(directory: Path, rel: PurePosixPath) -> list[tuple[PurePosixPath, Matcher]]:
        found = []
        for name in _IGNORE_FILES:
            path = directory / name
            if path.is_file():
                spec = PathSpec.from_lines("gitwildmatch", _read_text(path).splitlines())
                found.append((rel, spec.match_file))
        return found

    def walk(directory: Path, rel: PurePosixPath, chain: tuple[Path, ...], matchers: list) -> None:
        matchers = matchers + ignore_matchers(directory, rel)
        for entry in _entries(directory):
            entry_rel = rel / entry.name
            if denied.match_file(str(entry_rel)) or any(
                match(str(entry_rel.relative_to(base))) for base, match in matchers
            ):
                continue
            path = Path(entry.path)
            target = _link_target(path, entry_rel, root) if entry.is_symlink() else path
            if target != path and denied.match_file(str(target.relative_to(root))):
                continue  # a link to a file that is denied under its own name
            if target.is_dir():
                real = target.resolve()
                if real in chain:
                    raise InvalidInput(
                        f"symlink {entry_rel} in {root} leads back to {real}, which contains it: "
                        "Ray would pack it forever; remove the link or list it in .rayignore"
                    )
                if _is_simulator_state(target):
                    kept_back.append(f"{entry_rel}/")
                    continue
                walk(path, entry_rel, (*chain, real), matchers)
            elif target.is_file():
                if _is_credential(target, entry_rel):
                    kept_back.append(str(entry_rel))
                    continue
                found = target.stat()
                if found.st_nlink > 1:
                    linked.setdefault((found.st_dev, found.st_ino), (found.st_nlink, set()))[1].add(
                        target.resolve()
                    )
                files.append(Entry(str(entry_rel), target, found.st_size, found.st_dev, found.st_ino))
            # sockets, pipes and devices: Ray's packer skips them too

    walk(root, PurePosixPath(), (root,), [])
    for entry in files:
        names, seen = linked.get((entry.device, entry.inode), (1, {entry.source}))
        if names > len(seen):
            raise InvalidInput(
                f"{entry.path} in {root} is a hard link: the file has {names} names and only "
                f"{len(seen)} of them are uploaded from the folder, so another may be outside it, and "
                "whatever it holds would go with the job. Replace the link with a copy (cp), or "
                "list it in .rayignore"
            )
    return Selection(root, tuple(files), tuple(kept_back))


def copy(selection: Selection, into: Path) -> Path:
    """Write the selected files under `into` (regular files, modes kept); returns `into`.
    `InvalidInput` when a file is no longer the one `select` found (a link now, or another file)."""
    into.mkdir(parents=True, exist_ok=True)
    for entry in selection.files:
        destination = into / entry.path
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            _copy_walked(entry, destination)
        except OSError as exc:
            raise InvalidInput(f"cannot copy {entry.source} for the upload: {exc.strerror}") from None
    return into


def _copy_walked(entry: Entry, destination: Path) -> None:
    """Copy `entry`'s file, opened without following a link, if it is still the walked one.
    O_NONBLOCK: a pipe swapped in would otherwise block the open; it is refused below."""
    try:
        source = os.open(entry.source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last name is a symbolic link now
            raise _changed(entry) from None
        raise
    with os.fdopen(source, "rb") as reader:
        found = os.fstat(reader.fileno())
        if not stat.S_ISREG(found.st_mode) or (found.st_dev, found.st_ino) != (entry.device, entry.inode):
            raise _changed(entry)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(destination, flags, 0o600), "wb") as writer:
            shutil.copyfileobj(reader, writer)
            os.fchmod(writer.fileno(), stat.S_IMODE(found.st_mode))


def _changed(entry: Entry) -> InvalidInput:
    return InvalidInput(
        f"{entry.path} changed while the upload was prepared: {entry.source} is no longer the file "
        "rayslice selected (a link now, or another file). Nothing was uploaded; run again once the "
        "folder holds still"
    )


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as found:
            return sorted(found, key=lambda e: e.name)
    except OSError as exc:
        raise InvalidInput(
            f"cannot read folder {directory} for the upload: {exc.strerror}; fix its permissions "
            "or list it in .rayignore"
        ) from None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None


def _link_target(link: Path, rel: PurePosixPath, root: Path) -> Path:
    """Where `link` leads, if that is inside `root`; `InvalidInput` for a cycle, a dangling link
    or a target outside."""
    try:
        target = link.resolve(strict=True)
    except FileNotFoundError:
        raise InvalidInput(
            f"symlink {rel} in {root} points to {os.readlink(link)!r}, which does not exist; "
            "remove it or list it in .rayignore"
        ) from None
    except (RuntimeError, OSError):  # RuntimeError: Python 3.11-3.12's "Symlink loop"; later ELOOP
        raise InvalidInput(
            f"symlink {rel} in {root} is part of a symlink loop; remove it or list it in .rayignore"
        ) from None
    if not target.is_relative_to(root):
        raise InvalidInput(
            f"symlink {rel} in {root} points outside the folder, to {target}: Ray would upload "
            "what it points to. Copy what the job needs into the folder, or list the link in "
            ".rayignore"
        )
    return target


def _is_simulator_state(directory: Path) -> bool:
    return (directory / SIMULATOR_STATE_FILE).exists() and any(
        (directory / name).exists() for name in SIMULATOR_SECRET_FILES
    )


def _is_credential(path: Path, rel: PurePosixPath) -> bool:
    try:
        with path.open("rb") as file:
            head = file.read(_HEAD_BYTES)
    except OSError as exc:
        raise InvalidInput(
            f"cannot read {rel} in the working dir: {exc.strerror}; fix its permissions or list it "
            "in .rayignore"
        ) from None
    return any(kind.search(head) and field in head for kind, field in _CREDENTIALS)
