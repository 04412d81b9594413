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
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rayslice import spec as specs
from rayslice.infra.gke import kuberay
from rayslice.startup_scripts import pod
from rayslice.startup_scripts.templating import render_template

VENV = Path(sys.executable).parent.parent


KUBERAY_SOURCE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "kuberay-v1.7.0-start-command" / "pod.go.excerpt.txt"
).read_text()


def _go(pattern: str) -> str:
    match = re.search(pattern, KUBERAY_SOURCE)
    assert match, f"KubeRay excerpt lacks {pattern}"
    return match.group(1)


# Everything below is read out of KubeRay v1.7.0's own code (tests/fixtures/…/SOURCE.md).
HEAD_FORMAT = _go(r'rayStartCmd = fmt\.Sprintf\("(ray start --head %s)"')
WORKER_FORMAT = _go(r'rayStartCmd = fmt\.Sprintf\("(ray start %s)"')
OPTION_FORMAT = _go(r'fmt\.Fprintf\(flags, "( --%s=%s )"')
SWITCH_FORMAT = _go(r'fmt\.Fprintf\(flags, "( --%s )"')
SPECIAL_BOOLEANS = re.findall(r'"([a-z-]+)"', _go(r"specialParameterOptions := \[\]string\{([^}]*)\}"))
METRICS_PORT = _go(r"DefaultMetricsPort\s*=\s*(\d+)")
AGENT_PORT = _go(r"DefaultDashboardAgentListenPort\s*=\s*(\d+)")
AUTH_MODE_VAR = _go(r'RAY_AUTH_MODE_ENV_VAR\s*=\s*"([A-Z_]+)"')
AUTH_TOKEN_VAR = _go(r'RAY_AUTH_TOKEN_ENV_VAR\s*=\s*"([A-Z_]+)"')
HEAD_DASHBOARD_HOST = _go(r'rayStartParams\["dashboard-host"\] = "([^"]+)"')


def kuberay_start_command(ray_start_params: dict[str, str], address: str | None) -> str:
    """KUBERAY_GEN_RAY_START_CMD as KubeRay v1.7.0 builds it (setMissingRayStartParams, then
    generateRayStartCommand / convertParamMap), for a worker (`address`) or the head (None)."""
    params = dict(ray_start_params)
    if address is not None:
        params.setdefault("address", address)
    else:
        params.setdefault("dashboard-host", HEAD_DASHBOARD_HOST)
    params.setdefault("metrics-export-port", METRICS_PORT)
    params["block"] = "true"
    params.setdefault("dashboard-agent-listen-port", AGENT_PORT)
    flags = ""
    for option in sorted(params):
        argument = params[option]
        if argument.lower() in ("true", "false") and option not in SPECIAL_BOOLEANS:
            if argument.lower() == "true":
                flags += SWITCH_FORMAT.replace("%s", option)
        else:
            flags += OPTION_FORMAT.replace("%s", option, 1).replace("%s", argument, 1)
    return (WORKER_FORMAT if address is not None else HEAD_FORMAT).replace("%s", flags)


def test_the_start_command_model_follows_kuberays_code():
    """Pinned against literals, so a misread excerpt cannot pass by agreeing with itself."""
    command = kuberay_start_command({"resources": "'{\"TPU\": 4}'", "num-cpus": "8"}, "h:6379")
    assert command == (
        "ray start  --address=h:6379  --block  --dashboard-agent-listen-port=52365 "
        " --metrics-export-port=8080  --num-cpus=8  --resources='{\"TPU\": 4}' "
    )
    assert kuberay_start_command({"include-dashboard": "false"}, None) == (
        "ray start --head  --block  --dashboard-agent-listen-port=52365  --dashboard-host=0.0.0.0 "
        " --include-dashboard=false  --metrics-export-port=8080 "
    )


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
    cluster_spec: specs.ClusterSpec,
    labels: dict[str, str],
    pod_ip: str,
    start_cmd: str,
    home: Path,
    head: bool = False,
) -> dict[str, str]:
    """The Ray container's environment, read from the manifest as the kubelet would."""
    manifest = kuberay.raycluster_manifest(cluster_spec)["spec"]
    group = manifest["headGroupSpec"] if head else manifest["workerGroupSpecs"][0]
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
    tmp_path, fake_ray, cluster_spec, labels, pod_ip, head=False, **extra_env
) -> tuple[subprocess.CompletedProcess, dict | None]:
    hosts, _ = hosts_file(tmp_path, cluster_spec)
    script = write_script(tmp_path, cluster_spec, f"venv:{fake_ray}")
    manifest = kuberay.raycluster_manifest(cluster_spec)["spec"]
    group = manifest["headGroupSpec"] if head else manifest["workerGroupSpecs"][0]
    out = tmp_path / f"ray-{uuid.uuid4().hex}.json"
    env = pod_env(
        cluster_spec,
        labels,
        pod_ip,
        kuberay_start_command(group["rayStartParams"], None if head else "head.invalid:6379"),
        tmp_path,
        head=head,
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


def test_head_pod_runs_kuberays_head_command(tmp_path, fake_ray):
    cluster_spec = gke_spec("v6e-16", slices=1)
    result, started = run_fake_pod(tmp_path, fake_ray, cluster_spec, {}, "127.0.0.5", head=True)
    assert result.returncode == 0, result.stderr
    argv = started["argv"]
    assert argv[:2] == ["start", "--head"] and "--block" in argv and "--dashboard-host=0.0.0.0" in argv
    assert not any(arg.startswith("--address") for arg in argv)
    assert "TPU_WORKER_ID" not in started["env"]  # the head pod is no TPU host
    assert started["env"]["RAY_AUTH_MODE"] == "disabled"


def test_token_auth_reaches_ray_from_kuberays_injected_environment(tmp_path, fake_ray):
    """rayAuth: token. KubeRay injects RAY_AUTH_MODE and RAY_AUTH_TOKEN (from its Secret) into
    each Ray container unless the container sets them; the manifest must not, and the script
    passes them on to Ray without printing the token."""
    cluster_spec = gke_spec("v6e-16", slices=1, rayAuth="token")
    _, ips = hosts_file(tmp_path, cluster_spec)
    manifest = kuberay.raycluster_manifest(cluster_spec)["spec"]
    for group in (manifest["headGroupSpec"], *manifest["workerGroupSpecs"]):
        [container] = group["template"]["spec"]["containers"]
        assert not {AUTH_MODE_VAR, AUTH_TOKEN_VAR} & {e["name"] for e in container["env"]}
    token = "kuberay-secret-token-5d1e"
    injected = {AUTH_MODE_VAR: "token", AUTH_TOKEN_VAR: token}
    for head, labels, ip in [
        (True, {}, "127.0.0.5"),
        (False, {pod.LABEL_REPLICA_INDEX: "0", pod.LABEL_HOST_INDEX: "1"}, ips["demo-s0-h1"]),
    ]:
        result, started = run_fake_pod(tmp_path, fake_ray, cluster_spec, labels, ip, head=head, **injected)
        assert result.returncode == 0, result.stderr
        assert started["env"]["RAY_AUTH_MODE"] == "token" and started["env"]["RAY_AUTH_TOKEN"] == token
        assert token not in result.stderr + result.stdout


def test_pod_installs_its_requirements_from_a_wheelhouse_before_starting_ray(tmp_path, fake_ray, wheelhouse):
    """The install block the boot script shares, run by the pod script with the image's pip: here
    a fresh venv's python3 stands in for the image's, and the requirement is one small wheel from
    the repo's wheelhouse (the jax preset would take minutes)."""
    six = next(wheelhouse.glob("six-*.whl"), None)
    if six is None:
        pytest.fail(f"{wheelhouse} lacks six; build it with bench/wheelhouse.py")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    shutil.copy(six, wheels)
    image = tmp_path / "image-python"
    subprocess.run([sys.executable, "-m", "venv", str(image)], check=True, timeout=120)
    (image / "bin" / "ray").symlink_to(fake_ray / "bin" / "ray")
    cluster_spec = gke_spec("v6e-4", slices=1)
    hosts, ips = hosts_file(tmp_path, cluster_spec)
    # No preset lock: the requirement lines alone, resolved by the image's pip from the wheels.
    variables = {**pod.pod_variables(cluster_spec, f"wheels:{wheels}"), "requirements": ["six"], "lock": ""}
    script = tmp_path / "pod-start.sh"
    script.write_text(render_template(pod.TEMPLATE, **variables))
    [group] = kuberay.raycluster_manifest(cluster_spec)["spec"]["workerGroupSpecs"]
    env = pod_env(
        cluster_spec,
        {pod.LABEL_REPLICA_INDEX: "0"},
        ips["demo-s0-h0"],
        kuberay_start_command(group["rayStartParams"], "head.invalid:6379"),
        tmp_path,
    )
    out = tmp_path / "ray.json"
    env.update(PATH=f"{image / 'bin'}:{env['PATH']}", FAKE_RAY_OUT=str(out))
    result = subprocess.run(pod_command(script, hosts), env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "installing six" in result.stderr
    check = subprocess.run([str(image / "bin" / "python"), "-c", "import six"], capture_output=True)
    assert check.returncode == 0  # installed into the image's Python, offline, before Ray started
    assert json.loads(out.read_text())["argv"][0] == "start"


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
