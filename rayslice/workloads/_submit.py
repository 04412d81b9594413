"""`rayslice run`: submit a bundled workload or a user's script as a Ray job and follow it.

The job goes through the Ray Jobs API (the head's dashboard port), so the client needs no Ray
node of its own. The runtime environment ships this copy of `rayslice` (core + workloads) with
`py_modules`, so cluster hosts need Ray and JAX/torch_xla but not rayslice itself; a user's
script is shipped with its directory as `working_dir`. Logs are streamed until the job ends and
its status becomes the exit status.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import difflib
import os
import pkgutil
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rayslice import cli
from rayslice.names import DASHBOARD_PORT
from rayslice.workloads import __path__ as WORKLOADS_PATH

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

EXIT_JOB_FAILED = 1
EXIT_NO_CLUSTER = 3


def workloads() -> dict[str, str]:
    """Bundled workload name -> the first line of its docstring (read without importing it)."""
    found = {}
    for module in sorted(pkgutil.iter_modules(WORKLOADS_PATH), key=lambda m: m.name):
        if module.name.startswith("_"):
            continue
        source = Path(WORKLOADS_PATH[0], f"{module.name}.py").read_text()
        doc = ast.get_docstring(ast.parse(source)) or ""
        found[module.name] = doc.splitlines()[0] if doc else ""
    return found


def default_address() -> tuple[str | None, Path | None]:
    """(Jobs API address, token file): RAY_ADDRESS if set, else the simulated cluster if one is up."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], None
    try:
        from rayslice.local.simulator import Simulation, SimulatorError
        from rayslice.local.state import default_state_dir
    except ImportError:  # the simulator is optional for a client that only talks to real clusters
        return None, None
    try:
        sim = Simulation.open(default_state_dir())
    except (SimulatorError, OSError, ValueError):
        return None, None
    token = sim.token_file
    return sim.dashboard_url(), token if token.exists() else None


def jobs_url(address: str) -> str:
    """Accept `http(s)://host:port`, `host:port` or a bare host (dashboard port 8265)."""
    if "://" in address:
        return address
    return f"http://{address}" if ":" in address else f"http://{address}:{DASHBOARD_PORT}"


def _stage_rayslice(into: Path) -> Path:
    """Copy the importable parts of rayslice a workload needs (core + workloads) into one package.

    The checkout maps `workloads/` onto `rayslice.workloads`, so the installed layout has to be
    assembled before `py_modules` can ship it; infra/, local/ and startup_scripts/ stay behind.
    """
    import rayslice

    package = into / "rayslice"
    shutil.copytree(Path(rayslice.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(WORKLOADS_PATH[0], package / "workloads", ignore=shutil.ignore_patterns("__pycache__"))
    return package


def _resolve(target: str) -> tuple[str, str | None]:
    """(entrypoint command without args, working dir or None) for a workload name or a script path."""
    if target.endswith(".py") or os.sep in target:
        script = Path(target)
        if not script.is_file():
            raise cli.UserError(f"no such script: {target}")
        return f"python {shlex.quote(script.name)}", str(script.resolve().parent)
    names = workloads()
    if target not in names:
        close = difflib.get_close_matches(target, names, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise cli.UserError(
            f"{target!r} is not a workload{hint}; `rayslice run --list` shows "
            f"them: {', '.join(names)}; a script path ends in .py"
        )
    return f"python -m rayslice.workloads.{target}", None


def _use_token(token_file: Path | None) -> None:
    """Ray's clients read the token from the environment (RAY_AUTH_MODE=token + a token path)."""
    if token_file is None:
        return
    if not token_file.is_file():
        raise cli.UserError(f"token file {token_file} does not exist")
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_file.resolve())


def submit(target: str, args: list[str], address: str | None, token_file: Path | None) -> int:
    """Submit, stream the logs, return 0 when the job succeeded and 1 otherwise."""
    entrypoint, working_dir = _resolve(target)
    found_address, found_token = default_address()
    address = address or found_address
    if address is None:
        raise cli.UserError(
            "no Ray cluster to submit to: start the simulated slice with "
            "`rayslice local up`, or pass --address http://HEAD:8265 "
            "(or set RAY_ADDRESS)",
            EXIT_NO_CLUSTER,
        )
    _use_token(token_file or found_token)
    from ray.job_submission import JobStatus, JobSubmissionClient

    url = jobs_url(address)
    try:
        client = JobSubmissionClient(url)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise cli.UserError(f"no Ray cluster reachable at {url}: {exc}", EXIT_NO_CLUSTER) from None
    with tempfile.TemporaryDirectory(prefix="rayslice-job-") as staging:
        runtime_env: dict[str, object] = {"py_modules": [str(_stage_rayslice(Path(staging)))]}
        if working_dir:
            runtime_env["working_dir"] = working_dir
        command = " ".join([entrypoint, *map(shlex.quote, args)])
        job_id = client.submit_job(entrypoint=command, runtime_env=runtime_env)
    print(f"rayslice: submitted {job_id} to {url}: {command}", file=sys.stderr, flush=True)
    asyncio.run(_stream(client, job_id))
    status = client.get_job_status(job_id)
    if status != JobStatus.SUCCEEDED:
        info = client.get_job_info(job_id)
        print(f"rayslice: job {job_id} {status.value}: {info.message or ''}".rstrip(), file=sys.stderr)
        return EXIT_JOB_FAILED
    return 0


async def _stream(client: JobSubmissionClient, job_id: str) -> None:
    async for lines in client.tail_job_logs(job_id):
        print(lines, end="", flush=True)


def _options() -> argparse.ArgumentParser:
    """The options `run` takes before or after WORKLOAD (anything after `--` goes to the job)."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--address",
        help="Ray Jobs API address, e.g. http://HEAD:8265 (default: "
        "RAY_ADDRESS, else the local simulated slice)",
    )
    options.add_argument(
        "--token-file",
        metavar="F",
        help="Ray auth token file, for clusters "
        "with token auth (the simulated slice's is found automatically)",
    )
    options.add_argument("--list", action="store_true", help="list the bundled workloads")
    return options


def _cmd_run(args: argparse.Namespace) -> int:
    split = args.rest.index("--") if "--" in args.rest else len(args.rest)
    job_args = args.rest[split + 1 :]
    args = _options().parse_args(args.rest[:split], namespace=args)
    if args.list:
        names = workloads()
        width = max(map(len, names))
        for name, summary in names.items():
            print(f"{name:<{width}}  {summary}")
        return 0
    if args.workload is None:
        raise cli.UserError("name a workload or a script (`rayslice run --list` shows the workloads)")
    token = Path(args.token_file) if args.token_file else None
    return submit(args.workload, job_args, args.address, token)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        parents=[_options()],
        help="run a bundled workload or your script on the Ray cluster",
        usage="rayslice run WORKLOAD|SCRIPT.py [--address A] [--token-file F] "
        "[-- JOB ARGS]  |  rayslice run --list",
        description="Submit a workload (or path/to/script.py) as a Ray job, stream "
        "its logs and exit with its status. Arguments after -- go to the job.",
    )
    p.add_argument("workload", nargs="?", help="workload name (see --list) or path/to/script.py")
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_run)
