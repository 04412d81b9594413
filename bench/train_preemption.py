"""Ray Train through a Spot preemption, next to a whole-job restart and a cold bring-up, in one run.

The cluster is the smallest that takes `jax_trainer` elastic between one and two slices: a CPU
head VM and two single-host v5litepod-8 Spot slices on TPU VMs (the real boot script on every
host, the recovery controller on its own VM). Two scenarios, each ``--repeats`` times, both
preempting slice 1 with ``rayslice local preempt --notice-s S`` (GCE's 30 s by default) once a
checkpoint of step `recovery.PREEMPT_AFTER_STEP` is saved, checkpoints every 10 steps:

* **elastic**: ``rayslice run jax_trainer -- --min-slices 1 --max-slices 2`` on both slices. On
  the notice the hosts' watchers drain their Ray nodes (the workers save a checkpoint at once) and
  stop Ray 10 s before the power-off; Ray Train goes on on slice 0, and grows back to both once
  the controller has recreated slice 1 and its host joined. The job is then stopped.
* **whole-job restart**: ``rayslice run jax_train --max-restarts 2`` on slice 1
  (`recovery.preempt_during_training`): the job fails with its node, `rayslice run` waits until
  the cluster is whole again and submits it again, and it resumes from its checkpoint.

Clocks, all in this process, from the preemption request (the notice): until the first step
trained on one slice and on two slices again (elastic), until the restarted job printed
``resumed from step K`` and until the slice's host rejoined (whole-job restart); the cold
bring-up (create, boot, every host joined) is the baseline. Steps lost: the steps trained before
the resize (or restart) that the attempt after it trains again.

Run as root (about five minutes a repeat)::

    .venv/bin/python bench/train_preemption.py [--notice-s 30] [--repeats 1] [--log FILE]
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from recovery import PREEMPT_AFTER_STEP, RAYSLICE, RESUMED, bring_up, preempt_during_training, stop_job, wait

from rayslice import cli, names
from rayslice import spec as spec_module
from rayslice.local.simulation import recording
from rayslice.local.simulation.simulator import Simulation
from rayslice.observability import goodput, history, record
from rayslice.workloads import jax_trainer

SPEC = {"platform": "tpu-vm", "acceleratorType": "v5litepod-8", "slices": 2, "capacity": "spot"}
CHECKPOINT_EVERY = 10
RESIZE_CHECK_S = 5
RUN_TIMEOUT_S = 600
# An upper bound on jax_train's speed on one simulated v5litepod-8 (49 steps/s measured here, far
# more than jax_trainer on two slices): the whole-job restart's run is long enough at this speed
# to be still training when Ray on its slice stops, within the notice.
JAX_TRAIN_MAX_STEPS_PER_S = 100
# jax_trainer's line at the start of each attempt, and the step line both training jobs print.
ATTEMPT = re.compile(r"workers (\d+), devices (\d+), from step (\d+)$")
STEP = re.compile(r"step +(\d+) +loss ([0-9.]+)$")


@dataclass(frozen=True)
class Elastic:
    """One preemption of an elastic jax_trainer run; seconds from the preemption request."""

    steps_lost: int
    one_slice_s: float  # the first step trained on the surviving slice
    two_slices_s: float  # the first step trained on both slices again
    # The run's goodput from the cluster's record (`rayslice goodput`), and the steps its log
    # says were trained again at every resumption (the shrink's and the grow-back's).
    goodput: goodput.Report | None = field(default=None, repr=False)  # printed whole by `report`
    steps_lost_in_log: int = 0


@dataclass(frozen=True)
class Restart:
    """One preemption under `rayslice run --max-restarts`; seconds from the preemption request."""

    steps_lost: int
    training_s: float  # the restarted job resumed from its checkpoint
    rejoined_s: float  # every host of the slice an alive Ray node again


class Output:
    """A process's stdout, each line with the monotonic time it arrived."""

    def __init__(self, process: subprocess.Popen[str]):
        self.lines: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self.thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def steps_lost(before: Sequence[str], resumed_from: int) -> int:
    """Steps trained before a resize or restart (`before`: the output up to it) that the next
    attempt, resuming from step `resumed_from`, trains again."""
    trained = [int(m.group(1)) for line in before if (m := STEP.search(line))]
    return max(0, max(trained, default=-1) + 1 - resumed_from)


def first_step_of_attempt(
    lines: Sequence[tuple[float, str]], workers: int, start: int = 0
) -> tuple[int, float] | None:
    """Where in `lines` (from `start`) an attempt on `workers` workers began, and when its first
    step line arrived; None while there is none yet."""
    for i in range(start, len(lines)):
        attempt = ATTEMPT.search(lines[i][1])
        if attempt and int(attempt.group(1)) == workers:
            step = next((t for t, line in lines[i + 1 :] if STEP.search(line)), None)
            return (i, step) if step is not None else None
    return None


def _saved_steps(run: Path) -> list[int]:
    """jax_trainer's committed checkpoints in `run` (orbax renames a save when it is complete)."""
    return [jax_trainer.checkpoint_step(p.name) for p in run.glob("step_*") if p.name[5:].isdigit()]


def _job_env(sim: Simulation) -> dict[str, str]:
    """`rayslice run`'s environment: the job is recorded in the simulation's record (`RECORD_ENV`),
    whose goodput the report shows."""
    env = {"PATH": str(Path(sys.executable).parent), "HOME": os.environ.get("HOME", "/root")}
    env[record.RECORD_ENV] = recording.location(sim)
    return env | ({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})


SUBMITTED = re.compile(r"rayslice: submitted (\S+) to ")


def lost_at_every_resumption(lines: Sequence[str]) -> int:
    """The steps trained again at each resumption of a Ray Train job, summed, from its log."""
    lost = 0
    for i, line in enumerate(lines):
        if (attempt := ATTEMPT.search(line)) and i > 0:
            lost += steps_lost(lines[:i], int(attempt.group(3)))
    return lost


def recorded_goodput(sim: Simulation, output: str) -> goodput.Report | None:
    """The goodput of the run whose `rayslice run` output is `output`, from the simulation's
    record and its controller's event log."""
    submitted = SUBMITTED.search(output)
    if submitted is None:
        return None
    rec = recording.cluster_record(sim)
    runs = [
        r
        for r in history.training_runs(record.jobs(rec.bucket, rec.prefix))
        if r.job_id == submitted.group(1)
    ]
    return history.run_goodput(runs[0], recording.controller_events(sim)) if runs else None


def _preempt(sim: Simulation, victim: str, notice_s: float) -> tuple[float, threading.Thread, list[int]]:
    """Start `rayslice local preempt` (it returns once the hosts are off); its start time."""
    argv = ["local", "preempt", "--state-dir", str(sim.state_dir), "--notice-s", str(notice_s), victim]
    outcome: list[int] = []
    command = threading.Thread(target=lambda: outcome.append(cli.main(argv)))
    start = time.monotonic()
    command.start()
    return start, command, outcome


def elastic_preemption(
    sim: Simulation, storage: Path, name: str, notice_s: float, log: Path | None = None
) -> Elastic:
    """The elastic scenario once. The job's output is appended to `log`, if given."""
    spec = sim.spec()
    hosts, victim = spec.tpu.hosts, spec.slice_name(1)
    argv = [RAYSLICE, "run", "jax_trainer", "--address", sim.dashboard_url()]
    if sim.token_file.exists():
        argv += ["--token-file", str(sim.token_file)]
    argv += ["--", "--steps", "1000000", "--checkpoint-every", str(CHECKPOINT_EVERY), "--min-slices", "1"]
    argv += ["--max-slices", "2", "--resize-check-s", str(RESIZE_CHECK_S), "--storage-path", str(storage)]
    argv += ["--name", name]
    job = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_job_env(sim)
    )
    out = Output(job)
    try:
        wait(
            lambda: (
                job.poll() is not None or max(_saved_steps(storage / name), default=0) >= PREEMPT_AFTER_STEP
            ),
            RUN_TIMEOUT_S,
            f"a checkpoint of step {PREEMPT_AFTER_STEP} on both slices",
        )
        if job.poll() is not None:
            raise RuntimeError(f"jax_trainer ended before step {PREEMPT_AFTER_STEP}:\n{out.text()}")
        cut = len(out.lines)
        start, command, outcome = _preempt(sim, victim, notice_s)
        wait(
            lambda: job.poll() is not None or first_step_of_attempt(out.lines, hosts, cut) is not None,
            RUN_TIMEOUT_S,
            "training on the surviving slice",
        )
        found = first_step_of_attempt(out.lines, hosts, cut)
        if found is None:
            raise RuntimeError(f"jax_trainer ended instead of shrinking:\n{out.text()}")
        shrink_at, one_slice = found
        wait(
            lambda: (
                job.poll() is not None or first_step_of_attempt(out.lines, 2 * hosts, shrink_at) is not None
            ),
            RUN_TIMEOUT_S,
            "training on both slices again",
        )
        grown = first_step_of_attempt(out.lines, 2 * hosts, shrink_at)
        if grown is None:
            raise RuntimeError(f"jax_trainer ended instead of growing back:\n{out.text()}")
        command.join()
        if outcome != [0]:
            raise RuntimeError(f"rayslice local preempt {victim} failed")
    except BaseException:
        print(out.text()[-6000:], file=sys.stderr)  # what the job said, to tell why
        raise
    finally:
        if job.poll() is None:
            stop_job(sim, "jax_trainer")
            try:
                job.wait(timeout=120)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()
        out.thread.join(timeout=10)
        if log is not None:
            with log.open("a") as file:
                file.write(f"---- jax_trainer {name}\n{out.text()}\n")
    attempt = ATTEMPT.search(out.lines[shrink_at][1])
    assert attempt is not None
    lost = steps_lost([line for _, line in out.lines[:shrink_at]], int(attempt.group(3)))
    report = recorded_goodput(sim, out.text())
    in_log = lost_at_every_resumption([line for _, line in out.lines])
    return Elastic(lost, one_slice - start, grown[1] - start, report, in_log)


def restart_preemption(
    sim: Simulation, checkpoints: Path, notice_s: float, log: Path | None = None
) -> Restart:
    """The whole-job restart once; the job's output is appended to `log`, if given."""
    steps = PREEMPT_AFTER_STEP + math.ceil(JAX_TRAIN_MAX_STEPS_PER_S * (notice_s + 30))
    trace = preempt_during_training(sim, checkpoints, steps=steps, notice_s=notice_s)
    if log is not None:
        with log.open("a") as file:
            file.write(f"---- jax_train --max-restarts\n{trace.output}{trace.stderr}\n")
    if trace.returncode != 0 or not trace.resumed_at:
        raise RuntimeError(
            f"the job did not recover (exit {trace.returncode}):\n{trace.output}{trace.stderr}"
        )
    before, _, _ = trace.output.partition("resumed from step")
    [resumed] = {int(k) for k in RESUMED.findall(trace.output)}
    return Restart(
        steps_lost(before.splitlines(), resumed),
        trace.resumed_at - trace.preempted_at,
        trace.rejoined_at - trace.preempted_at,
    )


def report(
    cold_s: float, elastic: Sequence[Elastic], restart: Sequence[Restart], notice_s: float, date: str
) -> str:
    rows = [
        ("cold bring-up (create, boot, every host joined)", [cold_s]),
        ("elastic: preemption -> training on 1 slice", [e.one_slice_s for e in elastic]),
        ("elastic: preemption -> training on 2 slices", [e.two_slices_s for e in elastic]),
        ("whole-job restart: preemption -> training again", [r.training_s for r in restart]),
        ("whole-job restart: preemption -> host rejoined", [r.rejoined_s for r in restart]),
    ]
    lines = [
        "Ray Train through a Spot preemption, simulator: head VM + 2 x v5litepod-8 Spot (tpu-vm),",
        f"notice {notice_s:g} s, checkpoint every {CHECKPOINT_EVERY} steps, {len(elastic)} repeat(s), {date}",
        f"{'':50} {'seconds':>8}  {'of cold bring-up':>16}  (median, range)",
    ]
    for label, values in rows:
        median = statistics.median(values)
        spread = f"  ({min(values):.1f}-{max(values):.1f})" if len(values) > 1 else ""
        lines.append(f"{label:50} {median:8.1f}  {median / cold_s:16.2f}{spread}")
    lost_e = statistics.median(e.steps_lost for e in elastic)
    lost_r = statistics.median(r.steps_lost for r in restart)
    lines.append(f"{'steps lost: elastic / whole-job restart':50} {lost_e:8g} / {lost_r:g}")
    ratio = statistics.median(r.training_s for r in restart) / statistics.median(
        e.one_slice_s for e in elastic
    )
    lines.append(f"{'training again: whole-job restart / elastic':50} {ratio:8.1f} x")
    for index, run in enumerate(elastic):
        if run.goodput is not None:
            title = f"\nelastic run {index + 1}, from the cluster's record (`rayslice goodput`):"
            lines.append(goodput.format_report(run.goodput, title))
            lines.append(
                f"steps lost: {run.goodput.steps_lost} in the goodput report, {run.steps_lost_in_log} "
                "in the job's log (every resumption)"
            )
    return "\n".join(lines)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--notice-s",
        type=float,
        default=names.PREEMPTION_NOTICE_S,
        help="seconds from the preemption notice to the power-off (GCE's: 30)",
    )
    parser.add_argument("--repeats", type=positive, default=1, help="preemptions of each kind")
    parser.add_argument("--log", type=Path, help="append each job's output to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    spec = spec_module.load(dict(SPEC), require_zone=False)
    elastic: list[Elastic] = []
    restart: list[Restart] = []
    with tempfile.TemporaryDirectory(prefix="rayslice-bench-") as tmp:
        sim, cold = bring_up(spec, Path(tmp) / "sim")
        try:
            # In the simulation's shared folder: every host writes and reads it (`Plan.shared_dir`).
            storage = Path(tempfile.mkdtemp(prefix="train-", dir=sim.plan.shared_dir))
            for repeat in range(args.repeats):
                elastic.append(elastic_preemption(sim, storage, f"elastic-{repeat}", args.notice_s, args.log))
                print(f"repeat {repeat + 1}: {elastic[-1]}", flush=True)
                checkpoints = storage / f"restart-{repeat}"
                checkpoints.mkdir()
                restart.append(restart_preemption(sim, checkpoints, args.notice_s, args.log))
                print(f"repeat {repeat + 1}: {restart[-1]}", flush=True)
        finally:
            sim.destroy()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(report(cold, elastic, restart, args.notice_s, date))
    return 0


if __name__ == "__main__":
    sys.exit(main())
