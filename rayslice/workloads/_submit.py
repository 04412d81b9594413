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
import os
import pkgutil
import re
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

from rayslice.errors import InvalidInput, JobFailed, NoCluster, NoCredentials
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

# How long `--max-restarts` waits for a cluster to be whole again after a node died.
REJOIN_TIMEOUT_S = 1800.0

# Subpackages a job never needs on the cluster: only the core and the workloads are staged.
NOT_SHIPPED = ("infra", "local", "startup_scripts", "__pycache__", "*.pyc")

# Packages that can offer a default cluster register a finder here (the simulator does), so
# `rayslice.workloads` never imports them.
CLUSTERS_GROUP = "rayslice.clusters"


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

    The simulator registers its finder under ``rayslice.clusters``; a client installed without
    the simulator has no such entry and gets None.
    """
    for entry in entry_points(group=CLUSTERS_GROUP):
        finder: Callable[[], tuple[str, Path | None] | None] = entry.load()
        if (found := finder()) is not None:
            return found
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
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(target.url, headers=auth_headers(target.token_file))
    except AuthenticationError as exc:
        given = f"the token in {target.token_file} was refused" if target.token_file else "no token was sent"
        raise NoCredentials(
            f"the Ray cluster at {target.url} uses token auth and {given}: pass --token-file F with the "
            f"cluster's token ({str(exc).splitlines()[0]})"
        ) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise NoCluster(f"no Ray cluster reachable at {target.url}: {exc}") from None


def submit(
    target_name: str,
    job_args: Sequence[str],
    *,
    address: str | None = None,
    token_file: Path | None = None,
    working_dir: str | None = None,
    max_restarts: int = 0,
    rejoin_timeout_s: float = REJOIN_TIMEOUT_S,
) -> str:
    """Submit, stream the logs until the job ends, and return its final status.

    With `max_restarts`, a job that failed because a node died (`node_death_reason`) is submitted
    again, up to that many times, once every slice the cluster had at the start is whole again.
    Raises `JobFailed` (exit 1) when the job ends in any other state than SUCCEEDED for good.
    """
    job = resolve(target_name, working_dir)
    target = choose_target(address, token_file)
    client = connect(target)
    command = " ".join([job.entrypoint, *map(shlex.quote, job_args)])
    baseline = cluster_shape(target) if max_restarts > 0 else None
    restarts = 0
    while True:
        with tempfile.TemporaryDirectory(prefix="rayslice-job-") as staging:
            job_id = client.submit_job(entrypoint=command, runtime_env=runtime_env(job, Path(staging)))
        print(f"rayslice: submitted {job_id} to {target.url}: {command}", file=sys.stderr, flush=True)
        try:
            return follow(client, job_id)
        except JobFailed as failure:
            if baseline is None or restarts >= max_restarts:
                raise
            text = f"{failure}\n{_job_logs(client, job_id)}"
            reason = node_death_reason(text)
            if reason is None:
                raise  # the job failed on its own: restarting would fail the same way
            restarts += 1
            print(
                f"rayslice: {failure}\nrayslice: a node died; waiting for every slice to be whole again",
                file=sys.stderr,
                flush=True,
            )
            wait_until_whole(target, baseline, rejoin_timeout_s, dead=dead_node_ids(text))
            print(f"restart {restarts} of {max_restarts} after {reason}", flush=True)


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


# ---- telling a node's death from a job's own failure (`--max-restarts`) -------------------------

# What Ray 2.60 writes when work was lost with its node, read from its own code: the core
# worker's task error (NodeDiedError, in _raylet.so), the GCS's actor death causes and its
# health check (gcs_server), and python/ray/exceptions.py. A job that fails with none of these in
# its message or the tail of its logs failed on its own.
NODE_DEATH_MARKERS = (
    "the node it was running on is dead or unavailable",
    "the actor's node was preempted",
    "the actor's node was terminated",
    "has missed too many heartbeats",
    "failed due to node preemption",
    "the task's local raylet died",
    "NodeDiedError",
    "LocalRayletDiedError",
)
LOG_TAIL_CHARS = 50_000


def node_death_reason(text: str) -> str | None:
    """The first line of `text` that says a node died (trimmed), or None if none does."""
    markers = [m.lower() for m in NODE_DEATH_MARKERS]
    for line in text.splitlines():
        if any(m in line.lower() for m in markers):
            line = line.strip()
            return line if len(line) <= 200 else line[:197] + "..."
    return None


# How Ray names a dead node in those messages ("node ID: <hex>", "node with node id: <hex>").
DEAD_NODE_ID = re.compile(r"node id: ([0-9a-f]{4,})\b", re.IGNORECASE)


def dead_node_ids(text: str) -> frozenset[str]:
    """The IDs of the nodes a failure says died: they must be gone before the cluster counts as whole."""
    return frozenset(match.lower() for match in DEAD_NODE_ID.findall(text))


def _job_logs(client: JobSubmissionClient, job_id: str) -> str:
    try:
        return str(client.get_job_logs(job_id))[-LOG_TAIL_CHARS:]
    except (RuntimeError, ConnectionError, OSError):
        return ""


@dataclass(frozen=True)
class ClusterShape:
    """What "whole" means for a cluster: its complete TPU slices and how many nodes were alive."""

    slices: frozenset[str]
    nodes: int
    alive: frozenset[str] = frozenset()  # the alive nodes' IDs


def cluster_nodes(target: Target) -> list[dict[str, Any]]:
    """The cluster's nodes from the dashboard's state API, in `ray.nodes()`'s shape."""
    import requests

    response = requests.get(
        f"{target.url}/api/v0/nodes",
        params={"detail": "1", "limit": "10000"},
        headers=auth_headers(target.token_file),
        timeout=10,
    )
    response.raise_for_status()
    return [
        {
            "NodeID": n["node_id"],
            "NodeManagerAddress": n["node_ip"],
            "Alive": n["state"] == "ALIVE",
            "Resources": n.get("resources_total") or {},
            "Labels": n.get("labels") or {},
        }
        for n in response.json()["data"]["result"]["result"]
    ]


def shape_of(nodes: Sequence[dict[str, Any]]) -> ClusterShape:
    from rayslice.workloads import _cluster

    complete = {s.name for s in _cluster.tpu_slices(_cluster.tpu_hosts(nodes)) if s.complete}
    alive = frozenset(str(n["NodeID"]).lower() for n in nodes if n["Alive"])
    return ClusterShape(frozenset(complete), len(alive), alive)


def cluster_shape(target: Target) -> ClusterShape:
    try:
        return shape_of(cluster_nodes(target))
    except (OSError, ValueError, KeyError) as exc:
        raise NoCluster(f"cannot read the nodes of {target.url}: {exc}") from None


def wait_until_whole(
    target: Target,
    baseline: ClusterShape,
    timeout_s: float,
    *,
    dead: frozenset[str] = frozenset(),
    poll_s: float = 5.0,
    settle: int = 2,
) -> None:
    """Block until every slice of `baseline` is complete, as many nodes are alive and none of the
    `dead` node IDs is, `settle` polls in a row. Ray lists a node that was just lost as alive until
    its health check gives up, so right after the failure the lost slice can still look whole."""
    deadline = time.monotonic() + timeout_s
    in_a_row = 0
    while True:
        try:
            now = shape_of(cluster_nodes(target))
        except (OSError, ValueError, KeyError):  # the head itself may be coming back
            now = ClusterShape(frozenset(), 0)
        whole = baseline.slices <= now.slices and now.nodes >= baseline.nodes and not dead & now.alive
        in_a_row = in_a_row + 1 if whole else 0
        if in_a_row >= settle:
            return
        if time.monotonic() > deadline:
            missing = ", ".join(sorted(baseline.slices - now.slices)) or "none"
            raise JobFailed(
                f"the cluster was not whole again after {timeout_s:.0f}s (incomplete slices: {missing}; "
                f"{now.nodes} of {baseline.nodes} nodes alive); not restarting"
            )
        time.sleep(poll_s)
