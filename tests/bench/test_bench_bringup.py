"""bench/bringup.py: the ratios and table it prints, and the scripts it gives the simulated hosts.

The benchmark itself runs by hand (it takes minutes and needs root); these are its pure parts.
"""

from __future__ import annotations

import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rayslice.local.host.paths import HostPaths
from rayslice.local.simulation.state import HostPlan
from rayslice.startup_scripts.variables import preset_lock
from tests.bench import load

bringup = load("bringup")

SHELLCHECK = str(Path(sys.executable).parent / "shellcheck")
FIGURES = bringup.Figures(guide=300.0, first_boot=45.0, reboot=15.0, floor=10.0)


def _host(name: str, ip: str) -> HostPlan:
    return HostPlan(
        name=name, role="worker", slice_index=0, worker=0, ip=ip, netns="n", veth="v", veth_peer="p"
    )


def test_each_figure_is_a_ratio_to_the_floor_and_to_the_guide():
    table = [(r.seconds, r.of_floor, r.of_guide) for r in bringup.rows(FIGURES)]
    expected = [(10.0, 1.0, 1 / 30), (15.0, 1.5, 0.05), (45.0, 4.5, 0.15), (300.0, 30.0, 1.0)]
    assert len(table) == len(expected)
    for got, want in zip(table, expected, strict=True):
        assert got == pytest.approx(want)


def test_report_prints_one_table_row_per_figure():
    text = bringup.report(FIGURES, "v6e-16", 4, 3, "2026-12-02 18:55 UTC")
    lines = text.splitlines()
    assert lines[0].startswith("2026-12-02 18:55 UTC: simulated v6e-16, 4 hosts")
    assert "median of 3" in lines[0]
    assert "| floor: installed, only supervisor + ray start | 10.0 | 1.00 | 0.033 |" in lines
    assert "| rayslice reboot (requirements installed) | 15.0 | 1.50 | 0.050 |" in lines
    assert "| rayslice first boot, all hosts at once | 45.0 | 4.50 | 0.150 |" in lines
    assert "| guide done literally, host after host | 300.0 | 30.00 | 1.000 |" in lines


@pytest.mark.parametrize("field, value", [("floor", 0.0), ("guide", -1.0), ("reboot", math.nan)])
def test_a_figure_that_is_not_a_positive_time_is_refused(field, value):
    figures = bringup.Figures(**{**vars(FIGURES), field: value})
    with pytest.raises(ValueError, match=field):
        bringup.rows(figures)


def _run_with_stub_setsid(tmp_path: Path, script: str) -> list[str]:
    """Run a floor script with `setsid` replaced by a stub; return the argv it was given."""
    stub_dir = tmp_path / "bin"
    stub_dir.mkdir()
    record = tmp_path / "argv"
    stub = stub_dir / "setsid"
    stub.write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > {record}\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    path = tmp_path / "floor.sh"
    path.write_text(script)
    env = {"PATH": f"{stub_dir}:{os.defpath}", "HOME": str(tmp_path)}
    subprocess.run(["bash", str(path)], check=True, env=env, timeout=30)
    for _ in range(100):  # the stub runs in the background
        if record.exists() and record.read_bytes().endswith(b"\0"):
            break
        subprocess.run(["sleep", "0.05"], check=True)
    return record.read_bytes().decode().split("\0")[:-1]


def test_floor_script_on_the_head_starts_only_a_supervised_ray_head(tmp_path):
    head = _host("rayslice-slice-0-w-0", "10.1.0.2")
    script = bringup.floor_script(head, "10.1.0.2", "/run/x/opt/venv/bin/ray", "/run/x/tmp/ray", 4)
    argv = _run_with_stub_setsid(tmp_path, script)
    assert argv[:2] == ["bash", "-c"]
    assert "while :" in argv[2]
    assert argv[3:] == [
        "_",
        "/run/x/opt/venv/bin/ray",
        "start",
        "--block",
        "--disable-usage-stats",
        "--node-ip-address=10.1.0.2",
        f"--object-store-memory={100 * 1024 * 1024}",
        "--temp-dir=/run/x/tmp/ray",
        '--resources={"TPU": 4}',
        "--head",
        "--port=6379",
        "--dashboard-host=10.1.0.2",
        "--dashboard-port=8265",
    ]


def test_floor_script_on_a_worker_joins_the_head_address(tmp_path):
    worker = _host("rayslice-slice-0-w-3", "10.1.0.5")
    argv = _run_with_stub_setsid(
        tmp_path, bringup.floor_script(worker, "10.1.0.2", "/opt/v/bin/ray", "/tmp/ray", 4)
    )
    assert "--address=10.1.0.2:6379" in argv
    assert "--head" not in argv
    assert "--node-ip-address=10.1.0.5" in argv


def test_floor_script_quotes_what_it_is_given(tmp_path):
    marker = tmp_path / "pwned"
    worker = _host("w", "10.1.0.5")
    ray = f"/opt/$(touch {marker})/bin/ray"
    argv = _run_with_stub_setsid(tmp_path, bringup.floor_script(worker, "10.1.0.2", ray, "/tmp/ray", 4))
    assert argv[4] == ray
    assert not marker.exists()


@pytest.mark.parametrize("script", ["floor", "guide"])
def test_bench_scripts_pass_bash_n_and_shellcheck(tmp_path, script):
    if script == "floor":
        text = bringup.floor_script(_host("h", "10.1.0.2"), "10.1.0.2", "/opt/v/bin/ray", "/tmp/ray", 4)
    else:
        text = bringup.guide_script(
            "10.1.0.2", "h", tmp_path / "wheels", ["jax[tpu]", "ray[default]==2.60.0"], 4
        )
    path = tmp_path / f"{script}.sh"
    path.write_text(text)
    subprocess.run(["bash", "-n", str(path)], check=True)
    result = subprocess.run([SHELLCHECK, str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_installed_ray_finds_the_one_venv_the_boot_script_made(tmp_path):
    ray = tmp_path / "opt" / "rayslice" / "venv" / "bin" / "ray"
    ray.parent.mkdir(parents=True)
    ray.write_text("")
    (tmp_path / "opt" / "rayslice" / "uv" / "bin").mkdir(parents=True)
    (tmp_path / "opt" / "rayslice" / "uv" / "bin" / "uv").write_text("")
    assert bringup.installed_ray(tmp_path) == ray


@pytest.mark.parametrize("venvs", [0, 2])
def test_installed_ray_refuses_none_or_several(tmp_path, venvs):
    for i in range(venvs):
        ray = tmp_path / "opt" / f"venv{i}" / "bin" / "ray"
        ray.parent.mkdir(parents=True)
        ray.write_text("")
    with pytest.raises(RuntimeError, match="expected one venv"):
        bringup.installed_ray(tmp_path)


def test_internet_report_gives_medians_ratios_and_bytes_against_the_fewest_hosts():
    def run(first: float, floor: float, fetched: dict[str, int]) -> object:
        return bringup.InternetRun(
            first_boot=first,
            reboot=floor * 1.5,
            floor=floor,
            fetched=fetched,
            install_cpu=dict.fromkeys(fetched, 10.0),
            image_boot=floor * 1.1,
            image_floor=floor * 0.9,
            image_fetched={name: size // 100 for name, size in fetched.items()},
        )

    runs = {
        "v6e-16": [run(80.0, 20.0, {"w0": 600_000_000, "w1": 0, "w2": 0, "w3": 0})] * 3,
        "v6e-8": [run(30.0, 5.0, {"w0": 500_000_000}), run(50.0, 5.0, {"w0": 500_000_000})],
    }
    link = bringup.Link(rate_mbit=200, latency_ms=20)
    text = bringup.internet_report(runs, link, True, {"v6e-8": 1, "v6e-16": 4}, "DATE")
    lines = text.splitlines()
    assert lines[0].startswith("DATE: simulated slices in internet mode, with the package cache")
    assert "200 Mbit/s, 20 ms per answer; medians of 2 fresh slices" in lines[0]
    one, four = lines[-2], lines[-1]  # fewest hosts first
    assert one == (
        "| v6e-8 | 1 | 40.0 | 8.00 | 1.00 | 7.5 | 1.50 | 5.0 | 500-500 | 500 | 1.00 | 5.5 | 1.22 | 4.5 | 5 |"
    )
    assert four == (
        "| v6e-16 | 4 | 80.0 | 4.00 | 2.00 | 30.0 | 1.50 | 20.0 | 0-600 | 600 | 1.20 "
        "| 22.0 | 1.22 | 18.0 | 6 |"
    )
    header, rule = lines[2], lines[3]
    assert header.count("|") == rule.count("|") == one.count("|")  # every row as wide as the header


def test_the_physical_floor_is_the_busiest_links_bytes_plus_one_hosts_install_cpu_plus_ray_start():
    # 500 MB over 200 Mbit/s take 20 s; the busiest host's 12 CPU-s over 4 cores 3 s; ray start 5 s.
    floor = bringup.physical_floor(
        {"head": 500_000_000, "w1": 1_000_000}, 200.0, {"head": 12.0, "w1": 9.0}, 4, 5.0
    )
    assert (floor.link_s, floor.install_s, floor.ray_floor_s) == pytest.approx((20.0, 3.0, 5.0))
    assert floor.seconds == pytest.approx(28.0)


@pytest.mark.parametrize(
    "fetched, rate, cpu, cores",
    [
        ({"h": 1}, 0.0, {"h": 1.0}, 1),
        ({"h": 1}, 1.0, {"h": 1.0}, 0),
        ({}, 1.0, {"h": 1.0}, 1),
        ({"h": 1}, 1.0, {}, 1),
    ],
    ids=["no rate", "no core", "no bytes", "no cpu"],
)
def test_a_floor_without_a_rate_a_core_or_figures_is_refused(fetched, rate, cpu, cores):
    with pytest.raises(ValueError, match="positive rate"):
        bringup.physical_floor(fetched, rate, cpu, cores, 1.0)


def test_floor_report_sets_each_types_median_first_boot_against_its_physical_floor():
    def run(first: float, head_bytes: int, cpu: float) -> object:
        return bringup.InternetRun(
            first_boot=first,
            reboot=6.0,
            floor=5.0,
            fetched={"head": head_bytes, "w1": 0},
            install_cpu={"head": cpu, "w1": cpu / 2},
            image_boot=6.0,
            image_floor=5.0,
            image_fetched={"head": 0, "w1": 0},
        )

    # 25 MB over 10 Mbit/s: 20 s; 8 CPU-s over 2 cores: 4 s; ray start 5 s: a floor of 29 s.
    runs = {"v6e-8": [run(58.0, 25_000_000, 8.0)] * 3}
    text = bringup.floor_report(runs, bringup.Link(rate_mbit=10, latency_ms=20), 2, {"v6e-8": 2})
    lines = text.splitlines()
    assert "goal: 1.3x at most" in lines[0] and "2 cores per host" in lines[0]
    assert lines[-1] == "| v6e-8 | 2 | 58.0 | 25 | 20.0 | 8.0 | 4.0 | 5.0 | 29.0 | 2.00 | 6.0 |"
    assert lines[2].count("|") == lines[3].count("|") == lines[-1].count("|")


def test_install_cpu_counts_each_hosts_installers_by_its_network_namespace(tmp_path):
    """A fake /proc: two installers in host a's namespace, one in b's, one other process."""

    def process(pid: int, namespace: Path, comm: str, cmdline: str, utime: int, stime: int) -> None:
        entry = tmp_path / "proc" / str(pid)
        (entry / "ns").mkdir(parents=True)
        fields = ["S"] + ["0"] * 10 + [str(utime), str(stime)] + ["0"] * 6 + [str(1000 + pid)]
        (entry / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}")
        (entry / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode())
        (entry / "ns" / "net").symlink_to(namespace)

    a, b = tmp_path / "ns-a", tmp_path / "ns-b"
    a.touch()
    b.touch()
    ticks = bringup.TICKS_PER_S
    process(1, a, "uv", "/opt/uv/bin/uv pip install x", ticks * 3, ticks)
    process(2, a, "python3", "python3 -m pip install uv", ticks, 0)
    process(3, b, "uv", "/opt/uv/bin/uv pip install x", ticks * 2, 0)
    process(4, a, "raylet", "raylet --node", ticks * 50, 0)
    sampler = bringup.InstallCpu({a.stat().st_ino: "a", b.stat().st_ino: "b"}, proc=tmp_path / "proc")
    sampler.sample()
    assert sampler.by_host() == {"a": 5.0, "b": 2.0}


def test_internet_spec_installs_from_the_simulated_index_with_or_without_the_cache():
    with_cache = bringup.internet_spec("v6e-16", True)
    assert with_cache.package_index == "http://pypi.internet.test:8080/simple/"
    assert with_cache.package_cache and with_cache.ray_auth == "none"
    assert not bringup.internet_spec("v6e-16", False).package_cache
    assert with_cache.host_image is None
    imaged = bringup.internet_spec("v6e-16", True, "rayslice-host-0123abcd")
    assert imaged.host_image == "rayslice-host-0123abcd" and imaged.package_cache


class _Logs:
    """Stands in for a Simulation where `check_locked` reads it: its hosts and their boot logs."""

    def __init__(self, root: Path, logs: dict[str, str]):
        self.plan = type("Plan", (), {"hosts": [_host(name, f"10.0.0.{i}") for i, name in enumerate(logs)]})
        self._root = root
        for name, text in logs.items():
            self.paths(name).boot_log.parent.mkdir(parents=True)
            self.paths(name).boot_log.write_text(text)

    def paths(self, name: str) -> HostPaths:
        return HostPaths.of(self._root, name)


def test_check_locked_refuses_a_run_where_a_host_resolved_instead_of_installing_the_lock(tmp_path):
    spec = bringup.internet_spec("v6e-16", True)
    lock = preset_lock(spec)
    assert lock is not None
    locked = f"installing the lock {lock.digest} into /opt/rayslice/venv from http://cache/\n"
    bringup.check_locked(_Logs(tmp_path / "a", {"s-w-0": locked, "s-w-1": locked}), spec)
    with pytest.raises(RuntimeError, match=r"hosts \['s-w-1'\] did not install the lock"):
        bringup.check_locked(_Logs(tmp_path / "b", {"s-w-0": locked, "s-w-1": "installing jax[tpu]\n"}), spec)
