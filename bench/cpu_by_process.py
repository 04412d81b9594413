"""CPU-seconds by kind of process while a command runs: where a loaded machine's time goes.

On the 2-core machine the suite is CPU-bound (dev/suite-timings.md): its three pytest workers,
every simulated host's Ray and the jobs they run share two cores, so a test's wall time follows
the CPU everything else uses. `--durations` says which tests are long, not what costs the CPU.
This runs a command and samples /proc every `--interval` seconds meanwhile, adding each
process's user and system time to its kind: Ray's daemons by name, Ray's workers by the title
Ray gives them (``ray::IDLE``, ``ray::JobSupervisor``, ``ray::RayTrainWorker`` ...), rayslice's
simulator processes, pytest, installers, and anything else by its command name. The machine's
whole busy time is printed beside the sum: the difference is what ran between two samples and
was gone by the second, and the CPU of the processes already running when the command started
counts from then.

    python bench/cpu_by_process.py [--interval S] [--json] -- COMMAND [ARG ...]

For example, the suite as scripts/test.sh runs it:
``python bench/cpu_by_process.py -- .venv/bin/python -m pytest -n 3 -p no:cacheprovider``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# The first pattern that matches a process's command line names its kind.
KINDS = (
    (re.compile(r"^ray::(\w+)"), r"ray worker: \1"),
    (re.compile(r"default_worker\.py"), "ray worker: starting"),
    (re.compile(r"dashboard/agent\.py"), "ray: dashboard agent"),
    (re.compile(r"runtime_env/agent"), "ray: runtime env agent"),
    (re.compile(r"dashboard/dashboard\.py"), "ray: dashboard"),
    (re.compile(r"^ray-dashboard-"), "ray: dashboard modules"),
    (re.compile(r"log_monitor\.py"), "ray: log monitor"),
    (re.compile(r"autoscaler/_private/monitor\.py"), "ray: autoscaler monitor"),
    (re.compile(r"setup_worker\.py"), "ray: runtime env setup"),
    (re.compile(r"bin/ray (start|stop|status)"), "ray: command line"),
    (re.compile(r"-m rayslice\.workloads\.(\w+)"), r"job driver: \1"),
    (re.compile(r"-m (rayslice\.local\.[\w.]+)"), r"simulator: \1"),
    (re.compile(r"bin/rayslice run"), "rayslice run"),
    (re.compile(r"bin/rayslice "), "rayslice (other commands)"),
    # A pytest-xdist worker is execnet's bootstrap, which names neither.
    (re.compile(r"pytest|execnet|xdist|exec\(eval\(sys\.stdin\.readline\(\)\)\)"), "pytest"),
    (re.compile(r"\buv\b"), "installer: uv"),
    (re.compile(r"-m pip\b|bin/pip\b"), "installer: pip"),
)
# Native daemons are known by their command name.
NATIVE = {"raylet": "ray: raylet", "gcs_server": "ray: gcs server"}


def kind(comm: str, cmdline: str) -> str:
    """The kind a process's CPU counts to."""
    if comm in NATIVE:
        return NATIVE[comm]
    for pattern, name in KINDS:
        match = pattern.search(cmdline)
        if match:
            return match.expand(name)
    return f"other: {comm}"


@dataclass
class _Seen:
    kind: str
    comm: str
    first_ticks: int
    last_ticks: int
    cmdline: str  # as first seen: a Ray worker's still names its node, before its title hides it
    kinds: list[str]  # every kind it had, in order

    @property
    def cpu_s(self) -> float:
        return (self.last_ticks - self.first_ticks) / TICKS_PER_S


@dataclass
class Tally:
    """Each process's CPU since it was first seen (since its start, if it started after the first
    sample), under the last kind it had: a Ray worker changes its title as it takes tasks."""

    proc: Path = Path("/proc")
    seen: dict[tuple[str, str], _Seen] = field(default_factory=dict)
    samples: int = 0

    def sample(self) -> None:
        for entry in self.proc.iterdir():
            if entry.name.isdigit():
                self._process(entry)
        self.samples += 1

    def _process(self, entry: Path) -> None:
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            return  # gone since the listing
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2 :].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        key = (entry.name, fields[19])  # pid and start time: a pid may be reused
        known = self.seen.get(key)
        if known is not None and known.comm == comm:
            known.last_ticks = ticks
            return
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            return
        now = kind(comm, cmdline)
        if known is None:
            # Processes running at the first sample count from there; later ones from their start.
            self.seen[key] = _Seen(now, comm, ticks if self.samples == 0 else 0, ticks, cmdline, [now])
        else:
            known.kind, known.comm, known.last_ticks = now, comm, ticks
            if known.kinds[-1] != now:
                known.kinds.append(now)

    def by_kind(self) -> list[tuple[str, float, int]]:
        """Kind, CPU-seconds and process count, the most CPU first."""
        ticks: Counter[str] = Counter()
        processes: Counter[str] = Counter()
        for process in self.seen.values():
            ticks[process.kind] += process.last_ticks - process.first_ticks
            processes[process.kind] += 1
        return [(name, count / TICKS_PER_S, processes[name]) for name, count in ticks.most_common()]

    def detail(self, prefix: str, top: int) -> list[tuple[float, list[str], str]]:
        """The `top` processes of the kinds starting with `prefix`, the most CPU first: CPU-seconds,
        the kinds each had and its command line as first seen."""
        chosen = [p for p in self.seen.values() if p.kind.startswith(prefix)]
        chosen.sort(key=lambda p: -p.cpu_s)
        return [(p.cpu_s, p.kinds, p.cmdline) for p in chosen[:top]]


def busy_seconds(proc: Path = Path("/proc")) -> float:
    """CPU-seconds the whole machine has spent busy since boot: user, nice, system, irq, softirq
    and steal time (/proc/stat's first line; idle and I/O wait left out, guest time is in user)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(
        int, (proc / "stat").read_text().split("\n")[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / TICKS_PER_S


@dataclass(frozen=True)
class Report:
    command: list[str]
    exit_code: int
    wall_s: float
    machine_busy_s: float
    kinds: list[tuple[str, float, int]]  # kind, CPU-seconds, processes; the most CPU first
    details: dict[str, list[tuple[float, list[str], str]]]  # Tally.detail for each asked prefix

    @property
    def sampled_s(self) -> float:
        return sum(cpu for _, cpu, _ in self.kinds)


def run(command: list[str], interval: float, details: Sequence[str] = (), top: int = 20) -> Report:
    """Run `command` to its end, sampling every `interval` seconds; `details`: the kind prefixes
    whose `top` processes the report lists one by one."""
    tally = Tally()
    tally.sample()
    busy, started = busy_seconds(), time.monotonic()
    process = subprocess.Popen(command)
    while process.poll() is None:
        time.sleep(interval)
        tally.sample()
    return Report(
        command=command,
        exit_code=process.returncode,
        wall_s=time.monotonic() - started,
        machine_busy_s=busy_seconds() - busy,
        kinds=tally.by_kind(),
        details={prefix: tally.detail(prefix, top) for prefix in details},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.3, help="seconds between samples")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--top", type=int, default=30, help="how many kinds to print (default: 30)")
    parser.add_argument(
        "--detail",
        action="append",
        default=[],
        metavar="KIND",
        help="also list the processes of the kinds starting with KIND (e.g. 'other: python'), each "
        "with its command line as first seen and the kinds it went through; repeatable",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    report = run(command, args.interval, args.detail, args.top)
    if args.json:
        print(json.dumps({**dataclasses.asdict(report), "sampled_s": report.sampled_s}))
        return report.exit_code
    busy = max(report.machine_busy_s, 1e-9)
    print(
        f"{report.wall_s:.0f} s wall, machine busy {report.machine_busy_s:.0f} CPU-s "
        f"({report.machine_busy_s / report.wall_s:.2f} of {os.cpu_count()} cores), sampled "
        f"{report.sampled_s:.0f} CPU-s; the command exited {report.exit_code}"
    )
    print(f"{'CPU-s':>8} {'share':>6} {'procs':>6}  kind")
    for name, cpu, processes in report.kinds[: args.top]:
        print(f"{cpu:8.1f} {cpu / busy:6.1%} {processes:6d}  {name}")
    rest = report.kinds[args.top :]
    if rest:
        cpu, processes = sum(r[1] for r in rest), sum(r[2] for r in rest)
        print(f"{cpu:8.1f} {'':6} {processes:6d}  {len(rest)} more kinds")
    for prefix, listed in report.details.items():
        print(f"\nthe {len(listed)} processes of '{prefix}' with the most CPU:")
        for cpu, kinds, cmdline in listed:
            print(f"{cpu:8.1f}  {' > '.join(kinds)}: {cmdline[:160]}")
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
