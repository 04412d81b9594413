"""Locked installs: each preset's requirement set, with Ray, pinned to exact files.

Without a lock every host resolves `jax[tpu]>=0.10.2,<0.11` against the index at its own boot:
two hosts of one slice booted a day apart may run different releases, and an image baked last
week holds another set than a host installing today. A lock pins every package of the set to one
version and the sha256 of the files a host may install, so every host installs the same bytes,
without resolving (``uv pip install --require-hashes --no-deps``, pip's equivalent on GKE).

A lock file is uv's ``pip compile --generate-hashes`` output under a header this module writes
and reads back: what was resolved (preset, requirement lines), for which Python and platform, and
from which index and find-links. ``scripts/lock_presets.py`` writes one per preset into
``locks/`` (shipped as package data). uv lists the hashes of every file of a pinned version (all
platforms, dozens for numpy); `slim` keeps those a host can install, which keeps a lock small
enough for the boot script, itself a metadata value of at most 256 KiB.
"""

from __future__ import annotations

import functools
import hashlib
import html
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging import tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from rayslice.errors import InvalidInput

LOCK_DIR = Path(__file__).with_name("locks")
# The hosts' platform, as uv's `--python-platform` spells it. The images hosts boot
# (`catalog`: the TPU VM runtime tpu-ubuntu2204-base, Compute Engine's ubuntu-accel-2204-… and,
# for TPU7x, ubuntu-accel-2404-…) are Ubuntu 22.04 (glibc 2.35) or 24.04 (glibc 2.39), so a
# manylinux_2_35 wheel or an older one runs on all of them; libtpu itself is a manylinux_2_31
# wheel. TPU hosts and the head VM are x86_64 (docs/decisions.md, "Hosts are x86_64").
PLATFORM = "x86_64-manylinux_2_35"
_GLIBC = (2, 35)
_ARCH = "x86_64"
# The header's keys, in order. `index` is empty for PyPI; `find-links` and `requirements` are
# joined with " | ", which no requirement line or URL holds.
HEADER_KEYS = ("preset", "requirements", "python", "platform", "index", "find-links")
# Written only when set: `base`, the digest of the preset lock a stack lock was resolved on.
OPTIONAL_KEYS = ("base",)
_SEPARATOR = " | "
_HEADER = re.compile(r"# rayslice-lock (?P<key>[a-z-]+): ?(?P<value>.*)")
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^ ;\\]+)")
_HASH = re.compile(r"--hash=sha256:(?P<digest>[0-9a-f]{64})")
# Every line a lock may hold, as uv writes one: a pin (``name==version``, continued when hashes
# follow), an indented ``--hash=sha256:`` continuation, a comment (the header, uv's ``# via``) or
# nothing. Anything else (an index or find-links option, a URL, a path, ``-e``, ``-r``, a range)
# would make a host fetch or run what no hash pins, so a lock holding it is not used.
_LOCK_LINE = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+( \\)?|\s+--hash=sha256:[0-9a-f]{64}( \\)?|\s*(#.*)?"
)


@dataclass(frozen=True)
class Lock:
    """One lock file: its header (what it was resolved for) and uv's pinned, hashed lines."""

    header: Mapping[str, str]
    body: str

    @property
    def text(self) -> str:
        keys = [*HEADER_KEYS, *(key for key in OPTIONAL_KEYS if key in self.header)]
        lines = [f"# rayslice-lock {key}: {self.header.get(key, '')}".rstrip() for key in keys]
        return "\n".join(lines) + "\n" + self.body

    @property
    def digest(self) -> str:
        """What identifies the set a host installs: a changed lock changes the hosts."""
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]

    @property
    def requirements(self) -> list[str]:
        return _split(self.header.get("requirements", ""))

    @property
    def find_links(self) -> list[str]:
        return _split(self.header.get("find-links", ""))

    def pins(self) -> list[str]:
        """``name==version`` of every locked package (constraints for what is resolved beside it)."""
        return [f"{m['name']}=={m['version']}" for m in map(_PIN.match, self.body.splitlines()) if m]


def _split(value: str) -> list[str]:
    return [part for part in value.split(_SEPARATOR) if part]


def header(
    preset: str, requirements: Iterable[str], python: str, index: str | None, find_links: Iterable[str]
) -> dict[str, str]:
    """A lock's header for this resolution (its values must not hold the separator or newlines)."""
    values = {
        "preset": preset,
        "requirements": _SEPARATOR.join(requirements),
        "python": python,
        "platform": PLATFORM,
        "index": index or "",
        "find-links": _SEPARATOR.join(find_links),
    }
    for key, value in values.items():
        if "\n" in value or (key not in ("requirements", "find-links") and _SEPARATOR in value):
            raise InvalidInput(f"lock header {key}={value!r} cannot be written on one line")
    return values


def parse(text: str) -> Lock:
    """A lock from its text: the header lines first, then the body as uv wrote it."""
    found: dict[str, str] = {}
    lines = text.splitlines(keepends=True)
    while lines and (match := _HEADER.fullmatch(lines[0].rstrip("\n"))):
        found[match["key"]] = match["value"]
        lines.pop(0)
    missing = [key for key in HEADER_KEYS if key not in found]
    if missing:
        raise InvalidInput(f"not a rayslice lock: its header lacks {', '.join(missing)}")
    return Lock(found, "".join(lines))


# The CPython releases a lock of rayslice's own packages (`ShippedLock`) may be installed with: the
# python3 of the images rayslice boots (Ubuntu 22.04: 3.10; 24.04: 3.12), the hosts' venv (3.11)
# and a simulator machine's python3 (3.11 or newer). Resolved for the first, wheels kept for all.
IMAGE_PYTHONS = ("3.10", "3.11", "3.12", "3.13")


@dataclass(frozen=True)
class ShippedLock:
    """A lock of packages rayslice itself runs on a VM, shipped in `LOCK_DIR` as ``<name>.lock``:
    the recovery controller's libraries, the head's package cache. Resolved from PyPI, wheels
    only, by ``scripts/lock_presets.py``; installed with ``--require-hashes --no-deps``."""

    name: str
    requirements: tuple[str, ...]
    pythons: tuple[str, ...] = IMAGE_PYTHONS

    @property
    def path(self) -> Path:
        return LOCK_DIR / f"{self.name}.lock"

    def header(self) -> dict[str, str]:
        """What the lock is resolved from: its lines, for its oldest Python, from PyPI."""
        return header(self.name, self.requirements, self.pythons[0], None, ())

    def read(self) -> Lock:
        return parse(self.path.read_text())

    def compile(self, uv: str) -> Lock:
        return compile_lock(uv, self.header(), also_pythons=self.pythons[1:])


def foreign_line(text: str) -> str | None:
    """Why `text` (a lock file, header included) cannot be used as a lock: its first line that is
    not a pin, a ``--hash=sha256:`` continuation or a comment; None if there is none."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not _LOCK_LINE.fullmatch(line):
            return (
                f"line {number} is {line[:80]!r}: a lock holds only name==version lines, "
                "--hash=sha256: continuations and comments"
            )
    return None


def preset_lock(preset: str, requirements: Iterable[str]) -> Lock | None:
    """The shipped lock of `preset`, if it was resolved for exactly these requirement lines (the
    preset's and Ray's). A spec with another `rayVersion` has none: its hosts resolve the lines
    themselves, as before locks (docs/boot-script.md)."""
    path = LOCK_DIR / f"{preset}.lock"
    if not path.exists():
        return None
    lock = parse(path.read_text())
    return lock if lock.requirements == list(requirements) else None


@functools.cache
def _supported(python: str) -> frozenset[tags.Tag]:
    """The wheel tags a host (CPython `python`, glibc 2.35, x86_64) installs."""
    major, minor = (int(part) for part in python.split("."))
    platforms = [f"manylinux_{_GLIBC[0]}_{m}_{_ARCH}" for m in range(_GLIBC[1], 16, -1)]
    platforms += [f"manylinux2014_{_ARCH}", f"manylinux2010_{_ARCH}", f"manylinux1_{_ARCH}"]
    platforms += [f"manylinux_2_{m}_{_ARCH}" for m in range(16, 4, -1)] + [f"linux_{_ARCH}"]
    return frozenset(
        {
            *tags.cpython_tags((major, minor), platforms=platforms),
            *tags.compatible_tags((major, minor), f"cp{major}{minor}", platforms=platforms),
        }
    )


def compatible(filename: str, python: str) -> bool:
    """Whether a host (CPython `python`, glibc 2.35, x86_64) can install this wheel."""
    try:
        _, _, _, wheel_tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return not wheel_tags.isdisjoint(_supported(python))


def slim(body: str, files: Mapping[str, Mapping[str, str]], *pythons: str) -> str:
    """uv's lock body with only the hashes of files a host can install: `files[name]` maps the
    sha256 of each file the index lists for a project to the file's name, and a host runs one of
    `pythons`. A package with no compatible wheel keeps its sdists' hashes; a hash whose file is
    not listed is kept, so nothing a host needs is ever dropped."""
    out: list[str] = []
    for block in _blocks(body):
        pin = _PIN.match(block[0])
        listing = files.get(canonicalize_name(pin["name"]), {}) if pin else {}
        digests = [m["digest"] for m in map(_HASH.search, block) if m]
        wheels = {d for d in digests if any(compatible(listing.get(d, ""), p) for p in pythons)}
        sdists = {d for d in digests if listing.get(d, "").endswith((".tar.gz", ".zip"))}
        unknown = {d for d in digests if d not in listing}
        keep = (wheels or sdists) | unknown
        out += [line for line in block if (m := _HASH.search(line)) is None or m["digest"] in keep]
    return _fix_continuations("\n".join(out))


def _blocks(body: str) -> list[list[str]]:
    """A lock body's lines, grouped per package: its pin, its hashes, uv's ``# via`` comments."""
    blocks: list[list[str]] = []
    for line in body.splitlines():
        if _PIN.match(line) or not blocks:
            blocks.append([])
        blocks[-1].append(line)
    return blocks


def without(body: str, names: Iterable[str]) -> str:
    """A lock body without the blocks of the packages `names`."""
    dropped = {canonicalize_name(name) for name in names}
    kept = [
        line
        for block in _blocks(body)
        if not ((pin := _PIN.match(block[0])) and canonicalize_name(pin["name"]) in dropped)
        for line in block
    ]
    return "".join(f"{line}\n" for line in kept)


def _fix_continuations(body: str) -> str:
    """After hash lines are dropped, a line continues (`` \\``) exactly when a hash line follows."""
    lines = body.splitlines()
    for i, line in enumerate(lines):
        following = lines[i + 1].lstrip() if i + 1 < len(lines) else ""
        continued = line.endswith(" \\")
        if continued and not following.startswith("--hash="):
            lines[i] = line[: -len(" \\")]
        elif not continued and following.startswith("--hash="):
            lines[i] = line + " \\"
    return "\n".join(lines) + "\n"


def uv_binary() -> str:
    """uv, from the `uv` package (a dependency; `rayslice` may run without its venv on PATH),
    else from PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise InvalidInput("uv is not installed: pip install uv") from None
        return found


PYPI_SIMPLE = "https://pypi.org/simple"
# uv's hint when `--no-build` leaves a package without a file to use (uv 0.13: "Wheels are
# required for `NAME` because building from source is disabled").
_NEEDS_WHEEL = re.compile(r"Wheels are required for `([^`]+)`")


_ANCHOR = re.compile(r'<a [^>]*href="[^"#]*#sha256=(?P<digest>[0-9a-f]{64})"[^>]*>(?P<name>[^<]+)</a>')


def index_files(names: Iterable[str], index: str | None) -> dict[str, dict[str, str]]:
    """sha256 -> file name of every file the index lists for each project: from its PEP 691 JSON
    page where it serves one (PyPI does), else from its PEP 503 HTML page (anchors whose href
    ends in ``#sha256=``)."""
    import requests  # here: rendering a script, which imports this module, needs no HTTP client

    base = (index or PYPI_SIMPLE).rstrip("/")
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    listing: dict[str, dict[str, str]] = {}
    with requests.Session() as session:
        for name in names:
            project = canonicalize_name(name)
            answer = session.get(f"{base}/{project}/", headers={"Accept": accept}, timeout=60)
            answer.raise_for_status()
            if "json" in answer.headers.get("Content-Type", ""):
                files = [f for f in answer.json()["files"] if "sha256" in f["hashes"]]
                listing[project] = {f["hashes"]["sha256"]: f["filename"] for f in files}
            else:
                found = _ANCHOR.finditer(answer.text)
                listing[project] = {m["digest"]: html.unescape(m["name"]).strip() for m in found}
    return listing


def compile_lock(
    uv: str,
    lock_header: Mapping[str, str],
    constraints: Path | None = None,
    timeout_s: float = 600,
    also_pythons: Iterable[str] = (),
) -> Lock:
    """Resolve the header's requirement lines for its Python and platform with uv (hashes of every
    file; wheels only, nothing built), then `slim` the hashes to what a host installs: a wheel
    for the header's Python, or for one of `also_pythons` (a lock installed by several). Raises
    InvalidInput with uv's reason when they do not resolve or the index does not answer."""
    with tempfile.TemporaryDirectory() as tmp:
        requirements = Path(tmp, "requirements.in")
        requirements.write_text("".join(f"{line}\n" for line in _split(lock_header["requirements"])))
        command = [uv, "pip", "compile", "--quiet", "--no-header", "--generate-hashes", "--no-config"]
        # Never build: resolving runs on the deployer's machine, and building an sdist runs its
        # build backend, code from the index (uv docs, "--no-build": "Don't build source
        # distributions ... only use pre-built wheels").
        command += ["--no-build"]
        # This interpreter: uv needs one to run, and must not search PATH for it (`rayslice` may
        # run without its venv, or anything, on PATH); --python-version sets the target.
        command += ["--python", sys.executable]
        command += ["--python-version", lock_header["python"], "--python-platform", lock_header["platform"]]
        if lock_header["index"]:
            command += ["--default-index", lock_header["index"]]
        for link in _split(lock_header["find-links"]):
            command += ["--find-links", link]
        if constraints is not None:
            command += ["--constraint", str(constraints)]
        # From inside the temporary directory, so uv's "# via -r requirements.in" names no
        # temporary path: the same resolution always writes the same lock, and the same digest.
        result = subprocess.run(
            [*command, requirements.name],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            cwd=tmp,
        )
    if result.returncode != 0:
        reason = " ".join(line.strip() for line in result.stderr.splitlines() if line.strip())
        unbuilt = sorted(set(_NEEDS_WHEEL.findall(reason)))
        if unbuilt:
            raise InvalidInput(
                f"the requirements cannot be locked: {', '.join(unbuilt)} has no wheel for Python "
                f"{lock_header['python']} on {lock_header['platform']} on the index, only a source "
                "distribution, which is never built here (building runs the package's own code on "
                "this machine); require a release that has a wheel, or serve a wheel of it from "
                f"packageIndex ({reason[-400:]})"
            )
        raise InvalidInput(f"the requirements cannot be locked: {reason[-800:]}")
    body = result.stdout
    pins = [m["name"] for m in map(_PIN.match, body.splitlines()) if m]
    try:
        files = index_files(pins, lock_header["index"] or None)
    except (OSError, ValueError) as error:  # requests' errors are OSErrors, a bad page a ValueError
        raise InvalidInput(f"the package index did not list the locked files: {error}") from None
    return Lock(dict(lock_header), slim(body, files, lock_header["python"], *also_pythons))
