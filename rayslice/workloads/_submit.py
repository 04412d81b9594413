"""Submitting a bundled workload or a user's script as a Ray job (the work behind `rayslice run`).

The job goes through the Ray Jobs API (the head's dashboard port), so the client needs no Ray
node of its own. The runtime environment ships this copy of `rayslice` (core + workloads, staged
into a temporary folder) with `py_modules`, so cluster hosts need Ray and JAX/torch_xla but not
rayslice itself. A user's script travels with its folder as `working_dir`, minus
`DEFAULT_EXCLUDES` and whatever the folder's `.rayignore` / `.gitignore` list (Ray reads those
two itself), because a folder next to a script often also holds a venv, the simulator's state
and its token, or the user's keys.

The token question is answered by where the address came from: the simulated slice's token goes
to the simulated slice only; an address the user names gets the token file the user names (or
whatever Ray's own `RAY_AUTH_*` variables say), never the simulator's.
"""

from __future__ import annotations

import ast
import asyncio
import difflib
import importlib
import os
import pkgutil
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayslice.errors import InvalidInput, JobFailed, NoCluster
from rayslice.names import DASHBOARD_PORT
from rayslice.workloads import __path__ as WORKLOADS_PATH

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

# gitignore-style patterns (Ray's `excludes`) never uploaded from a working dir: version control,
# virtual environments, the simulator's state, caches, and files that commonly hold secrets.
DEFAULT_EXCLUDES = (
    ".git",
    ".venv",
    "venv",
    ".state",
    "__pycache__",
    ".env",
    ".env.*",
    ".ray",
    "ray-token",
    "*_token",
    "*-token",
    "*.pem",
    "*.key",
    "id_rsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "application_default_credentials.json",
    ".config",
    ".ssh",
    ".gnupg",
    ".netrc",
)

# Subpackages a job never needs on the cluster: only the core and the workloads are staged.
NOT_SHIPPED = ("infra", "local", "startup_scripts", "__pycache__", "*.pyc")

# The entry point that, when the simulator is installed, names the module offering its cluster.
# Going through the registry keeps `rayslice.workloads` free of any import of `rayslice.local`.
SIMULATOR_COMMAND = "local"
COMMANDS_GROUP = "rayslice.commands"


def workloads() -> dict[str, str]:
    """Bundled workload name -> the first line of its docstring (read without importing it)."""
    found = {}
    for module in sorted(pkgutil.iter_modules(WORKLOADS_PATH), key=lambda m: m.name):
        if module.name.startswith("_") or module.name == "commands":
            continue
        source = Path(WORKLOADS_PATH[0], f"{module.name}.py").read_text()
        doc = ast.get_docstring(ast.parse(source)) or ""
        found[module.name] = doc.splitlines()[0] if doc else ""
    return found


@dataclass(frozen=True)
class Target:
    """Where a job will go: the Jobs API URL, the token file for it (if any), and how it was found."""

    url: str
    token_file: Path | None
    source: str  # "--address", "RAY_ADDRESS" or "simulator"


def jobs_url(address: str) -> str:
    """Accept `http(s)://host:port`, `host:port` or a bare host (dashboard port 8265)."""
    if "://" in address:
        return address.rstrip("/")
    return f"http://{address}" if ":" in address else f"http://{address}:{DASHBOARD_PORT}"


def simulated_cluster() -> tuple[str, Path | None] | None:
    """(dashboard URL, token file) of the simulated slice in the default state dir, if one is up.

    The simulator offers it through `default_cluster()` in the module its `local` command is
    registered from; a client installed without the simulator has no such entry and gets None.
    """
    for entry in entry_points(group=COMMANDS_GROUP, name=SIMULATOR_COMMAND):
        finder: Callable[[], tuple[str, Path | None] | None] | None = getattr(
            importlib.import_module(entry.module), "default_cluster", None
        )
        if finder is not None:
            return finder()
    return None


def choose_target(address: str | None, token_file: Path | None) -> Target:
    """--address, else RAY_ADDRESS, else the simulated slice; its token only in the last case."""
    if address:
        return Target(jobs_url(address), token_file, "--address")
    if os.environ.get("RAY_ADDRESS"):
        return Target(jobs_url(os.environ["RAY_ADDRESS"]), token_file, "RAY_ADDRESS")
    found = simulated_cluster()
    if found is None:
        raise NoCluster(
            "no Ray cluster to submit to: start the simulated slice with `rayslice local up`, "
            "or pass --address http://HEAD:8265 (or set RAY_ADDRESS)"
        )
    url, simulator_token = found
    return Target(url, token_file or simulator_token, "simulator")


@dataclass(frozen=True)
class Job:
    """What to run and what to upload: entrypoint command (without job args) and the working dir."""

    entrypoint: str
    working_dir: Path | None


def resolve(target: str, working_dir: str | None = None) -> Job:
    """A workload name or a script path -> the job; refuses folders that must not be uploaded."""
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
        return Job(f"python -m rayslice.workloads.{target}", None)
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
    if folder in (home, Path(folder.anchor)):
        raise InvalidInput(
            f"refusing to upload {folder} as the job's working dir: it holds your credentials and "
            "everything else in it. Move the script into its own folder, or pass --working-dir "
            "with a folder that holds only what the job needs."
        )
    return Job(f"python {shlex.quote(str(script.relative_to(folder)))}", folder)


def stage_rayslice(into: Path) -> Path:
    """Copy the parts of this rayslice a job imports (core + workloads) into `into`/rayslice.

    Works the same from a checkout, an editable install and a wheel: the source is the package
    that is imported, and the platform packages (`NOT_SHIPPED`) stay behind.
    """
    import rayslice

    package = into / "rayslice"
    shutil.copytree(
        Path(rayslice.__file__).resolve().parent, package, ignore=shutil.ignore_patterns(*NOT_SHIPPED)
    )
    return package


def runtime_env(job: Job, staging: Path) -> dict[str, Any]:
    """The job's runtime environment: the staged rayslice and, for a script, its filtered folder."""
    env: dict[str, Any] = {"py_modules": [str(stage_rayslice(staging))]}
    if job.working_dir is not None:
        env["working_dir"] = str(job.working_dir)
        env["excludes"] = list(DEFAULT_EXCLUDES)
    return env


def auth_headers(token_file: Path | None) -> dict[str, str]:
    """The Authorization header for a token file; none without one (Ray's own env then applies)."""
    if token_file is None:
        return {}
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise InvalidInput(f"cannot read token file {token_file}: {exc.strerror}") from None
    if not token:
        raise InvalidInput(f"token file {token_file} is empty")
    return {"Authorization": f"Bearer {token}"}


def connect(target: Target) -> JobSubmissionClient:
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(target.url, headers=auth_headers(target.token_file))
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise NoCluster(f"no Ray cluster reachable at {target.url}: {exc}") from None


def submit(
    target_name: str,
    job_args: Sequence[str],
    *,
    address: str | None = None,
    token_file: Path | None = None,
    working_dir: str | None = None,
) -> str:
    """Submit, stream the logs until the job ends, and return its final status.

    Raises `JobFailed` (exit 1) when the job ends in any other state than SUCCEEDED.
    """
    job = resolve(target_name, working_dir)
    target = choose_target(address, token_file)
    client = connect(target)
    command = " ".join([job.entrypoint, *map(shlex.quote, job_args)])
    with tempfile.TemporaryDirectory(prefix="rayslice-job-") as staging:
        job_id = client.submit_job(entrypoint=command, runtime_env=runtime_env(job, Path(staging)))
    print(f"rayslice: submitted {job_id} to {target.url}: {command}", file=sys.stderr, flush=True)
    return follow(client, job_id)


def follow(client: JobSubmissionClient, job_id: str) -> str:
    """Stream a job's logs; return "SUCCEEDED" or raise `JobFailed` with Ray's message."""
    from ray.job_submission import JobStatus

    asyncio.run(_stream(client, job_id))
    status = client.get_job_status(job_id)
    while not status.is_terminal():  # the log stream can close a moment before the status settles
        time.sleep(0.2)
        status = client.get_job_status(job_id)
    if status != JobStatus.SUCCEEDED:
        info = client.get_job_info(job_id)
        raise JobFailed(f"job {job_id} {status.value}: {info.message or ''}".rstrip())
    return str(status.value)


async def _stream(client: JobSubmissionClient, job_id: str) -> None:
    async for lines in client.tail_job_logs(job_id):
        print(lines, end="", flush=True)
