"""The simulated TPU runtime: unmodified programs see a simulated host's chips as on a TPU host.

The guide's own scripts (tests/fixtures/guide, verbatim) run on simulated slices booted by the
real boot script, submitted with `rayslice run` as a user would, on the shared clusters: a v5p-16
on TPU VMs (2 hosts x 4 chips, its head on worker 0) and a v6e-4 (one host). A first test checks
the runtime alone, without Ray: two processes in a mount namespace that has `/dev/accel*` join one
JAX program by themselves.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from rayslice import catalog, chip_metrics
from rayslice.local.host import tpu_runtime
from rayslice.local.simulation import status
from rayslice.local.simulation.simulator import Simulation
from rayslice.local.simulation.state import ROLE_HEAD, ROLE_WORKER
from tests.integration.clusters import on, raylet_environment, rayslice_run, run_command
from tests.startup_scripts.sandbox import free_port


def run_script(sim: Simulation, script: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`rayslice run SCRIPT --address URL [--token-file F]`, as a user types it."""
    return rayslice_run(sim, str(script), timeout=timeout)


def guide_script(fixtures_dir: Path, name: str, tmp_path: Path) -> Path:
    """The guide's script `name`, unchanged, alone in a folder (rayslice run uploads the folder)."""
    folder = tmp_path / name.removesuffix(".py")
    folder.mkdir()
    script = folder / name
    script.write_text((fixtures_dir / "guide" / f"{name}.txt").read_text())
    return script


def printed_lists(output: str) -> list[list[int]]:
    return [ast.literal_eval(line) for line in output.splitlines() if re.fullmatch(r"\[[\d, ]*\]", line)]


# ---- the runtime alone --------------------------------------------------------------------------

TWO_PROCESSES = r"""
set -e
mount -t tmpfs tmpfs "$WORK"
mkdir "$WORK/u" "$WORK/w"
mount -t overlay overlay -o "lowerdir=/dev,upperdir=$WORK/u,workdir=$WORK/w" /dev
for i in 0 1 2 3; do : >"/dev/accel$i"; done
TPU_WORKER_ID=0 "$PYTHON" "$PROGRAM" "$MODE" >"$OUT/0" 2>&1 &
TPU_WORKER_ID=1 "$PYTHON" "$PROGRAM" "$MODE" >"$OUT/1" 2>&1
wait
"""

PROGRAM = """
import sys
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

if sys.argv[1] == "explicit":
    jax.distributed.initialize()
mesh = jax.make_mesh((jax.device_count(),), ("d",))
ones = jax.make_array_from_process_local_data(
    NamedSharding(mesh, PartitionSpec("d")), jnp.ones((jax.local_device_count(),))
)
print("RESULT", jax.process_index(), jax.device_count(), jax.local_device_count(), int(jnp.sum(ones)))
"""


@pytest.mark.parametrize("mode", ["implicit", "explicit"])
def test_two_hosts_worth_of_processes_join_one_jax_program(tmp_path, mode):
    """Whole-host processes of a 2-host slice see 8 devices, with or without initialize()."""
    (tmp_path / "work").mkdir()
    (tmp_path / "out").mkdir()
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    env = {
        **tpu_runtime.environment(catalog.generation("v6e")),
        # A port of its own: the two parametrizations may run at once on two xdist workers, and a
        # process that found the other test's coordinator on a shared port would wait for ever.
        tpu_runtime.COORDINATOR_PORT_VAR: str(free_port()),
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "TPU_WORKER_HOSTNAMES": "127.0.0.1,127.0.0.1",
        "WORK": str(tmp_path / "work"),
        "OUT": str(tmp_path / "out"),
        "PYTHON": sys.executable,
        "PROGRAM": str(program),
        "MODE": mode,
    }
    try:
        subprocess.run(
            ["unshare", "--mount", "--fork", "bash", "-c", textwrap.dedent(TWO_PROCESSES)],
            env=env,
            timeout=300,
            check=True,
        )
    finally:
        files = [tmp_path / "out" / str(i) for i in (0, 1)]
        outputs = [f.read_text() if f.exists() else "" for f in files]
        print(*outputs, sep="\n----\n")  # pytest shows it when the run fails or hangs
    results = sorted(re.findall(r"^RESULT .*$", "\n".join(outputs), re.M))
    assert results == ["RESULT 0 8 4 8", "RESULT 1 8 4 8"], outputs
    assert not Path("/dev/accel0").exists()  # the chips stayed inside the namespace


# ---- the guide's scripts on simulated slices -----------------------------------------------------


@on("v6e-4")
def test_guide_single_host_jax_script_prints_the_hosts_chips(cluster, fixtures_dir, tmp_path):
    result = run_script(cluster, guide_script(fixtures_dir, "ray-jax-single-host.py", tmp_path))
    assert result.returncode == 0
    assert str(cluster.spec().tpu.chips_per_host) in result.stdout.splitlines()


@on("v5p-16 tpu-vm")
def test_guide_multi_host_jax_script_sees_the_whole_slice_from_every_host(cluster, fixtures_dir, tmp_path):
    result = run_script(cluster, guide_script(fixtures_dir, "ray-jax-multi-host.py", tmp_path))
    assert result.returncode == 0
    [counts] = printed_lists(result.stdout)
    # One Ray cluster spans the slice, so the script's `ray.available_resources()["TPU"]` is the
    # slice's chips (the guide's comment says 4: there, each host runs the script against its own
    # Ray): that many tasks of 4 chips, one per host at a time; each sees every device of the slice.
    chips = cluster.spec().tpu.chips
    assert counts == [chips] * chips


@on("v5p-16 tpu-vm")
def test_rays_tpu_helpers_answer_inside_a_task_as_on_a_tpu_host(cluster, tmp_path):
    script = tmp_path / "helpers.py"
    script.write_text(
        textwrap.dedent(
            """
            import glob
            import os

            import ray
            import ray.util.tpu

            @ray.remote(resources={"TPU": 4})
            def helpers():
                # A v5p host's chips are VFIO groups, as on hardware: Ray counts those whose PCI
                # vendor is Google's.
                assert not glob.glob("/dev/accel*") and os.listdir("/dev/vfio")
                return ray.util.tpu.get_current_pod_worker_count(), ray.util.tpu.get_num_tpu_chips_on_node()

            print("HELPERS", ray.get(helpers.remote()))
            """
        )
    )
    result = run_script(cluster, script)
    assert result.returncode == 0
    tpu = cluster.spec().tpu
    assert f"HELPERS ({tpu.hosts}, {tpu.chips_per_host})" in result.stdout.splitlines()


@on("v6e-4")
def test_guide_pytorch_xla_single_device_script_prints_an_xla_device(cluster, fixtures_dir, tmp_path):
    result = run_script(cluster, guide_script(fixtures_dir, "workload.py", tmp_path))
    assert result.returncode == 0
    assert "xla:0" in result.stdout.splitlines()
    assert "device='xla:0')" in result.stdout


@on("v6e-4")
def test_guide_torch_xla_launch_runs_on_every_chip_of_the_host(cluster, fixtures_dir, tmp_path):
    result = run_script(cluster, guide_script(fixtures_dir, "workload-multi-device.py", tmp_path))
    assert result.returncode == 0
    # On CPU, torch_xla.launch runs one thread per device (xla:0..xla:3); a TPU host runs one
    # process per chip, each printing xla:0. Either way: four devices ran the function. The
    # threads print at once, so one line may hold two devices ("xla:2xla:3"): count the devices
    # printed bare (`print(t.device)`), not the lines.
    chips = [str(i) for i in range(cluster.spec().tpu.chips_per_host)]
    devices = re.findall(r"(?<!')xla:(\d+)", result.stdout)
    assert sorted(devices) == chips
    assert sorted(re.findall(r"device='xla:(\d+)'", result.stdout)) == chips


# ---- the chips' figures and coordinates (issue 42) --------------------------------------------------


def _duty(sim: Simulation) -> dict[str, list[float]]:
    """Each TPU host's chips' duty cycle as `rayslice local status` reads them; {} while unreadable."""
    hosts = {h.name: h.ip for h in sim.plan.hosts if h.role in (ROLE_HEAD, ROLE_WORKER)}
    answers = chip_metrics.read_hosts(hosts)
    if any("error" in a or not a["chips"] for a in answers.values()):
        return {}
    return {name: [c["duty_cycle_pct"] for c in a["chips"]] for name, a in answers.items()}


RAY_TPU_GAUGES = ("tpu_duty_cycle", "tpu_tensorcore_utilization", "tpu_memory_used")


def _rays_gauges(sim: Simulation, host: str) -> dict[str, dict[str, float]]:
    """Ray's own metrics endpoint on the host, as a Prometheus server scrapes it (the node's
    metrics export port, which Ray picks at start and its dashboard lists): each of
    `RAY_TPU_GAUGES` by chip (its ``TpuIndex`` label); {} while it does not serve them."""
    ip = sim.plan.host(host).ip
    request = urllib.request.Request(f"{sim.dashboard_url()}/nodes?view=summary")
    request.add_header("Authorization", f"Bearer {sim.token_file.read_text().strip()}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    with opener.open(request, timeout=30) as response:
        nodes = json.load(response)["data"]["summary"]
    [port] = [n["raylet"]["metricsExportPort"] for n in nodes if n["raylet"].get("nodeManagerAddress") == ip]
    url = f"http://{ip}:{port}/metrics"
    probe = f"import urllib.request as u; print(u.urlopen({url!r}, timeout=10).read().decode())"
    result = sim.exec_in(host, [sys.executable, "-c", probe])
    found: dict[str, dict[str, float]] = {}
    for name, labels, value in re.findall(r"^ray_(tpu_\w+)\{([^}]*)\} (\S+)$", result.stdout, re.M):
        chip = re.search(r'TpuIndex="(\d+)"', labels)
        if name in RAY_TPU_GAUGES and chip:
            found.setdefault(name, {})[chip[1]] = float(value)
    return found


def _rays_gauges_read(sim: Simulation, host: str, duty) -> dict[str, dict[str, float]] | None:
    """`_rays_gauges` once all three are served for every chip of the host and each chip's duty
    cycle passes `duty`; else None."""
    gauges = _rays_gauges(sim, host)
    chips = {str(i) for i in range(sim.spec().tpu.chips_per_host)}
    served = all(set(gauges.get(name, {})) == chips for name in RAY_TPU_GAUGES)
    return gauges if served and all(duty(v) for v in gauges["tpu_duty_cycle"].values()) else None


def _rays_reading(sim: Simulation, host: str) -> list[dict]:
    """Ray 2.60's reporter agent's own reading of the host's endpoint, run inside the host with the
    address its raylet (and so its agent) was given."""
    address = raylet_environment(sim, host)["TPU_DEVICE_PLUGIN_ADDR"]
    probe = (
        "import json; from ray.dashboard.modules.reporter import reporter_agent as r; "
        "print(json.dumps(r.ReporterAgent._get_tpu_usage()))"
    )
    result = sim.exec_in(host, [sys.executable, "-c", probe], env={"TPU_DEVICE_PLUGIN_ADDR": address})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@on("v6e-4")
def test_a_training_job_makes_its_chips_read_busy_and_the_cluster_idle_after(cluster, tmp_path):
    """The done-when of issue 42 on a simulated slice: while `jax_train` runs, every chip reads busy
    in Ray's own metrics endpoint (its tpu_* gauges, this cluster runs with Ray's metrics on:
    clusters.SHARED_ENVIRONMENT), in Ray's own reading of the host's endpoint and in `status`;
    the idle cluster reads idle before and after, HBM following the arrays the job held."""
    [host] = [h.name for h in cluster.plan.hosts if h.role in (ROLE_HEAD, ROLE_WORKER)]
    idle = _wait(lambda: (d := _duty(cluster)) and all(v < 5 for v in d[host]) and d, 60)
    assert idle, _duty(cluster)
    idle_gauges = _wait(lambda: _rays_gauges_read(cluster, host, lambda duty: duty < 5), 60)
    assert idle_gauges, _rays_gauges(cluster, host)
    before = _rays_reading(cluster, host)
    assert [c["index"] for c in before] == [0, 1, 2, 3] and all(c["duty_cycle"] < 5 for c in before)
    assert {c["tpu_type"] for c in before} == {"tpu-v6e-slice"} and {c["memory_total"] for c in before} == {
        32 * 2**30
    }
    # A job that runs until the test has seen what it needs, however slow the machine: more steps
    # than it will reach, stopped with SIGTERM on `rayslice run --stop-on-interrupt` (which stops
    # the Ray job too, issue 42 item 7). A job that ended by itself could end between the readings.
    argv, env = run_command(cluster, "jax_train", "--steps", "1000000", "--batch-per-device", "32")
    argv.insert(argv.index("jax_train"), "--stop-on-interrupt")
    said = tmp_path / "run.err"
    with said.open("w") as err:
        run = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        busy = _wait(lambda: (d := _duty(cluster)) and all(v > 50 for v in d[host]) and d, 300)
        assert busy, _duty(cluster)
        # Read apart from `_duty`, a moment later: a loaded machine can leave a chip a sample short
        # of busy at that moment, so Ray's reading gets the same wait, not one look.
        during = _wait(
            lambda: (
                (r := _rays_reading(cluster, host))
                and all(c["duty_cycle"] > 50 and c["memory_used"] > 0 for c in r)
                and r
            ),
            120,
        )
        assert during, _rays_reading(cluster, host)
        text = status.format_report(status.status_report(cluster))
        assert re.search(rf"^  {host}: 0: \d+% \d+\.\d/32\.0", text, re.M), text
        gauges = _wait(lambda: _rays_gauges_read(cluster, host, lambda duty: duty > 50), 60)
        assert gauges, _rays_gauges(cluster, host)
        assert all(v > 0 for v in gauges["tpu_memory_used"].values()), gauges
        assert run.poll() is None, said.read_text()[-3000:]  # still training: nothing ended early
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=120) == 130, said.read_text()[-3000:]
        assert "interrupted: asked Ray to stop job" in said.read_text()
    finally:
        run.kill()
    after = _wait(lambda: (d := _duty(cluster)) and all(v < 5 for v in d[host]) and d, 180)
    assert after, _duty(cluster)


def _wait(probe, timeout_s: float):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        found = probe()
        if found:
            return found
        time.sleep(1)
    return None
