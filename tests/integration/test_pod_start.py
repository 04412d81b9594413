"""The pod start script run the way a KubeRay pod runs it, on this machine.

A pod's environment is rebuilt from the generated RayCluster itself: literal env values as
written, downward-API entries resolved from a fake pod's labels and IP (a missing label reads
as "", as in Kubernetes), and KUBERAY_GEN_RAY_START_CMD generated from the manifest's
rayStartParams by KubeRay v1.7.0's rules. Each run gets a private mount namespace whose
/etc/hosts maps the per-host Service names to loopback addresses, so name resolution is real
and the machine's /etc/hosts is never touched.
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

import pytest

from rayslice import spec as specs
from rayslice.infra.gke import kuberay
from rayslice.startup_scripts import pod

VENV = Path(sys.executable).parent.parent


def kuberay_start_command(ray_start_params: dict[str, str], address: str) -> str:
    """`ray start` as KubeRay v1.7.0 builds a worker's (setMissingRayStartParams, then
    convertParamMap): defaults only where unset, --block always, sorted flags, "true" as a bare
    switch, every other value pasted unquoted into the command line."""
    params = {
        "address": address,
        "metrics-export-port": "8080",
        "dashboard-agent-listen-port": "52365",
        **ray_start_params,
        "block": "true",
    }
    flags = "".join(
        f" --{k} " if params[k].lower() == "true" else f" --{k}={params[k]} " for k in sorted(params)
    )
    return f"ray start {flags}"


def gke_spec(accelerator: str, slices: int, **extra) -> specs.ClusterSpec:
    return specs.load(
        {
            "platform": "gke",
            "acceleratorType": accelerator,
            "zone": "us-east5-b",
            "slices": slices,
            "name": "demo",
            "rayAuth": "none",
            **extra,
        }
    )


def hosts_file(tmp_path: Path, cluster_spec: specs.ClusterSpec) -> tuple[Path, dict[str, str]]:
    """/etc/hosts for the namespace: every per-host Service name -> its own 127.0.0.x."""
    names = [s["metadata"]["name"] for s in kuberay.host_services(cluster_spec)]
    ips = {name: f"127.0.0.{10 + i}" for i, name in enumerate(names)}
    path = tmp_path / "hosts"
    path.write_text("127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for name, ip in ips.items()))
    return path, ips


def pod_env(
    cluster_spec: specs.ClusterSpec, labels: dict[str, str], pod_ip: str, start_cmd: str, home: Path
) -> dict[str, str]:
    """The worker container's environment, read from the manifest as the kubelet would."""
    [group] = kuberay.raycluster_manifest(cluster_spec)["spec"]["workerGroupSpecs"]
    [container] = group["template"]["spec"]["containers"]
    fields = {f"metadata.labels['{k}']": v for k, v in labels.items()} | {"status.podIP": pod_ip}
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "KUBERAY_GEN_RAY_START_CMD": start_cmd,
        "RAY_START_ULIMIT_OPEN_FILES": str(os.sysconf("SC_OPEN_MAX")),
    }
    for entry in container["env"]:
        env[entry["name"]] = (
            entry["value"]
            if "value" in entry
            else fields.get(entry["valueFrom"]["fieldRef"]["fieldPath"], "")
        )
    return env


def pod_command(script: Path, hosts: Path) -> list[str]:
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "bash",
        "-c",
        'mount --bind "$1" /etc/hosts && exec bash "$2"',
        "pod",
        str(hosts),
        str(script),
    ]


def write_script(tmp_path: Path, cluster_spec: specs.ClusterSpec, package_source: str) -> Path:
    script = tmp_path / "pod-start.sh"
    script.write_text(
        kuberay.pod_start_configmap(cluster_spec, package_source)["data"][kuberay.POD_START_FILE]
    )
    return script


@pytest.fixture
def fake_ray(tmp_path: Path) -> Path:
    """A venv whose `ray` records its arguments and environment instead of starting Ray."""
    venv = tmp_path / "fake-venv"
    (venv / "bin").mkdir(parents=True)
    ray = venv / "bin" / "ray"
    ray.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, open(os.environ['FAKE_RAY_OUT'], 'w'))\n"
    )
    ray.chmod(0o755)
    return venv


def run_fake_pod(
    tmp_path, fake_ray, cluster_spec, labels, pod_ip, **extra_env
) -> tuple[subprocess.CompletedProcess, dict | None]:
    hosts, _ = hosts_file(tmp_path, cluster_spec)
    script = write_script(tmp_path, cluster_spec, f"venv:{fake_ray}")
    [group] = kuberay.raycluster_manifest(cluster_spec)["spec"]["workerGroupSpecs"]
    out = tmp_path / f"ray-{uuid.uuid4().hex}.json"
    env = pod_env(
        cluster_spec,
        labels,
        pod_ip,
        kuberay_start_command(group["rayStartParams"], "head.invalid:6379"),
        tmp_path,
    )
    env.update(FAKE_RAY_OUT=str(out), **extra_env)
    result = subprocess.run(pod_command(script, hosts), env=env, capture_output=True, text=True, timeout=60)
    return result, json.loads(out.read_text()) if out.exists() else None


def test_every_host_of_a_multislice_cluster_gets_its_identity(tmp_path, fake_ray):
    cluster_spec = gke_spec("v6e-16", slices=2)
    _, ips = hosts_file(tmp_path, cluster_spec)
    for slice_index in range(2):
        for host in range(4):
            own = f"demo-s{slice_index}-h{host}"
            labels = {pod.LABEL_REPLICA_INDEX: str(slice_index), pod.LABEL_HOST_INDEX: str(host)}
            result, started = run_fake_pod(tmp_path, fake_ray, cluster_spec, labels, ips[own])
            assert result.returncode == 0, result.stderr
            env = started["env"]
            assert env["TPU_WORKER_ID"] == str(host)
            assert env["TPU_WORKER_HOSTNAMES"] == ",".join(f"demo-s{slice_index}-h{h}" for h in range(4))
            assert env["TPU_NAME"] == f"demo-slice-{slice_index}"
            assert (
                env["MEGASCALE_COORDINATOR_ADDRESS"],
                env["MEGASCALE_NUM_SLICES"],
                env["MEGASCALE_SLICE_ID"],
                env["MEGASCALE_PORT"],
            ) == ("demo-s0-h0", "2", str(slice_index), "8081")
            assert env["TPU_ACCELERATOR_TYPE"] == "v6e-16" and env["TPU_TOPOLOGY"] == "4x4"
            argv = started["argv"]
            assert argv[0] == "start" and "--block" in argv and "--address=head.invalid:6379" in argv
            assert '--resources={"TPU": 4}' in argv  # KubeRay's quoting survived the eval


def test_single_host_slice_needs_no_host_label(tmp_path, fake_ray):
    cluster_spec = gke_spec("v6e-4", slices=1)
    _, ips = hosts_file(tmp_path, cluster_spec)
    result, started = run_fake_pod(
        tmp_path, fake_ray, cluster_spec, {pod.LABEL_REPLICA_INDEX: "0"}, ips["demo-s0-h0"]
    )
    assert result.returncode == 0, result.stderr
    env = started["env"]
    assert (env["TPU_WORKER_ID"], env["TPU_WORKER_HOSTNAMES"], env["TPU_NAME"]) == (
        "0",
        "demo-s0-h0",
        "demo-slice-0",
    )
    assert not any(key.startswith("MEGASCALE_") for key in env)


@pytest.mark.parametrize(
    "labels,message",
    [
        ({pod.LABEL_REPLICA_INDEX: "0"}, "RAYSLICE_HOST_INDEX='' is not an index"),
        (
            {pod.LABEL_REPLICA_INDEX: "0", pod.LABEL_HOST_INDEX: "4"},
            "RAYSLICE_HOST_INDEX=4 is out of range (expected 0..3)",
        ),
        (
            {pod.LABEL_REPLICA_INDEX: "2", pod.LABEL_HOST_INDEX: "0"},
            "RAYSLICE_REPLICA_INDEX=2 is out of range (expected 0..1)",
        ),
    ],
    ids=["missing-host-label", "host-out-of-range", "replica-out-of-range"],
)
def test_bad_labels_stop_the_pod_before_ray(tmp_path, fake_ray, labels, message):
    result, started = run_fake_pod(tmp_path, fake_ray, gke_spec("v6e-16", slices=2), labels, "127.0.0.10")
    assert result.returncode == 1 and message in result.stderr
    assert started is None


def test_a_name_that_resolves_elsewhere_stops_the_pod(tmp_path, fake_ray):
    labels = {pod.LABEL_REPLICA_INDEX: "0", pod.LABEL_HOST_INDEX: "1"}  # demo-s0-h1 is 127.0.0.11
    result, started = run_fake_pod(
        tmp_path, fake_ray, gke_spec("v6e-16", slices=1), labels, "127.0.0.99", RAYSLICE_DNS_DEADLINE_S="1"
    )
    assert result.returncode == 1 and "demo-s0-h1 does not resolve to this pod (127.0.0.99)" in result.stderr
    assert started is None


# ---- real Ray ------------------------------------------------------------------------------


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
    ports = dict(zip(names, map(str, free_ports(len(names)))))
    ports.update({"min-worker-port": str(first), "max-worker-port": str(first + 40)})
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
ray.init(address=sys.argv[1])
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

print(json.dumps({"resources": node["Resources"], "labels": node.get("Labels", {}), "env": ray.get(env.remote(), timeout=120)}))
"""


def test_worker_pod_joins_a_real_head_with_its_tpu_identity(tmp_path):
    cluster_spec = gke_spec("v6e-16", slices=2)
    hosts, ips = hosts_file(tmp_path, cluster_spec)
    script = write_script(tmp_path, cluster_spec, f"venv:{VENV}")
    marker = uuid.uuid4().hex
    home = tmp_path / "home"
    home.mkdir()
    temp_dir = Path(f"/tmp/rs-{marker[:8]}")
    gcs_port, client_port, worker_base = free_ports(2) + [20000 + int(marker[:4], 16) % 20000]
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
        worker = subprocess.Popen(
            pod_command(script, hosts),
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "pod.log", "w"),
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
