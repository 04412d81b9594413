"""bench/cpu_by_process.py: the kinds it counts CPU under, how it adds a process's CPU from
/proc samples (on a made-up /proc), and one real run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.bench import load

cpu = load("cpu_by_process")


@pytest.mark.parametrize(
    ("comm", "cmdline", "expected"),
    [
        ("raylet", "/x/ray/core/src/ray/raylet/raylet --node_ip_address=10.0.0.2", "ray: raylet"),
        ("gcs_server", "/x/gcs_server --gcs_server_port=6379", "ray: gcs server"),
        ("ray::IDLE", "ray::IDLE", "ray worker: IDLE"),
        ("ray::JobSuperv", "ray::JobSupervisor.run", "ray worker: JobSupervisor"),
        (
            "python",
            "python /x/ray/_private/workers/default_worker.py --raylet-name=r",
            "ray worker: starting",
        ),
        (
            "python",
            "python -u /x/ray/dashboard/agent.py --node-ip-address=10.0.0.2",
            "ray: dashboard agent",
        ),
        ("ray-dashboard-J", "ray-dashboard-JobHead-0 (/v/bin/python)", "ray: dashboard modules"),
        ("python", "/v/bin/python -m rayslice.workloads.jax_train --steps 20", "job driver: jax_train"),
        (
            "python",
            "/v/bin/python -m rayslice.local.google.metadata_server --tree t",
            "simulator: rayslice.local.google.metadata_server",
        ),
        ("python", "/v/bin/python -m pytest -n 3", "pytest"),
        ("python", "/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))", "pytest"),
        ("uv", "/v/bin/uv pip install -r lock", "installer: uv"),
        ("curl", "curl -s http://metadata.google.internal/", "other: curl"),
    ],
)
def test_a_process_counts_under_its_kind(comm, cmdline, expected):
    assert cpu.kind(comm, cmdline) == expected


def _process(proc: Path, pid: int, comm: str, cmdline: str, ticks: int, start: int = 100) -> None:
    """/proc/<pid>/stat and cmdline as Linux writes them (utime and stime are fields 14 and 15,
    the start time field 22; the name in parentheses may hold spaces)."""
    fields = ["S", *["0"] * 10, str(ticks), "0", *["0"] * 6, str(start)]
    (proc / str(pid)).mkdir(exist_ok=True)
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)} 0 0\n")
    (proc / str(pid) / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")


def test_cpu_counts_from_the_first_sample_or_the_start_under_the_last_kind(tmp_path):
    ticks = cpu.TICKS_PER_S
    tally = cpu.Tally(proc=tmp_path)
    _process(tmp_path, 10, "raylet", "raylet", 50 * ticks)  # running before: counts from here
    tally.sample()
    _process(tmp_path, 10, "raylet", "raylet", 53 * ticks)
    _process(tmp_path, 20, "python", "python default_worker.py", 1 * ticks)  # new: counts from 0
    tally.sample()
    _process(tmp_path, 20, "ray::IDLE", "ray::IDLE", 4 * ticks)  # its title changed: all of it moves
    (tmp_path / "10").joinpath("stat").unlink()  # gone: what was seen of it stays
    (tmp_path / "10").joinpath("cmdline").unlink()
    (tmp_path / "10").rmdir()
    _process(tmp_path, 30, "my job", "python my job.py", 2 * ticks, start=300)
    tally.sample()
    _process(tmp_path, 30, "my job", "python my job.py", 1 * ticks, start=400)  # the pid, reused
    tally.sample()
    assert tally.by_kind() == [
        ("ray worker: IDLE", 4.0, 1),
        ("ray: raylet", 3.0, 1),
        ("other: my job", 3.0, 2),
    ]


def test_a_detail_lists_each_process_of_a_kind_with_its_first_command_line_and_its_kinds(tmp_path):
    ticks = cpu.TICKS_PER_S
    tally = cpu.Tally(proc=tmp_path)
    tally.sample()
    worker = "python default_worker.py --node-ip-address=10.0.0.3"
    _process(tmp_path, 20, "python", worker, 1 * ticks)
    _process(tmp_path, 21, "python", "python default_worker.py --node-ip-address=10.0.0.4", 1 * ticks)
    _process(tmp_path, 30, "raylet", "raylet", 9 * ticks)
    tally.sample()
    _process(tmp_path, 20, "ray::_host_task", "ray::_host_task", 3 * ticks)
    _process(tmp_path, 21, "ray::IDLE", "ray::IDLE", 2 * ticks)
    tally.sample()
    _process(tmp_path, 20, "ray::IDLE", "ray::IDLE", 5 * ticks)
    tally.sample()
    assert tally.detail("ray worker", top=5) == [
        (5.0, ["ray worker: starting", "ray worker: _host_task", "ray worker: IDLE"], worker),
        (2.0, ["ray worker: starting", "ray worker: IDLE"], worker.replace(".3", ".4")),
    ]
    assert len(tally.detail("ray worker", top=1)) == 1
    assert tally.detail("nothing of that kind", top=5) == []


def test_the_machines_busy_time_leaves_out_idle_and_io_wait(tmp_path):
    ticks = cpu.TICKS_PER_S
    # user nice system idle iowait irq softirq steal guest guest_nice
    values = [100, 10, 50, 9999, 888, 1, 2, 3, 40, 4]
    (tmp_path / "stat").write_text("cpu  " + " ".join(str(v * ticks) for v in values) + "\ncpu0 1 2 3\n")
    assert cpu.busy_seconds(tmp_path) == 166.0


def test_a_real_run_finds_the_commands_cpu_and_its_exit_code():
    burn = "import time\nwhile time.process_time() < 0.3: pass\nraise SystemExit(3)"
    report = cpu.run([sys.executable, "-c", burn], interval=0.05)
    assert report.exit_code == 3
    # /proc/stat counts the machine in clock ticks, sampled: a tick under the burn is not an error.
    assert report.wall_s >= 0.3 and report.machine_busy_s >= 0.3 - 2 / cpu.TICKS_PER_S
    mine = [seconds for name, seconds, _ in report.kinds if name.startswith("other: python")]
    assert mine and max(mine) >= 0.2  # all but what it used after the last sample
    assert report.details == {}
