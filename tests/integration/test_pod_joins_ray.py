"""A worker pod's start script joins a real Ray head with its TPU identity.

The pod runs as test_pod_start.py runs it (its environment rebuilt from the generated RayCluster,
a private /etc/hosts), but with this project's real Ray instead of a recording fake, against a
real head on loopback. A module of its own so that the suite's scheduler (tests/conftest.py) can
give this test, which starts Ray, to a Ray worker and test_pod_start.py's, which do not, to any.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

from rayslice.infra.gke import kuberay
from rayslice.startup_scripts import pod
from tests.integration.test_pod_start import (
    VENV,
    gke_spec,
    hosts_file,
    kuberay_start_command,
    pod_command,
    pod_env,
    write_script,
)


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def node_ports(first: int) -> dict[str, str]:
    """Per-node ports away from the defaults other Ray users on this machine take."""
    names = [
        "node-manager-port",
        "object-manager-port",
        "dashboard-agent-grpc-port",
        "dashboard-agent-listen-port",
        "metrics-export-port",
        "runtime-env-agent-port",
    ]
    workers = range(first, first + 41)
    # Free ports come from the kernel's ephemeral range, which the worker range may overlap; Ray
    # refuses to start a node whose pinned port lies in its worker range (seen in CI), so draw again.
    picked = free_ports(len(names))
    while any(port in workers for port in picked):
        picked = free_ports(len(names))
    ports = dict(zip(names, map(str, picked), strict=True))
    ports.update({"min-worker-port": str(workers[0]), "max-worker-port": str(workers[-1])})
    return ports


def stop(process: subprocess.Popen, marker: str) -> None:
    """Stop one test's Ray: its process group, then any process carrying its marker (by PID)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=30)
            break
        except subprocess.TimeoutExpired:
            continue
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f"RAYSLICE_TEST_MARKER={marker}".encode() in (proc / "environ").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


PROBE = """
import json, os, sys, time, ray
# Workers' own lines (libtpu's "No hardware is found" warning) stay in their logs: streamed to this
# driver, one could arrive after the result, which must be the last line of its output.
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.time() + 120
while time.time() < deadline:
    tpu_nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("TPU")]
    if tpu_nodes:
        break
    time.sleep(1)
node = tpu_nodes[0]

@ray.remote(resources={"TPU": 1})
def env():
    return {k: v for k, v in os.environ.items() if k.startswith(("TPU_", "MEGASCALE_"))}

result = {"resources": node["Resources"], "labels": node.get("Labels", {})}
print(json.dumps({**result, "env": ray.get(env.remote(), timeout=120)}))
"""


def test_worker_pod_joins_a_real_head_with_its_tpu_identity(tmp_path):
    cluster_spec = gke_spec("v6e-16", slices=2)
    hosts, ips = hosts_file(tmp_path, cluster_spec)
    script = write_script(tmp_path, cluster_spec, f"venv:{VENV}")
    marker = uuid.uuid4().hex
    home = tmp_path / "home"
    home.mkdir()
    temp_dir = Path(f"/tmp/rs-{marker[:8]}")
    gcs_port, client_port, worker_base = [*free_ports(2), 20000 + int(marker[:4], 16) % 20000]
    common = {
        "PATH": f"{VENV}/bin:{os.environ['PATH']}",
        "HOME": str(home),
        "RAY_AUTH_MODE": "disabled",
        "RAYSLICE_TEST_MARKER": marker,
        "RAY_TMPDIR": str(temp_dir),
    }
    head_ports = node_ports(worker_base)
    head = subprocess.Popen(
        [
            "ray",
            "start",
            "--head",
            "--block",
            f"--port={gcs_port}",
            "--node-ip-address=127.0.0.1",
            f"--ray-client-server-port={client_port}",
            f"--temp-dir={temp_dir}",
            "--include-dashboard=false",
            "--num-cpus=1",
            "--object-store-memory=100000000",
            *(f"--{k}={v}" for k, v in head_ports.items()),
        ],
        env=common,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker = None
    try:
        [group] = kuberay.raycluster_manifest(cluster_spec)["spec"]["workerGroupSpecs"]
        params = {
            **group["rayStartParams"],
            **node_ports(worker_base + 50),
            "num-cpus": "1",
            "object-store-memory": "100000000",
        }
        labels = {pod.LABEL_REPLICA_INDEX: "1", pod.LABEL_HOST_INDEX: "2"}
        env = pod_env(
            cluster_spec,
            labels,
            ips["demo-s1-h2"],
            kuberay_start_command(params, f"127.0.0.1:{gcs_port}"),
            home,
        )
        env.update({k: v for k, v in common.items() if k != "HOME"})
        with (tmp_path / "pod.log").open("w") as pod_log:  # the child keeps its own descriptor
            worker = subprocess.Popen(
                pod_command(script, hosts),
                env=env,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=pod_log,
            )
        probe = subprocess.run(
            [sys.executable, "-c", PROBE, f"127.0.0.1:{gcs_port}"],
            env=common,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert probe.returncode == 0, probe.stderr[-3000:] + (tmp_path / "pod.log").read_text()[-3000:]
        seen = json.loads(probe.stdout.strip().splitlines()[-1])
    finally:
        if worker is not None:
            stop(worker, marker)
        stop(head, marker)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert seen["resources"]["TPU"] == 4
    assert seen["resources"]["demo-slice-1"] == 1  # Ray's slice resource, from TPU_NAME
    assert "TPU-v6e-16-head" not in seen["resources"]  # only worker 0 carries it
    assert seen["labels"]["ray.io/tpu-worker-id"] == "2"
    assert seen["labels"]["ray.io/tpu-slice-name"] == "demo-slice-1"
    assert seen["labels"]["ray.io/tpu-topology"] == "4x4"
    assert seen["env"]["TPU_WORKER_HOSTNAMES"] == "demo-s1-h0,demo-s1-h1,demo-s1-h2,demo-s1-h3"
    assert seen["env"]["MEGASCALE_SLICE_ID"] == "1"
