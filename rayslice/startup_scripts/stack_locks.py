"""Stack locks: the spec's own `requirements`, resolved once on the deployer's machine.

A preset's lock pins the preset and Ray (`locks`), but a stack's `requirements` would still be
resolved by every host at its own boot: two hosts could get different releases, and each host
asks the index again. So when the Pulumi program or `rayslice preview` runs, they are resolved
here, with the preset lock's versions as constraints (they can add packages, not move a locked
one), into one lock that holds the preset lock's lines and the added packages' pinned, hashed
lines. Hosts install that lock alone (``--require-hashes --no-deps``), as they install a preset
lock, and the install fingerprint follows its digest.

The lock is kept beside the Pulumi project as ``rayslice-locks/<stack>.lock`` (users commit it,
as they commit a uv.lock) and reused while its header matches what it would be resolved from
now (the preset lock's digest, the requirement lines, index, find-links, Python, platform);
otherwise it is resolved again, with a one-line note on stderr.
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
from rayslice.startup_scripts.variables import PYTHON_VERSION, preset_lock

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
        (the preset lock is the whole set) or its Ray release has no preset lock (its hosts
        resolve every line themselves, docs/boot-script.md). Raises InvalidInput (exit 2) when
        the lines do not resolve, the index does not answer, uv is missing, or the lock would
        not fit into the boot script's metadata value."""
        base = preset_lock(spec)
        if not spec.requirements or base is None:
            return None
        wanted = {
            **locks.header(
                spec.preset, spec.requirements, PYTHON_VERSION, spec.package_index, base.find_links
            ),
            "base": base.digest,
        }
        found = self._stored()
        if found is not None and dict(found.header) == wanted:
            _check_fits(spec, found, self.path)
            return found
        print(
            f"rayslice: resolving requirements into {self.path} "
            f"({'its header differs from this stack' if found else 'no lock yet'})",
            file=sys.stderr,
        )
        lock = resolve_beside(base, wanted)
        _check_fits(spec, lock, self.path)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path.write_text(lock.text)
        return lock

    def _stored(self) -> locks.Lock | None:
        if not self.path.exists():
            return None
        try:
            return locks.parse(self.path.read_text())
        except InvalidInput:
            return None  # not a lock (any more): resolved again and overwritten


def resolve_beside(base: locks.Lock, wanted: dict[str, str]) -> locks.Lock:
    """The lock of `wanted`'s header: `base`'s lines, then those of the packages its requirement
    lines add, resolved under `base`'s versions."""
    return _merged(base, _resolve(wanted, base), wanted)


def _resolve(wanted: dict[str, str], base: locks.Lock) -> locks.Lock:
    """The requirement lines resolved under the preset lock's versions (uv's ``--constraint``)."""
    uv = locks.uv_binary()
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp, "constraints.txt")
        constraints.write_text("".join(f"{pin}\n" for pin in base.pins()))
        try:
            return locks.compile_lock(uv, wanted, constraints)
        except InvalidInput as error:
            index = wanted["index"] or locks.PYPI_SIMPLE
            raise InvalidInput(
                f"{error}; fix the requirements (they are resolved with the {wanted['preset']} preset's "
                f"locked versions as constraints) or make the index {index} reachable from this machine"
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
