"""The hosts' TPU metrics endpoint (`rayslice.startup_scripts.tpu_metrics`): what it serves parses
in Ray 2.60's own reader (the reporter agent's ``_get_tpu_usage``), from libtpu's interface or the
simulated library's, and a host without libtpu or chips serves nothing and says so once."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rayslice import names
from rayslice import spec as spec_module
from rayslice.infra.firewall import firewall_rules
from rayslice.local.host import tpu_runtime
from rayslice.startup_scripts import tpu_metrics
from rayslice.startup_scripts.variables import EXIT_PERMANENT
from tests import serving
from tests.local import simulated_libtpu
from tests.startup_scripts.sandbox import free_port


class FakeMonitoring:
    """libtpu.sdk.tpumonitoring's interface, answering from a table (name -> data)."""

    def __init__(self, table: dict[str, list[str]]):
        self.table = table

    def list_supported_metrics(self) -> list[str]:
        return list(self.table)

    def get_metric(self, name: str) -> Any:
        data = self.table[name]
        return SimpleNamespace(data=lambda: data, description=lambda: f"the {name} of each chip")


@contextlib.contextmanager
def bounded(page: Any, **limits: Any) -> Iterator[tpu_metrics.BoundedServer]:
    """The exporter's HTTP server, as `main` makes it, on a free local port."""
    server = tpu_metrics.BoundedServer(("127.0.0.1", free_port()), tpu_metrics.handler(page), **limits)
    serving.start(server)
    try:
        yield server
    finally:
        serving.stop(server)


@contextlib.contextmanager
def exporter(page: Any) -> Iterator[str]:
    """The exporter's HTTP server on a free local port; yields its host:port."""
    with bounded(page) as server:
        yield f"127.0.0.1:{server.server_address[1]}"


def rays_reading(address: str, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What Ray 2.60's reporter agent makes of the endpoint at `address` (its own code)."""
    from ray.dashboard.modules.reporter import reporter_agent

    monkeypatch.setattr(reporter_agent, "TPU_DEVICE_PLUGIN_ADDR", address)
    monkeypatch.setattr(reporter_agent, "enable_tpu_usage_check", True)
    return [dict(info) for info in reporter_agent.ReporterAgent._get_tpu_usage()]


def page_of(table: dict[str, list[str]], chips: int = 4) -> Any:
    return lambda: tpu_metrics.render(
        tpu_metrics.read_library(FakeMonitoring(table)), chips, "4804690994094478883", "tpu-v6e-slice", "4x4"
    )


def test_ray_reads_every_chips_figures_from_the_endpoint(monkeypatch):
    table = {
        "tensorcore_util": ["81.5", "0.0", "12.0", "0.0"],
        "duty_cycle_pct": ["99.0", "0.0", "50.5", "0.0"],
        "hbm_capacity_usage": ["1073741824", "0", "42", "0"],
        "hbm_capacity_total": ["34359738368"] * 4,
    }
    with exporter(page_of(table)) as address:
        chips = rays_reading(address, monkeypatch)
    assert [c["index"] for c in chips] == [0, 1, 2, 3]
    assert [c["duty_cycle"] for c in chips] == [99.0, 0.0, 50.5, 0.0]
    assert [c["tensorcore_utilization"] for c in chips] == [81.5, 0.0, 12.0, 0.0]
    assert [c["memory_used"] for c in chips] == [2**30, 0, 42, 0]
    assert {c["memory_total"] for c in chips} == {32 * 2**30}
    assert {(c["tpu_type"], c["tpu_topology"]) for c in chips} == {("tpu-v6e-slice", "4x4")}
    assert chips[1]["name"] == "4804690994094478883-1"


def test_two_tensorcores_of_a_chip_make_its_mean_and_the_other_numeric_metrics_get_clear_names():
    table = {
        "tensorcore_util": ["10", "30", "50", "70"],  # 2 chips x 2 cores (v5p)
        "duty_cycle_pct": ["20", "60"],
        "tpu_throttle_score": ["0", "3"],
        "collective_e2e_latency": ["'8MB+-ALL_REDUCE', '1000', '2000'"],  # a distribution: left out
        "ici_link_health": [],
    }
    text = page_of(table, chips=2)()
    assert 'tensorcore_utilization{accelerator_id="4804690994094478883-0"' in text
    lines = text.splitlines()
    assert [line.rsplit(" ", 1)[1] for line in lines if line.startswith("tensorcore_utilization{")] == [
        "20",
        "60",
    ]
    assert 'libtpu_tpu_throttle_score{index="1"} 3' in lines
    assert "# HELP libtpu_tpu_throttle_score the tpu_throttle_score of each chip" in lines
    assert not any("collective" in line or "ici_link_health" in line for line in lines)


def test_a_chip_of_two_devices_sums_their_hbm_and_ray_still_sees_one_row_per_chip(monkeypatch):
    """TPU7x: a chip is two devices; libtpu's memory may come per device, its duty cycle per chip
    (tpu-info's get_chip_usage repeats the duty cycle to match). Ray gets one row per chip."""
    table = {
        "tensorcore_util": ["10", "30", "50", "70", "0", "0", "0", "0"],
        "duty_cycle_pct": ["90", "80", "0", "0"],
        "hbm_capacity_usage": ["1", "2", "3", "4", "0", "0", "0", "0"],
        "hbm_capacity_total": ["96"] * 8,
    }
    with exporter(page_of(table, chips=4)) as address:
        chips = rays_reading(address, monkeypatch)
    assert [c["memory_used"] for c in chips] == [3, 7, 0, 0]
    assert {c["memory_total"] for c in chips} == {192}
    assert [c["tensorcore_utilization"] for c in chips] == [20.0, 60.0, 0.0, 0.0]
    assert [c["duty_cycle"] for c in chips] == [90.0, 80.0, 0.0, 0.0]


def test_nothing_to_read_serves_an_empty_page_that_ray_reads_as_no_chips(monkeypatch):
    """libtpu returns empty lists while no workload runs: the page is empty, and Ray reads it."""
    table: dict[str, list[str]] = {name: [] for name in tpu_metrics.RAY_NAMES}
    assert page_of(table)() == ""
    with exporter(page_of(table)) as address:
        assert rays_reading(address, monkeypatch) == []


def test_a_library_that_fails_a_read_costs_that_metric_only():
    class Failing(FakeMonitoring):
        def get_metric(self, name: str) -> Any:
            if name == "duty_cycle_pct":
                raise RuntimeError("metrics service not up")
            return super().get_metric(name)

    found = tpu_metrics.read_library(Failing({"duty_cycle_pct": ["1"], "hbm_capacity_total": ["7"]}))
    assert found["duty_cycle_pct"][1] == [] and found["hbm_capacity_total"][1] == ["7"]


def test_a_scraper_that_hangs_up_before_its_page_is_written_costs_no_traceback():
    """The page is read (the request arrived whole), then the scraper is gone: writing it fails
    with a broken pipe, which the handler drops as a real server does; a traceback here would
    reach the host's boot log at every such scrape."""
    asked = []

    def page() -> str:
        asked.append(True)
        return page_of({"duty_cycle_pct": ["1"]}, chips=1)()

    ours, theirs = socket.socketpair()
    theirs.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    theirs.close()
    with ours:
        tpu_metrics.handler(page)(ours, ("127.0.0.1", 0), None)  # returns: nothing raised
    assert asked == [True]


def _closed_by_server(client: socket.socket, trickle: bytes = b"") -> bool:
    """Whether the server hangs up on `client`, which sends `trickle` a byte at a time, each
    byte once the server has not hung up for 50 ms, and then nothing (at most 60 s in all)."""
    client.settimeout(0.05)
    limit = time.monotonic() + 60
    sent = 0
    while time.monotonic() < limit:
        try:
            if not client.recv(1):
                return True
        except TimeoutError:
            if sent < len(trickle):
                try:
                    client.send(trickle[sent : sent + 1])
                except OSError:
                    return True
                sent += 1
        except OSError:  # reset by the server
            return True
    return False


def test_a_connection_that_sends_nothing_is_closed_at_its_deadline():
    with (
        bounded(lambda: "", deadline_s=0.3) as server,
        socket.create_connection(server.server_address) as idle,
    ):
        assert _closed_by_server(idle)


def test_a_client_that_sends_a_byte_at_a_time_is_cut_at_the_deadline_not_per_read():
    """Each byte comes sooner than a per-read timeout would fire; only the handler's deadline,
    counted from its accept, ends the connection."""
    trickle = b"GET /metrics HTTP/1.1\r\n" + b"X-Slow: " + b"a" * 4000
    with (
        bounded(lambda: "", deadline_s=1.0) as server,
        socket.create_connection(server.server_address) as slow,
    ):
        assert _closed_by_server(slow, trickle)


def test_300_idle_connections_hold_no_more_threads_than_the_bound_and_a_scrape_waits_its_turn():
    """The review's reproduction: 300 idle connections held 302 threads. Now 4 are handled, the
    rest wait in the listen queue (not refused: Ray's agent stops asking after one failure), and
    a scrape made behind them is answered once they are gone."""
    page = page_of({"duty_cycle_pct": ["1"]}, chips=1)
    before = threading.active_count()
    with bounded(page, max_handlers=4, deadline_s=60) as server:
        idle = []
        for _ in range(300):
            client = socket.socket()
            client.setblocking(False)
            client.connect_ex(server.server_address)
            idle.append(client)
        limit = time.monotonic() + 30
        while server.active() < 4:
            assert time.monotonic() < limit, server.active()
            threading.Event().wait(0.01)
        assert threading.active_count() - before <= 1 + 4  # the serving thread and 4 handlers
        address = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        answer: list[str] = []
        scrape = threading.Thread(
            target=lambda: answer.append(urllib.request.urlopen(address, timeout=60).read().decode())
        )
        scrape.start()
        for client in idle:
            client.close()
        scrape.join(60)
        assert answer == [page()]
        assert threading.active_count() - before <= 1 + 4


def test_ray_reads_the_simulated_chips_a_jax_process_recorded(tmp_path, monkeypatch):
    """The simulated library behind the exporter: the record of a live process holding chips 0
    and 2 makes them busy and full in Ray's reading; the others idle and empty."""
    monitoring = simulated_libtpu.sdk(monkeypatch).tpumonitoring
    runtime = sys.modules["rayslice_simulated_tpu"]
    monkeypatch.setattr(runtime, "host_chips", lambda: 4)
    monkeypatch.setenv(runtime.STATE_DIR_VAR, str(tmp_path))
    monkeypatch.setenv(runtime.HBM_BYTES_VAR, str(16 * 2**30))
    record = {
        "pid": os.getpid(),
        "time": time.time(),
        "chips": [0, 2],
        "hbm_bytes": [3 * 2**20, 5 * 2**20],
        "duty_cycle_pct": 97.0,
        "tensorcore_util_pct": 40.0,
    }
    (tmp_path / f"{os.getpid()}.json").write_text(json.dumps(record))

    def page() -> str:
        return tpu_metrics.render(tpu_metrics.read_library(monitoring), 4, "7", "tpu-v5-lite-podslice", "2x2")

    with exporter(page) as address:
        chips = rays_reading(address, monkeypatch)
    assert [c["duty_cycle"] for c in chips] == [97.0, 0.0, 97.0, 0.0]
    assert [c["memory_used"] for c in chips] == [3 * 2**20, 0, 5 * 2**20, 0]
    assert {c["memory_total"] for c in chips} == {16 * 2**30}


def _run_exporter(tmp_path: Path, pythonpath: str) -> subprocess.CompletedProcess[str]:
    log = tmp_path / "boot.log"
    argv = [
        sys.executable,
        str(tpu_metrics.__file__),
        "--bind=127.0.0.1",
        f"--port={free_port()}",
        "--host-id=1",
        "--model=tpu-v6e-slice",
        "--topology=4x4",
        "--chips=4",
        f"--exit-nothing={EXIT_PERMANENT}",
        f"--log-file={log}",
    ]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": pythonpath}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_a_host_without_libtpu_serves_nothing_and_says_so_once(tmp_path):
    # This machine's venv may hold the libtpu wheel: a package of that name that fails to import
    # stands for its absence.
    absent = tmp_path / "absent" / "libtpu"
    absent.mkdir(parents=True)
    (absent / "__init__.py").write_text("raise ImportError('No module named libtpu')\n")
    result = _run_exporter(tmp_path, pythonpath=str(absent.parent))
    assert result.returncode == EXIT_PERMANENT, result.stderr
    lines = (tmp_path / "boot.log").read_text().splitlines()
    assert len(lines) == 1 and "no libtpu here" in lines[0], lines


@pytest.mark.skipif(
    any(Path("/dev").glob("accel*")) or any(Path("/dev/vfio").glob("[0-9]*")), reason="this machine has chips"
)
def test_a_host_with_libtpu_but_no_chips_serves_nothing_and_says_so_once(tmp_path):
    result = _run_exporter(tmp_path, pythonpath=str(tpu_runtime.SITE_DIR))  # the simulated libtpu
    assert result.returncode == EXIT_PERMANENT, result.stderr
    lines = (tmp_path / "boot.log").read_text().splitlines()
    assert len(lines) == 1 and "no TPU chips here" in lines[0], lines


def test_an_accelerator_id_with_a_dash_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        argv = ["--bind=127.0.0.1", "--port=1", "--host-id=a-b", "--model=m", "--topology=t"]
        tpu_metrics.main([*argv, "--chips=4", "--exit-nothing=78"])


def test_only_the_hosts_of_the_cluster_reach_the_metrics_port():
    """No firewall rule with a source range (the internet, IAP, the dashboard's ranges) allows
    the metrics port; the internal rule, host to host by tag, does."""
    spec = spec_module.load(
        {"acceleratorType": "v6e-16", "dashboardSourceRanges": ["10.0.0.0/8"]}, require_zone=False
    )
    port = str(names.TPU_METRICS_PORT)
    for rule in firewall_rules(spec):
        if rule.deny:
            continue
        reaches = any(not ports or port in ports for _, ports in rule.protocols)
        assert not (reaches and rule.source_ranges), rule
        if reaches:
            assert rule.source_tags == rule.target_tags, rule


def test_the_boot_script_carries_the_exporter_and_ray_is_pointed_at_it():
    from rayslice.startup_scripts import render
    from rayslice.startup_scripts.options import RenderOptions

    spec = spec_module.load({"acceleratorType": "v6e-16"}, require_zone=False)
    script = render(spec, RenderOptions())
    assert "start_supervisor rayslice-tpu-metrics serve-tpu-metrics" in script
    assert 'export TPU_DEVICE_PLUGIN_ADDR="$MY_IP:$TPU_METRICS_PORT"' in script
    assert f"TPU_METRICS_PORT={names.TPU_METRICS_PORT}" in script
    assert "TPU_METRICS_MODEL=tpu-v6e-slice" in script


def test_the_exporter_module_is_standard_library_only():
    """The hosts do not install rayslice: the carried file may import nothing of it."""
    spec = importlib.util.find_spec("rayslice.startup_scripts.tpu_metrics")
    assert spec is not None and spec.origin is not None
    text = Path(spec.origin).read_text()
    assert "import rayslice" not in text and "from rayslice" not in text


RAY_DRIVER = """
import sys, time, urllib.request
import ray

port = int(sys.argv[1])
ray.init(address="local", num_cpus=1, _metrics_export_port=port, _temp_dir=sys.argv[2])
lines = []
deadline = time.time() + 120
while time.time() < deadline:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        text = ""
    lines = [line for line in text.splitlines() if line.startswith("ray_tpu_")]
    if any(line.startswith("ray_tpu_duty_cycle{") for line in lines):
        break
    time.sleep(1)
print("\\n".join(lines))
ray.shutdown()
"""


@pytest.mark.slow
def test_rays_own_metrics_endpoint_serves_the_chips_gauges(tmp_path, monkeypatch):
    """A real Ray node (its own dashboard agent) started with TPU_DEVICE_PLUGIN_ADDR at the
    exporter, the exporter on the simulated library: Ray's metrics endpoint serves tpu_duty_cycle,
    tpu_tensorcore_utilization and tpu_memory_used for every chip, busy chips busy."""
    monitoring = simulated_libtpu.sdk(monkeypatch).tpumonitoring
    runtime = sys.modules["rayslice_simulated_tpu"]
    monkeypatch.setattr(runtime, "host_chips", lambda: 4)
    monkeypatch.setenv(runtime.STATE_DIR_VAR, str(tmp_path / "state"))
    monkeypatch.setenv(runtime.HBM_BYTES_VAR, str(32 * 2**30))
    (tmp_path / "state").mkdir()
    record = {"pid": os.getpid(), "chips": [1, 3], "hbm_bytes": [7 * 2**20, 9 * 2**20]}
    record |= {"duty_cycle_pct": 88.0, "tensorcore_util_pct": 35.0}

    def page() -> str:
        record["time"] = time.time()  # this process still samples
        (tmp_path / "state" / f"{os.getpid()}.json").write_text(json.dumps(record))
        return tpu_metrics.render(tpu_metrics.read_library(monitoring), 4, "77", "tpu-v6e-slice", "2x2")

    port = free_port()
    with exporter(page) as address:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "TPU_DEVICE_PLUGIN_ADDR": address,
            "REPORTER_UPDATE_INTERVAL_MS": "1000",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        ray_tmp = Path("/tmp") / f"rs-tpu-{os.getpid()}"  # short: Ray's socket paths must fit
        try:
            result = subprocess.run(
                [sys.executable, "-c", RAY_DRIVER, str(port), str(ray_tmp)],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
        finally:
            subprocess.run(["rm", "-rf", str(ray_tmp)], check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    gauges: dict[str, dict[str, float]] = {}
    for line in result.stdout.splitlines():
        name, labels_value = line.split("{", 1)
        labels, value = labels_value.rsplit("} ", 1)
        index = dict(part.split("=", 1) for part in labels.split(","))["TpuIndex"].strip('"')
        gauges.setdefault(name, {})[index] = float(value)
    assert gauges["ray_tpu_duty_cycle"] == {"0": 0.0, "1": 88.0, "2": 0.0, "3": 88.0}, result.stdout
    assert gauges["ray_tpu_tensorcore_utilization"] == {"0": 0.0, "1": 35.0, "2": 0.0, "3": 35.0}
    assert gauges["ray_tpu_memory_used"] == {"0": 0.0, "1": 7 * 2**20, "2": 0.0, "3": 9 * 2**20}
