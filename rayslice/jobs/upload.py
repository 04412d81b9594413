"""What a job runs and what travels with it: the entrypoint, a script's folder, and the rayslice
modules the bundled workloads import.

The job goes through the Ray Jobs API, so its runtime environment carries everything the hosts
need beyond Ray and JAX/torch_xla: the rayslice modules in `SHIPPED` (the workloads and the part
of the core they import, written out by `rayslice.shipping` into a temporary folder that Ray
ships as `py_modules`), and for a user's script a copy of the files `working_dir.select` lets
go from its folder, because a folder next to a script often also holds a venv, the simulator's
state and its token, the user's keys, or a link to them.
"""

from __future__ import annotations

import ast
import difflib
import os
import pkgutil
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayslice import shipping
from rayslice.errors import InvalidInput
from rayslice.jobs import working_dir as folders
from rayslice.workloads import __path__ as WORKLOADS_PATH

# The workloads' import closure inside rayslice: every job ships exactly these (checked by
# tests/jobs/test_upload.py), so the Pulumi program, the simulator, the recovery controller and
# the CLI never ride along to a cluster host.
SHIPPED = (
    "rayslice/__init__.py",
    "rayslice/catalog.py",
    "rayslice/errors.py",
    "rayslice/names.py",
    "rayslice/workloads/__init__.py",
    "rayslice/workloads/_cluster.py",
    "rayslice/workloads/_jax_hosts.py",
    "rayslice/workloads/_lm_data.py",
    "rayslice/workloads/jax_lm.py",
    "rayslice/workloads/jax_multihost.py",
    "rayslice/workloads/jax_multislice.py",
    "rayslice/workloads/jax_single_host.py",
    "rayslice/workloads/jax_train.py",
    "rayslice/workloads/jax_trainer.py",
    "rayslice/workloads/slice_check.py",
    "rayslice/workloads/xla_multi_device.py",
    "rayslice/workloads/xla_multihost.py",
    "rayslice/workloads/xla_single.py",
    "rayslice/workloads/xla_train.py",
)


# A single-host job's module sets this to the job to run on a multi-host slice instead.
MULTIHOST_COUNTERPART = "MULTIHOST_COUNTERPART"


@dataclass(frozen=True)
class Workload:
    """A bundled workload as its module describes it, read without importing it (that needs Ray)."""

    summary: str  # the first line of its docstring
    multihost_counterpart: str | None  # set for a job that runs on one host of a single-host slice


def workloads() -> dict[str, Workload]:
    """Every bundled workload by name, read from its module's source."""
    found = {}
    for module in sorted(pkgutil.iter_modules(WORKLOADS_PATH), key=lambda m: m.name):
        if module.name.startswith("_"):
            continue
        tree = _parse(Path(WORKLOADS_PATH[0], f"{module.name}.py").read_text())
        doc = ast.get_docstring(tree) or ""
        summary = doc.splitlines()[0] if doc else ""
        found[module.name] = Workload(summary, _constant(tree, MULTIHOST_COUNTERPART))
    return found


def _parse(source: str, attempts: int = 3) -> ast.Module:
    """`ast.parse`, again when CPython 3.11 says "AST constructor recursion depth mismatch": its
    AST builder keeps one recursion counter for the whole interpreter, so a parse that overlaps
    one in another thread (a Pulumi program importing modules, say) can fail spuriously
    (python/cpython#106905, fixed in 3.12). A source that cannot be parsed fails every time."""
    for _ in range(attempts - 1):
        try:
            return ast.parse(source)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
    return ast.parse(source)


def _constant(tree: ast.Module, name: str) -> str | None:
    """The string a module assigns to `name` at its top level, if it does."""
    for statement in tree.body:
        if (
            isinstance(statement, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in statement.targets)
            and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str)
        ):
            return statement.value.value
    return None


@dataclass(frozen=True)
class Job:
    """What to run and what to upload: entrypoint command (without job args), the working dir and
    the files selected from it; for a bundled workload, its name and, for a single-host one, the
    job for a multi-host slice."""

    entrypoint: str
    working_dir: Path | None
    files: folders.Selection | None = None
    workload: str | None = None
    multihost_counterpart: str | None = None


def resolve(target: str, working_dir: str | None = None) -> Job:
    """A workload name or a script path -> the job; refuses folders that must not be uploaded and
    selects what goes from the one that may (`working_dir.select`)."""
    if not (target.endswith(".py") or os.sep in target):
        if working_dir is not None:
            raise InvalidInput("--working-dir is for scripts; a bundled workload uploads no folder")
        names = workloads()
        if target not in names:
            close = difflib.get_close_matches(target, names, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise InvalidInput(
                f"{target!r} is not a workload{hint}; `rayslice run --list` shows "
                f"them: {', '.join(names)}; a script path ends in .py"
            )
        return Job(
            f"python -m rayslice.workloads.{target}",
            None,
            workload=target,
            multihost_counterpart=names[target].multihost_counterpart,
        )
    script = Path(target)
    if not script.is_file():
        raise InvalidInput(f"no such script: {target}")
    script = script.resolve()
    folder = Path(working_dir).resolve() if working_dir is not None else script.parent
    if not folder.is_dir():
        raise InvalidInput(f"--working-dir {working_dir}: no such directory")
    if not script.is_relative_to(folder):
        raise InvalidInput(f"{target} is not inside --working-dir {folder}; the job could not find it")
    home = Path.home().resolve()
    if home.is_relative_to(folder):  # the home folder, one of its ancestors, or /
        raise InvalidInput(
            f"refusing to upload {folder} as the job's working dir: it holds your home folder "
            f"({home}) with your credentials and everything else in it. Move the script into its "
            "own folder, or pass --working-dir with a folder that holds only what the job needs."
        )
    return Job(f"python {shlex.quote(str(script.relative_to(folder)))}", folder, folders.select(folder))


def runtime_env(job: Job, staging: Path) -> dict[str, Any]:
    """The job's runtime environment: `SHIPPED` written under `staging` and, for a script, a copy
    of its selected files (what Ray packs, so its packer cannot reach anything else)."""
    env: dict[str, Any] = {"py_modules": [str(shipping.write_tree(SHIPPED, staging))]}
    if job.files is not None:
        env["working_dir"] = str(folders.copy(job.files, staging / "working_dir"))
    return env
