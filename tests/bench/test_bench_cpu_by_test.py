"""bench/cpu_by_test.py: where it makes its cgroup, how it adds tests up, and one real pytest run
under it (root only: it moves pytest into a cgroup of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bench import BENCH, load

cpu = load("cpu_by_test")

HYBRID = """cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
"""
UNIFIED = "proc /proc proc rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n"


def test_the_cgroup_goes_in_the_v1_cpuacct_hierarchy_else_in_the_v2_one():
    assert cpu.hierarchy(HYBRID) == (Path("/sys/fs/cgroup/cpuacct"), 1)
    assert cpu.hierarchy(UNIFIED) == (Path("/sys/fs/cgroup"), 2)
    with pytest.raises(RuntimeError, match="no cgroup"):
        cpu.hierarchy("proc /proc proc rw 0 0\n")


def test_each_version_reads_its_own_counter(tmp_path):
    (tmp_path / "cpuacct.usage").write_text("2500000000\n")
    (tmp_path / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    assert cpu.Cgroup(tmp_path, 1).cpu_s() == 2.5
    assert cpu.Cgroup(tmp_path, 2).cpu_s() == 1.5


def test_tests_add_up_by_shared_cluster_or_module_and_by_worker():
    tests = [
        {"id": "tests/a.py::t[v6e-4]", "worker": "gw0", "cpu_s": 30.0, "wall_s": 60.0},
        {"id": "tests/b.py::u[v6e-4]", "worker": "gw0", "cpu_s": 10.0, "wall_s": 20.0},
        {"id": "tests/b.py::v[compute]", "worker": "gw1", "cpu_s": 5.0, "wall_s": 5.0},
    ]
    lines = cpu.report(tests, ["v6e-4"], top=10)
    assert lines[1].split() == ["40.0", "80.0", "0.50", "cluster", "v6e-4"]
    assert lines[2].split() == ["5.0", "5.0", "1.00", "tests/b.py"]
    assert [line.split()[-1] for line in lines[4:6]] == ["gw0", "gw1"]
    assert lines[-1].split()[:2] == ["45.0", "CPU-s"]


@pytest.mark.root  # it moves pytest into a cgroup
def test_a_run_records_each_tests_cpu_with_its_children_and_removes_its_cgroup(tmp_path):
    """A test that burns CPU in a child process is charged for it; the cgroup is gone after."""
    (tmp_path / "test_burn.py").write_text(
        "import subprocess, sys\n"
        "def test_burn():\n"
        "    subprocess.run([sys.executable, '-c', 'sum(range(30_000_000))'], check=True)\n"
        "def test_idle():\n"
        "    pass\n"
    )
    out = tmp_path / "cpu"
    root, _ = cpu.hierarchy(cpu.MOUNTS.read_text())
    before = set(root.glob("rayslice-cpu-by-test-*"))  # a measured suite's own workers' cgroups
    env = {**os.environ, cpu.OUT_VAR: str(out), "PYTHONPATH": str(BENCH)}
    started = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "cpu_by_test", "-p", "no:cacheprovider", "-n", "0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {r["id"]: r for r in map(json.loads, (out / "main.jsonl").read_text().splitlines())}
    assert rows["test_burn.py::test_burn"]["cpu_s"] > 0.3 > rows["test_burn.py::test_idle"]["cpu_s"]
    burn, idle = rows["test_burn.py::test_burn"], rows["test_burn.py::test_idle"]
    # in order, one after the other (each figure rounded to the millisecond)
    assert started < burn["start"] < burn["start"] + burn["wall_s"] <= idle["start"] + 0.002 < time.time()
    assert "kept" not in result.stderr
    assert set(root.glob("rayslice-cpu-by-test-*")) <= before
