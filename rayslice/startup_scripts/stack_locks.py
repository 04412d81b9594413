"""Stack locks: the spec's own `requirements`, resolved once on the deployer's machine.

A preset's lock pins the preset and Ray (`locks`), but a stack's `requirements` would still be
resolved by every host at its own boot: two hosts could get different releases, and each host
asks the index again. So when the Pulumi program or `rayslice preview` runs, they are resolved
here, with the preset lock's versions as constraints (they can add packages, not move a locked
one), into one lock that holds the preset lock's lines and the added packages' pinned, hashed
lines. Hosts install that lock alone (``--require-hashes --no-deps``), as they install a preset
lock, and the install fingerprint follows its digest.

A spec whose `rayVersion` has no shipped preset lock (they are made for `DEFAULT_RAY_VERSION`)
gets its whole set resolved here instead: the preset's lines with its Ray release, and its
`requirements`, in one uv resolution (no constraints: nothing is locked yet), so its hosts too
install a lock and resolve nothing.

The lock is kept beside the Pulumi project as ``rayslice-locks/<stack>.lock`` (users commit it,
as they commit a uv.lock) and reused while its header matches what it would be resolved from
now (the preset lock's digest where there is one, the requirement lines, index, find-links,
Python, platform) and it holds nothing but pins, hashes and comments; otherwise it is resolved
again, with a one-line note on stderr that says why.
"""

from __future__ import annotations

import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rayslice.errors import InvalidInput
from rayslice.platforms import VM_PLATFORMS
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts import locks, render
from rayslice.startup_scripts.variables import PYTHON_VERSION, preset_lock, whole_lock_header

LOCK_DIR_NAME = "rayslice-locks"


@dataclass(frozen=True)
class StackLocks:
    """Where a stack's lock lives: ``directory/<stack>.lock``."""

    directory: Path
    stack: str

    @classmethod
    def for_stack_file(cls, stack_file: str | None) -> StackLocks:
        """`rayslice preview`'s: the stack of ``Pulumi.<stack>.yaml`` (the file's stem for another
        name, ``default`` without a file), in ``rayslice-locks/`` beside the nearest Pulumi.yaml
        at or above the file's directory (or the working directory), as `pulumi up` finds it;
        beside the stack file where there is none."""
        start = Path(stack_file).resolve().parent if stack_file else Path.cwd()
        root = next((d for d in (start, *start.parents) if (d / "Pulumi.yaml").exists()), start)
        name = Path(stack_file).name if stack_file else "Pulumi.default.yaml"
        match = re.fullmatch(r"Pulumi\.(.+)\.ya?ml", name)
        return cls(root / LOCK_DIR_NAME, match[1] if match else Path(name).stem)

    @property
    def path(self) -> Path:
        return self.directory / f"{self.stack}.lock"

    def lock(self, spec: ClusterSpec) -> locks.Lock | None:
        """The stack lock the hosts of `spec` install: None when the spec has no `requirements`
        and its Ray release has a preset lock (that lock is the whole set). Raises InvalidInput
        (exit 2) when the lines do not resolve, the index does not answer, uv is missing, or the
        lock would not fit into the boot script's metadata value."""
        base = preset_lock(spec)
        if base is not None and not spec.requirements:
            return None
        wanted = _wanted(spec, base)
        found, problem = self._stored()
        if found is not None and dict(found.header) == wanted:
            _check_fits(spec, found, self.path)
            return found
        print(
            f"rayslice: resolving {'requirements' if base else 'the whole requirement set'} into "
            f"{self.path} ({'its header differs from this stack' if found else problem})",
            file=sys.stderr,
        )
        lock = resolve_beside(base, wanted) if base is not None else resolve_whole(wanted, spec.ray_version)
        _check_fits(spec, lock, self.path)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path.write_text(lock.text)
        return lock

    def _stored(self) -> tuple[locks.Lock | None, str]:
        """The committed lock, or None and why it is not used: then it is resolved again and
        overwritten. A lock is read back only if every line is one uv writes (`locks.foreign_line`):
        the file is committed, so anyone who can change the repository could add an index, a URL
        or a path that hosts would install from, past the header check."""
        if not self.path.exists():
            return None, "no lock yet"
        text = self.path.read_text()
        try:
            lock = locks.parse(text)
        except InvalidInput as error:
            return None, str(error)
        problem = locks.foreign_line(text)
        return (None, f"refused: {problem}") if problem else (lock, "")


def _wanted(spec: ClusterSpec, base: locks.Lock | None) -> dict[str, str]:
    """The header the stack lock of `spec` has: beside the preset lock `base` (its digest as
    `base`), or, for a Ray release without one, the whole set's."""
    if base is None:
        return whole_lock_header(spec.preset, spec.ray_version, spec.requirements, spec.package_index)
    return {
        **locks.header(spec.preset, spec.requirements, PYTHON_VERSION, spec.package_index, base.find_links),
        "base": base.digest,
    }


def resolve_beside(base: locks.Lock, wanted: dict[str, str]) -> locks.Lock:
    """The lock of `wanted`'s header: `base`'s lines, then those of the packages its requirement
    lines add, resolved under `base`'s versions."""
    advice = (
        f"fix the requirements (they are resolved with the {wanted['preset']} preset's locked "
        "versions as constraints)"
    )
    return _merged(base, _resolve(wanted, advice, base), wanted)


def resolve_whole(wanted: dict[str, str], ray_version: str) -> locks.Lock:
    """The lock of `wanted`'s header, every line resolved at once: the set of a Ray release that
    no preset lock was made for."""
    advice = (
        f"fix the requirements or rayVersion (no {wanted['preset']} preset lock was made for Ray "
        f"{ray_version}, so the preset's lines, Ray {ray_version} and the requirements are resolved together)"
    )
    return _resolve(wanted, advice)


def _resolve(wanted: dict[str, str], advice: str, base: locks.Lock | None = None) -> locks.Lock:
    """The requirement lines resolved, under the preset lock's versions where there is one
    (uv's ``--constraint``); a refusal ends with `advice` (what to fix, and how they were
    resolved)."""
    uv = locks.uv_binary()
    with tempfile.TemporaryDirectory() as tmp:
        constraints = None
        if base is not None:
            constraints = Path(tmp, "constraints.txt")
            constraints.write_text("".join(f"{pin}\n" for pin in base.pins()))
        try:
            return locks.compile_lock(uv, wanted, constraints)
        except InvalidInput as error:
            index = wanted["index"] or locks.PYPI_SIMPLE
            raise InvalidInput(
                f"{error}; {advice} or make the index {index} reachable from this machine"
            ) from None


def _merged(base: locks.Lock, added: locks.Lock, header: dict[str, str]) -> locks.Lock:
    """The preset lock's lines, then those of the packages it does not pin (a package it pins was
    resolved to the same version, under the constraint, and keeps the preset lock's hashes)."""
    names = [pin.partition("==")[0] for pin in base.pins()]
    body = base.body.rstrip("\n") + "\n" + locks.without(added.body, names)
    return locks.Lock(header, body)


def _check_fits(spec: ClusterSpec, lock: locks.Lock, path: Path) -> None:
    """A VM host reads the lock inside its boot script, one metadata value: refuse a lock that
    makes the script too large now, before anything is created."""
    if spec.platform not in VM_PLATFORMS:
        return  # GKE: the pod start script is a ConfigMap, whose 1 MiB the script stays far below
    try:
        render(spec, lock=lock)
    except InvalidInput as error:
        raise InvalidInput(
            f"the stack lock {path} ({len(lock.text)} bytes, {len(lock.pins())} packages) does not fit "
            f"into the boot script's metadata value: {error}; list fewer requirements"
        ) from None
