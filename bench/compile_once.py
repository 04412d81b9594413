"""Time to the first step of a resubmitted job, with the cluster's compilation cache, against
the job's first attempt, in one run on one simulated slice.

Every host's Ray hands its jobs JAX's persistent compilation cache in the simulation's shared
folder (`rayslice.compilation_cache`; a bucket on the cloud). The bundled training job
(``jax_train``, submitted with ``rayslice run`` as a user would) is run in pairs on one booted
slice: a **first attempt** against an emptied cache, which compiles its steps and writes them
there, then the same job **resubmitted**, as after a preemption, which finds them. Each attempt
is timed from the moment ``rayslice run`` starts to the first ``step N loss`` line it prints (the
step line comes after the step ran); the job's own part of it, from its first printed line to
that step line, is timed as well. The pairs are repeated (``--repeats``) and their medians
printed with the ratio resubmitted / first attempt. The job's arguments follow ``--``.

Run as root (a few minutes)::

    .venv/bin/python bench/compile_once.py [--accelerator-type v5p-16] [--platform tpu-vm] \
        [--repeats 3] [-- --steps 3]
"""

from __future__ import annotations

import argparse
import datetime
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from recovery import RAYSLICE, alive_nodes, wait

from rayslice import compilation_cache
from rayslice import spec as spec_module
from rayslice.compilation_cache.fill import entries
from rayslice.local.simulation.simulator import Simulation

BRING_UP_TIMEOUT_S = 600
RUN_TIMEOUT_S = 600
STEP_LINE = re.compile(r"^step +\d+ +loss")


@dataclass(frozen=True)
class Attempt:
    to_first_step: float  # seconds from `rayslice run` to the first step line
    job_to_first_step: float  # seconds from the job's first printed line to it
    added: int  # cache entries the attempt wrote


def attempt(sim: Simulation, location: str, job_args: list[str]) -> Attempt:
    """One `rayslice run jax_train`, read as it streams, to its end."""
    argv = [RAYSLICE, "run", "jax_train", "--address", sim.dashboard_url()]
    if sim.token_file.exists():
        argv += ["--token-file", str(sim.token_file)]
    before = entries(location)
    start = time.monotonic()
    run = subprocess.Popen([*argv, "--", *job_args], stdout=subprocess.PIPE, text=True)
    first_line = first_step = None
    lines = []
    assert run.stdout is not None
    for line in run.stdout:
        lines.append(line)
        now = time.monotonic()
        first_line = first_line or now
        if first_step is None and STEP_LINE.match(line):
            first_step = now
    if run.wait(timeout=RUN_TIMEOUT_S) != 0 or first_step is None or first_line is None:
        raise RuntimeError(f"jax_train failed or printed no step:\n{''.join(lines)[-3000:]}")
    return Attempt(first_step - start, first_step - first_line, len(entries(location) - before))


def report(
    pairs: list[tuple[Attempt, Attempt]], accelerator_type: str, job_args: list[str], date: str
) -> str:
    """The table the benchmark prints (and docs/benchmarks.md records): medians over the pairs."""
    firsts, again = [p[0] for p in pairs], [p[1] for p in pairs]

    def median(values: list[Attempt], field: str) -> float:
        return statistics.median(getattr(a, field) for a in values)

    lines = [
        f"{date}: simulated {accelerator_type}, jax_train {' '.join(job_args)}; "
        f"medians of {len(pairs)} pairs",
        "",
        "| attempt | to first step s | x first attempt | job's own s | x first attempt | entries written |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    base_total, base_job = median(firsts, "to_first_step"), median(firsts, "job_to_first_step")
    for label, values in (("first attempt (cache emptied)", firsts), ("resubmitted (cache filled)", again)):
        total, job = median(values, "to_first_step"), median(values, "job_to_first_step")
        written = "/".join(str(a.added) for a in values)
        lines.append(
            f"| {label} | {total:.2f} | {total / base_total:.2f} | {job:.2f} "
            f"| {job / base_job:.2f} | {written} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--accelerator-type", default="v5p-16")
    parser.add_argument("--platform", default="tpu-vm")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("job_args", nargs="*", help="jax_train's arguments, after --")
    args = parser.parse_args(argv)
    job_args = args.job_args or ["--steps", "3"]
    spec = spec_module.load(
        {"acceleratorType": args.accelerator_type, "platform": args.platform}, require_zone=False
    )
    with tempfile.TemporaryDirectory(prefix="bench-compile-once-") as tmp:
        sim = Simulation.create(spec, Path(tmp) / "sim")
        try:
            sim.boot_all()
            wait(lambda: len(alive_nodes(sim)) == spec.total_hosts, BRING_UP_TIMEOUT_S, "bring-up")
            location = compilation_cache.folder_location(sim.plan.shared_dir)
            pairs = []
            for repeat in range(args.repeats):
                shutil.rmtree(location, ignore_errors=True)
                pair = (attempt(sim, location, job_args), attempt(sim, location, job_args))
                pairs.append(pair)
                print(f"pair {repeat + 1}: {pair}", flush=True)
        finally:
            sim.destroy()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print("\n" + report(pairs, spec.accelerator_type, job_args, date))
    return 0


if __name__ == "__main__":
    sys.exit(main())
