"""CPU-seconds by test: what each test costs the machine, with every process it started.

bench/cpu_by_process.py says which kinds of process use the two cores; this says which tests do.
Loaded into pytest as a plugin (``-p cpu_by_test`` with bench/ on PYTHONPATH), it puts each
pytest process (each pytest-xdist worker) in a cgroup of its own. Every process a test starts
inherits it, daemons included: the simulated hosts, their Ray, the jobs on them. After each test
it appends the cgroup's CPU time over the test (setup, call and teardown), its wall time and
when it started to ``<worker>.jsonl`` in the folder ``RAYSLICE_CPU_BY_TEST`` names. A shared
cluster's boot counts to its first test, and its removal to its last.

Run as a script, it adds those files up by work unit: a test module, or the tests of a shared
cluster (each ``--cluster`` names a test parameter that marks one, as tests/integration/clusters.py
parametrizes them), the most CPU first, with each worker's total:

    RAYSLICE_CPU_BY_TEST=/tmp/cpu PYTHONPATH=bench .venv/bin/python -m pytest -n 3 -p cpu_by_test
    .venv/bin/python bench/cpu_by_test.py /tmp/cpu --cluster v6e-4 --cluster "2 x tpu7x-16 spot"

Needs root, and a cgroup v1 ``cpuacct`` hierarchy or a cgroup v2 one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

OUT_VAR = "RAYSLICE_CPU_BY_TEST"
MOUNTS = Path("/proc/mounts")


@dataclass(frozen=True)
class Cgroup:
    """A cgroup of its own for this process, and how to read the CPU time of all it holds."""

    path: Path
    version: int  # 1: cpuacct.usage in nanoseconds; 2: usage_usec in cpu.stat

    def cpu_s(self) -> float:
        if self.version == 1:
            return int((self.path / "cpuacct.usage").read_text()) / 1e9
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6


def hierarchy(mounts: str) -> tuple[Path, int]:
    """Where to make the cgroup, from /proc/mounts: a cgroup v1 hierarchy with the cpuacct
    controller, else the cgroup v2 one (whose cpu.stat counts usage with no controller on)."""
    v2: Path | None = None
    for line in mounts.splitlines():
        _device, mount_point, kind, options, *_ = line.split()
        if kind == "cgroup" and "cpuacct" in options.split(","):
            return Path(mount_point), 1
        if kind == "cgroup2":
            v2 = Path(mount_point)
    if v2 is None:
        raise RuntimeError("no cgroup v1 cpuacct hierarchy and no cgroup v2 one is mounted")
    return v2, 2


def join_new_cgroup(name: str, mounts: Path = MOUNTS) -> Cgroup:
    """Make the cgroup `name` and move this process into it."""
    root, version = hierarchy(mounts.read_text())
    path = root / name
    path.mkdir(exist_ok=True)
    (path / "cgroup.procs").write_text(str(os.getpid()))
    return Cgroup(path, version)


def leave(cgroup: Cgroup) -> None:
    """Move this process back to the hierarchy's root and remove `cgroup`; a process the tests
    left running keeps it, and the warning names it."""
    (cgroup.path.parent / "cgroup.procs").write_text(str(os.getpid()))
    try:
        cgroup.path.rmdir()
    except OSError as exc:
        print(f"cpu_by_test: {cgroup.path} kept: {exc.strerror} (a process still in it)", file=sys.stderr)


class Recorder:
    """The plugin: one line per test to ``<out>/<worker>.jsonl``."""

    def __init__(self, out: Path, worker: str) -> None:
        self.cgroup = join_new_cgroup(f"rayslice-cpu-by-test-{worker}-{os.getpid()}")
        out.mkdir(parents=True, exist_ok=True)
        self.worker = worker
        self.lines = (out / f"{worker}.jsonl").open("a")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        cpu, wall, start = self.cgroup.cpu_s(), time.monotonic(), time.time()
        yield
        row = {
            "id": item.nodeid,
            "worker": self.worker,
            "cpu_s": round(self.cgroup.cpu_s() - cpu, 3),
            "wall_s": round(time.monotonic() - wall, 3),
            "start": round(start, 3),  # epoch seconds: which tests ran beside each other
        }
        self.lines.write(json.dumps(row) + "\n")
        self.lines.flush()

    def pytest_unconfigure(self) -> None:
        self.lines.close()
        leave(self.cgroup)


def pytest_configure(config: pytest.Config) -> None:
    """Record in each process that runs tests: every pytest-xdist worker, or pytest itself when
    it runs them (not the controller of `-n N`)."""
    out = os.environ.get(OUT_VAR)
    if not out:
        raise pytest.UsageError(f"-p cpu_by_test: set {OUT_VAR} to the folder for its files")
    # pytest-xdist gives each worker's config its `workerinput`; the environment is no guide, since
    # a test's own pytest subprocess inherits its worker's PYTEST_XDIST_WORKER.
    worker_input = getattr(config, "workerinput", None)
    if worker_input is None and config.getoption("numprocesses", None):
        return
    worker = worker_input["workerid"] if worker_input is not None else "main"
    config.pluginmanager.register(Recorder(Path(out), worker), "cpu_by_test_recorder")


# ---- the report ---------------------------------------------------------------------------------


def unit(test_id: str, clusters: Sequence[str]) -> str:
    """The work unit of a test: its shared cluster, when its parameters end with one of
    `clusters`, else its module."""
    for name in clusters:
        if test_id.endswith(f"[{name}]"):
            return f"cluster {name}"
    return test_id.split("::", 1)[0]


def rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.open()]


def report(tests: list[dict[str, Any]], clusters: Sequence[str], top: int) -> list[str]:
    """Units by CPU, the most first (CPU-s, wall s, CPU over wall: the cores a unit kept busy),
    then each worker's totals."""
    units: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    workers: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for test in tests:
        for table, key in ((units, unit(test["id"], clusters)), (workers, test["worker"])):
            table[key][0] += test["cpu_s"]
            table[key][1] += test["wall_s"]
    total = sum(t["cpu_s"] for t in tests)
    return [
        *_table("unit", sorted(units.items(), key=lambda kv: -kv[1][0])[:top]),
        *_table("worker", sorted(workers.items())),
        f"{total:8.1f} CPU-s in {len(tests)} tests",
    ]


def _table(heading: str, sums: list[tuple[str, list[float]]]) -> list[str]:
    """A heading line, then a line per (name, [CPU-s, wall s])."""
    out = [f"{'CPU-s':>8} {'wall s':>8} {'cores':>5}  {heading}"]
    for name, (cpu, wall) in sums:
        out.append(f"{cpu:8.1f} {wall:8.1f} {cpu / wall if wall else 0:5.2f}  {name}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Add up the plugin's files by work unit.")
    parser.add_argument("folder", type=Path, help=f"the folder {OUT_VAR} named")
    parser.add_argument(
        "--cluster", action="append", default=[], help="a test parameter that names a shared cluster"
    )
    parser.add_argument("--top", type=int, default=40, help="how many units to list")
    args = parser.parse_args(argv)
    tests = rows(args.folder)
    if not tests:
        print(f"no tests recorded in {args.folder}", file=sys.stderr)
        return 1
    print("\n".join(report(tests, args.cluster, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
