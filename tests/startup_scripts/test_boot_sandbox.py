"""The whole boot script, run by real bash against a stub metadata server and Secret Manager.

Covers what a simulated slice cannot: Secret Manager (its documented JSON), IAM that is not yet
there, secrets that must never reach an argv or a log, a required attribute that answers 404, a
metadata server that never answers, hostile values in every rendered variable, and the retry
and state machine of each step. docs/faults.md shows `SCENARIOS`: each fault and the outcome its
test asserts.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from rayslice import compilation_cache, names
from rayslice import spec as spec_module
from rayslice.local.google.http_handler import QuietOnHangUpHandler
from rayslice.observability import record
from rayslice.startup_scripts import (
    RenderOptions,
    host_attributes,
    image_builder_attributes,
    locks,
    stack_locks,
    templating,
)
from rayslice.startup_scripts.options import PackageSource
from rayslice.startup_scripts.variables import (
    UV_VERSION,
    install_fingerprint,
    package_variables,
    script_variables,
)
from tests import serving
from tests.startup_scripts import sandbox
from tests.startup_scripts.faults import Fault, FaultTable
from tests.startup_scripts.tiny_wheels import make_wheel, sha256

TOKEN = "ray-token-0c5e9d1b-do-not-leak"
INDEX_PASSWORD = "index-pw-93af-do-not-leak"

SCENARIOS = {
    "metadata_503": Fault(
        "metadata server answers 503 for 8 s",
        "boot retries with backoff, then **joined**",
    ),
    "metadata_never": Fault(
        "metadata server accepts and never answers",
        "startup script exits 1 after the metadata deadline, logging `failed: could not read the host "
        "identity from metadata` (no state can be published); no supervisor, nothing started",
    ),
    "required_404": Fault(
        "a required attribute (`rayslice-head-mode`) answers 404",
        "`failed: metadata attribute rayslice-head-mode is missing (404); …`",
    ),
    "wrong_type": Fault(
        "script rendered for v6e-4 runs on a v6e-16 host",
        "`failed: this script was rendered for v6e-4 but the host is v6e-16; …`",
    ),
    "token_flaky": Fault(
        "Secret Manager answers 503 twice, then 403 twice (IAM not yet propagated)",
        "publishes `waiting: token`, retries with backoff, then **joined**; token file 0600",
    ),
    "install_once": Fault(
        "install fails once (network error), then succeeds",
        "publishes `retrying: install (attempt 2)`, then **joined**",
    ),
    "unresolvable": Fault(
        "requirements cannot be resolved",
        "`failed: requirements cannot be resolved: …`; the supervisor stops",
    ),
    "head_late": Fault(
        "worker boots while the head is not up; the head appears later",
        "publishes `waiting: head` (no deadline), then **joined**",
    ),
    "ray_start_fails": Fault(
        "`ray start` gives up twice (raylet not registered in time), leaving its daemons running",
        "the supervisor stops what each failed start left (TERM, then KILL after the restart delay) "
        "before the next; **joined** on the third start, no leftover alive",
    ),
    "head_lost": Fault(
        "head lost after the worker joined, then back",
        "Ray exits, supervisor restarts it: `waiting: head`, then **joined** again",
    ),
    "boot_again": Fault(
        "boot script run again on a live host",
        "previous supervisor stopped, one Ray node, **joined**",
    ),
    "reboot": Fault(
        "reboot with unchanged requirements (installing source)",
        "`requirements unchanged`: no install, **joined**",
    ),
    "cache_silent": Fault(
        "the head's package cache never answers its health check",
        "publishes `waiting: package cache`; after `CACHE_WAIT_S` installs from the index itself, "
        "then **joined**",
    ),
    "cache_fails": Fault(
        "an install through the package cache fails",
        "installs from the index at once, in the same attempt (no `retrying:`), then **joined**",
    ),
    "hostile": Fault(
        "hostile string in every rendered variable",
        "script fails (permanent), the string is never executed",
    ),
}
TABLE = FaultTable("sandbox", SCENARIOS)


def _spec(**raw: object) -> spec_module.ClusterSpec:
    return spec_module.load({"acceleratorType": "v6e-16", "platform": "tpu-vm", **raw}, require_zone=False)


def _cloud(
    spec: spec_module.ClusterSpec, worker: int = 0, extra: dict[str, str] | None = None
) -> sandbox.StubCloud:
    attributes = {**host_attributes(spec, 0, token_secret="ray-token"), **(extra or {})}
    metadata = sandbox.tpu_vm_metadata(spec.accelerator_type, worker, spec.tpu.hosts, attributes)
    return sandbox.StubCloud(metadata, {"ray-token": TOKEN, "index-creds": f"builder:{INDEX_PASSWORD}"})


def _box(
    host: list[sandbox.Sandbox], tmp_path: Path, cloud: sandbox.StubCloud, **kw: object
) -> sandbox.Sandbox:
    box = sandbox.Sandbox(tmp_path, cloud, **kw)  # type: ignore[arg-type]  # kwargs are Sandbox's own
    host.append(box)
    return box


def _joined(box: sandbox.Sandbox) -> bool:
    return box.cloud.state == names.STATE_JOINED


class _Head:
    """Something listening on the head's GCS port (what a worker's probe waits for)."""

    def __init__(self, port: int):
        self.socket = socket.create_server(("127.0.0.1", port))

    def close(self) -> None:
        self.socket.close()


def _kill_ray(box: sandbox.Sandbox) -> None:
    """End the stub `ray start --block` (what Ray does when its head is gone for good)."""
    group = box.supervisor_pid()
    assert group is not None, "no supervisor runs"
    for pid, argv in sandbox.group_processes(group):
        if argv == ["sleep", "600"]:
            os.kill(pid, signal.SIGKILL)


def _no_secret_anywhere(box: sandbox.Sandbox, *secrets: str) -> None:
    argv = box.curl_log.read_text() if box.curl_log.exists() else ""
    argv += box.uv_log.read_text().split("UV_INDEX")[0] if box.uv_log.exists() else ""
    for secret in (sandbox.ACCESS_TOKEN, *secrets):
        assert secret not in argv, "a secret reached an argv"
        assert secret not in box.log, "a secret reached the boot log"
        assert all(secret not in state for state in box.cloud.states)
    for proc in Path("/proc").iterdir():  # what `ps` shows, now
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert all(secret not in cmdline for secret in (sandbox.ACCESS_TOKEN, *secrets)), cmdline


# ---- scenarios ---------------------------------------------------------------------------------


def test_metadata_503_for_a_while_then_joined(host, tmp_path):
    spec = _spec(rayAuth="none")
    cloud = _cloud(spec)
    box = _box(host, tmp_path, cloud)
    cloud.faults.metadata_503_until = sandbox.time.monotonic() + 8
    result = box.boot(box.render(spec, sandbox.free_port()))
    assert result.returncode == 0, result.stderr
    box.wait(lambda: _joined(box))


def test_metadata_that_never_answers_ends_the_boot_with_a_named_failure(host, tmp_path):
    spec = _spec(rayAuth="none")
    cloud = _cloud(spec)
    cloud.faults.metadata_hangs = True
    box = _box(host, tmp_path, cloud)
    result = box.boot(box.render(spec, sandbox.free_port()), RAYSLICE_METADATA_DEADLINE_S="6")
    assert result.returncode == 1
    assert "failed: could not read the host identity from metadata" in box.log
    assert box.supervisor_pid() is None and box.ray_starts() == []


@pytest.mark.parametrize(
    "attribute, head",
    # The head address is optional to a slice host with head=slice and required with head=vm.
    [(names.ATTR_HEAD_MODE, "slice"), (names.ATTR_HEAD_ADDRESS, "vm")],
)
def test_a_required_attribute_answering_404_is_a_permanent_failure(host, tmp_path, attribute, head):
    spec = _spec(rayAuth="none", head=head)
    cloud = _cloud(spec)
    cloud.faults.missing.add(f"instance/attributes/{attribute}")
    box = _box(host, tmp_path, cloud)
    result = box.boot(box.render(spec, sandbox.free_port()))
    assert result.returncode == 1
    assert cloud.state == (
        f"failed: metadata attribute {attribute} is missing (404); infra writes it when it creates the host"
    )
    assert box.supervisor_pid() is None


def test_a_script_rendered_for_another_type_fails_at_boot(host, tmp_path):
    cloud = _cloud(_spec(rayAuth="none"))
    box = _box(host, tmp_path, cloud)
    result = box.boot(box.render(_spec(acceleratorType="v6e-4", rayAuth="none"), sandbox.free_port()))
    assert result.returncode == 1
    assert cloud.state == (
        "failed: this script was rendered for v6e-4 but the host is v6e-16; render it for this slice"
    )
    assert box.supervisor_pid() is None


@pytest.mark.parametrize("bounds, stops", [("1,1,1", True), ("2,2,1", False)])
def test_a_host_of_a_slice_made_as_independent_vms_stops_naming_the_cause(host, tmp_path, bounds, stops):
    """D4 (issue 40): a TPU runtime that reports fewer hosts than the slice's (HOST_BOUNDS
    1,1,1 on a 4-host v6e-16, as a published TPU7x log shows for a MIG without bulk mode) stops the
    boot with a message `rayslice status` shows, never a silent one-host cluster."""
    spec = _spec(rayAuth="none")
    tpu_env = f"TOPOLOGY: '4x4'\nHOST_BOUNDS: '{bounds}'\nWORKER_ID: '0'\n"
    cloud = _cloud(spec, extra={"tpu-env": tpu_env})
    box = _box(host, tmp_path, cloud)
    result = box.boot(box.render(spec, sandbox.free_port()))
    if stops:
        assert result.returncode == 1 and box.supervisor_pid() is None
        assert cloud.state == (
            "failed: the TPU runtime reports HOST_BOUNDS 1,1,1 (1 host(s)) but slice v6e-16 has 4 hosts: "
            "Compute Engine made independent VMs, not one ICI slice; delete the slice (its MIG) so that "
            "it is created whole again"
        )
    else:
        assert result.returncode == 0 and not cloud.state.startswith("failed")


def test_token_from_secret_manager_after_transient_and_permission_errors(host, tmp_path):
    spec = _spec(rayAuth="token")
    cloud = _cloud(spec)
    cloud.faults.secret_failures = 2
    cloud.faults.secret_denied = 2
    box = _box(host, tmp_path, cloud)
    assert box.boot(box.render(spec, sandbox.free_port())).returncode == 0
    box.wait(lambda: _joined(box), timeout=90)
    assert "waiting: token" in cloud.states
    assert cloud.secret_requests == 5
    token_file = box.root / "etc/rayslice/ray-token"
    assert token_file.read_text() == TOKEN
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    assert list(token_file.parent.iterdir()) == [token_file]  # no temporary file left
    assert f"RAY_AUTH_TOKEN_PATH={token_file}" in box.ray_log.read_text()
    # The bearer token went to curl through its config on stdin.
    assert "--config -" in box.curl_log.read_text()
    _no_secret_anywhere(box, TOKEN)


def _booted_from_wheels(
    host: list[sandbox.Sandbox], tmp_path: Path, **faults: object
) -> tuple[sandbox.Sandbox, sandbox.StubCloud]:
    """A head host (rayAuth=none) booted with the sandbox's `faults`, installing from a wheelhouse."""
    spec = _spec(rayAuth="none")
    cloud = _cloud(spec)
    box = _box(host, tmp_path, cloud, **faults)
    script = box.render(spec, sandbox.free_port(), package_mode="wheels", package_dir="/srv/wheels")
    assert box.boot(script).returncode == 0
    return box, cloud


def test_install_fails_once_then_succeeds(host, tmp_path):
    box, cloud = _booted_from_wheels(host, tmp_path, uv_failures=1)
    box.wait(lambda: _joined(box))
    assert "retrying: install (attempt 2)" in cloud.states
    assert box.uv_count.read_text().strip() == "2"


def test_requirements_that_cannot_resolve_are_a_permanent_failure(host, tmp_path):
    spec = _spec(rayAuth="none")
    cloud = _cloud(spec)
    box = _box(host, tmp_path, cloud, unresolvable=True)
    assert (
        box.boot(box.render(spec, sandbox.free_port(), package_mode="wheels", package_dir="/w")).returncode
        == 0
    )
    box.wait(lambda: cloud.state.startswith(names.STATE_FAILED_PREFIX))
    assert cloud.state.startswith("failed: requirements cannot be resolved:")
    box.wait(lambda: not box.supervisor_alive(), timeout=20)  # supervision ended, nothing left
    assert box.ray_starts() == []


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan whose reaper has not yet collected it is already dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_ray_start_that_gives_up_is_cleaned_up_before_the_next(host, tmp_path):
    box, _ = _booted_from_wheels(host, tmp_path, ray_start_failures=2)
    box.wait(lambda: _joined(box) and len(box.ray_starts()) == 3, timeout=60)
    leftovers = [int(pid) for pid in box.leftovers.read_text().split()]
    assert len(leftovers) == 2
    box.wait(lambda: not any(_running(pid) for pid in leftovers), timeout=10)
    assert box.supervisor_alive()  # the loop stopped the others, never itself


def test_worker_waits_for_a_late_head_then_rejoins_after_losing_it(host, tmp_path):
    spec = _spec(rayAuth="none")
    cloud = _cloud(spec, worker=1)
    box = _box(host, tmp_path, cloud)
    port = sandbox.free_port()
    assert box.boot(box.render(spec, port)).returncode == 0
    box.wait(lambda: cloud.state == "waiting: head")
    head = _Head(port)
    try:
        box.wait(lambda: _joined(box), timeout=60)
        [start] = box.ray_starts()
        assert f"--address=127.0.0.1:{port}" in start
        head.close()
        _kill_ray(box)
        box.wait(lambda: cloud.state == "waiting: head", timeout=30)
        head = _Head(port)
        box.wait(lambda: _joined(box) and len(box.ray_starts()) == 2, timeout=60)
    finally:
        head.close()


def test_boot_again_on_a_live_host_and_reboot_take_the_fast_path(host, tmp_path):
    spec = _spec(rayAuth="none")
    cloud = _cloud(spec)
    box = _box(host, tmp_path, cloud)
    script = box.render(spec, sandbox.free_port(), package_mode="wheels", package_dir="/srv/wheels")
    assert box.boot(script).returncode == 0
    box.wait(lambda: _joined(box))
    first = box.supervisor_pid()
    cloud.states.clear()
    assert box.boot(script).returncode == 0  # again, while everything runs
    box.wait(lambda: _joined(box))
    assert box.supervisor_pid() != first
    assert "stopping the previous rayslice-ray supervisor" in box.log
    box.wait(lambda: not _group_alive(first), timeout=45)

    box.stop()  # power off: every process of the host gone at once
    cloud.states.clear()
    assert box.boot(script).returncode == 0
    box.wait(lambda: _joined(box))
    assert box.uv_count.read_text().strip() == "1"  # installed once, at the first boot
    assert box.log.count("requirements unchanged") == 2
    assert "installing" not in cloud.states


def test_power_off_stops_a_supervisor_loop_caught_before_its_setsid(host, tmp_path):
    """The race a test that ends right after its boot runs into: the boot wrote the pidfile as it
    forked the loop, which has not run `setsid` yet, so no process group has the pidfile's id;
    the power-off stops the loop all the same, before it becomes a session of its own."""
    box = _box(host, tmp_path, _cloud(_spec(rayAuth="none")))
    loop = subprocess.Popen(["bash", "-c", "sleep 1; exec setsid sleep 600"], env=box.environment())
    try:
        state = box.root / "var/lib/rayslice"
        state.mkdir(parents=True, exist_ok=True)
        (state / "rayslice-ray.pid").write_text(f"{loop.pid}\n")
        assert not _group_alive(loop.pid)  # not a group leader yet
        box.stop()
        assert loop.wait(timeout=10) == -signal.SIGKILL
    finally:
        loop.kill()
        loop.wait()


def _group_alive(pgid: int | None) -> bool:
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


HOSTILE = "$(touch {m})`touch {m}`';touch {m};'\"$(touch {m})\" #"
# Inert in a word, but bash expands an array subscript when a variable's text is evaluated as
# arithmetic (`((X > 0))`, `$((X))`), so this runs `touch` wherever a value reaches arithmetic.
ARITHMETIC = "a[$(touch {m})]"


@pytest.mark.parametrize("pattern", [HOSTILE, ARITHMETIC], ids=["shell", "arithmetic"])
def test_hostile_value_in_every_rendered_variable_stays_inert(host, tmp_path, pattern):
    """Every rendered variable (names, ports, paths, lists) carries the hostile string at once."""
    marker = tmp_path / "pwned"
    hostile = pattern.format(m=marker)
    spec = _spec(rayAuth="token")
    cloud = _cloud(spec)
    box = _box(host, tmp_path, cloud)
    variables = script_variables(spec, RenderOptions(supervisor="process", root=str(box.root)))
    bad = {key: ([hostile] if isinstance(value, list) else hostile) for key, value in variables.items()}
    script = box.render(spec, bad.pop("gcs_port"), **bad)
    result = box.boot(script, timeout=60)
    assert result.returncode != 0  # nothing in the script can work with such values
    box.stop()
    assert not marker.exists()


OVERRIDABLE = (
    "RAYSLICE_METADATA_DEADLINE_S",
    "RAYSLICE_TOKEN_DEADLINE_S",
    "RAYSLICE_RETRY_MAX_DELAY_S",
    "RAYSLICE_DEMAND_INTERVAL_S",
)


def test_no_number_reaches_arithmetic_unchecked(host, tmp_path):
    """Each number alone, rendered or from its environment override, carries `a[$(…)]`: the script
    stops and names it before any arithmetic evaluates it (the all-at-once test above stops at the
    first value that breaks, so it cannot show that every number is checked)."""
    marker = tmp_path / "pwned"
    hostile = ARITHMETIC.format(m=marker)
    spec = _spec(rayAuth="none")
    box = _box(host, tmp_path, _cloud(spec))
    variables = script_variables(spec, RenderOptions(supervisor="process", root=str(box.root)))
    rendered = (templating.TEMPLATE_DIR / "startup.sh.j2").read_text()
    numbers = [
        k
        for k, v in variables.items()
        if isinstance(v, int) and not isinstance(v, bool) and f"{{{{ {k} | q }}}}" in rendered
    ]
    assert {"gcs_port", "object_store_bytes", "exit_permanent", "metadata_deadline_s"} <= set(numbers)
    defaults = dict.fromkeys(OVERRIDABLE, "")  # empty: the rendered value applies
    for name in numbers:
        overrides: dict[str, object] = {name: hostile}
        script = box.render(spec, overrides.pop("gcs_port", sandbox.free_port()), **overrides)
        result = box.boot(script, timeout=30, **defaults)
        assert result.returncode != 0 and "is not a whole number" in result.stderr, (name, result.stderr)
        assert not marker.exists(), name
    for env in OVERRIDABLE:
        result = box.boot(box.render(spec, sandbox.free_port()), timeout=30, **{env: hostile})
        assert result.returncode != 0 and "is not a whole number" in result.stderr, (env, result.stderr)
        assert not marker.exists(), env


def test_hostile_values_reach_the_tools_as_one_literal_argument(host, tmp_path):
    """Values that let the script run to the install carry the hostile string to uv intact."""
    marker = tmp_path / "pwned"
    hostile = HOSTILE.format(m=marker)
    spec = _spec(rayAuth="none")
    cloud = _cloud(spec)
    box = _box(host, tmp_path, cloud)
    script = box.render(
        spec,
        sandbox.free_port(),
        requirements=[hostile],
        find_links=[hostile],
        package_index=hostile,
    )
    assert box.boot(script).returncode == 0
    box.wait(lambda: _joined(box))
    uv_lines = box.uv_log.read_text()
    assert f"--default-index rayslice={hostile} --find-links {hostile} {hostile}" in uv_lines
    assert not marker.exists()


def test_index_credentials_reach_uv_by_environment_only(host, tmp_path):
    spec = _spec(rayAuth="none", packageIndex="https://pypi.internal.example/simple")
    cloud = _cloud(spec, extra={names.ATTR_INDEX_CREDENTIALS_SECRET: "index-creds"})
    box = _box(host, tmp_path, cloud)
    assert box.boot(box.render(spec, sandbox.free_port())).returncode == 0
    box.wait(lambda: _joined(box))
    uv = box.uv_log.read_text()
    assert "--default-index rayslice=https://pypi.internal.example/simple" in uv
    assert "UV_INDEX_RAYSLICE_USERNAME=builder" in uv
    assert f"UV_INDEX_RAYSLICE_PASSWORD={INDEX_PASSWORD}" in uv
    assert "UV_INDEX" not in box.ray_log.read_text()  # not exported to Ray and its jobs
    _no_secret_anywhere(box, INDEX_PASSWORD)


class _Cache(ThreadingHTTPServer):
    """The head's package cache as a host probes it: proxpi's /health answering 200."""

    daemon_threads = True

    def __init__(self) -> None:
        class Health(QuietOnHangUpHandler):  # a probe that gives up is dropped, as sandbox.py's stubs do
            def do_GET(self) -> None:
                self.send_response(200 if self.path == "/health" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Health)
        serving.start(self)

    def close(self) -> None:
        serving.stop(self)


def _cache_worker(
    host: list[sandbox.Sandbox], tmp_path: Path, cache_port: int, wait_s: str = "60", **kw: object
) -> tuple[sandbox.Sandbox, _Head]:
    """Worker 1 of a slice with a private index and the package cache on, booted; its head's GCS
    port listens. Returns the sandbox and the head (the caller closes it)."""
    spec = _spec(rayAuth="none", packageIndex="https://pypi.internal.example/simple")
    cloud = _cloud(spec, worker=1, extra={names.ATTR_INDEX_CREDENTIALS_SECRET: "index-creds"})
    box = _box(host, tmp_path, cloud, **kw)
    gcs = sandbox.free_port()
    head = _Head(gcs)
    script = box.render(spec, gcs, package_cache="1", package_cache_port=cache_port)
    assert box.boot(script, RAYSLICE_CACHE_WAIT_S=wait_s).returncode == 0
    return box, head


def test_a_worker_installs_through_the_heads_cache_without_the_index_credentials(host, tmp_path):
    cache = _Cache()
    box, head = _cache_worker(host, tmp_path, cache.server_address[1])
    try:
        box.wait(lambda: _joined(box))
    finally:
        head.close()
        cache.close()
    uv = box.uv_log.read_text()
    assert f"--default-index rayslice-cache=http://127.0.0.1:{cache.server_address[1]}/index/" in uv
    assert "rayslice=https://pypi.internal.example/simple" not in uv
    # uv takes a named index's credentials from UV_INDEX_<NAME>_*: none name the cache's index,
    # so the index's credentials are never sent to the cache.
    assert "UV_INDEX_RAYSLICE_CACHE_" not in uv
    _no_secret_anywhere(box, INDEX_PASSWORD)


def test_a_worker_installs_from_the_index_when_the_cache_never_answers(host, tmp_path):
    box, head = _cache_worker(host, tmp_path, sandbox.free_port(), wait_s="2")
    try:
        box.wait(lambda: _joined(box))
    finally:
        head.close()
    assert "waiting: package cache" in box.cloud.states
    assert "did not answer within 2s: installing from the index" in box.log
    uv = box.uv_log.read_text()
    assert "--default-index rayslice=https://pypi.internal.example/simple" in uv
    assert "rayslice-cache=" not in uv
    assert "UV_INDEX_RAYSLICE_USERNAME=builder" in uv


def test_an_install_that_fails_through_the_cache_is_done_from_the_index_at_once(host, tmp_path):
    cache = _Cache()
    box, head = _cache_worker(host, tmp_path, cache.server_address[1], uv_failures=1)
    try:
        box.wait(lambda: _joined(box))
    finally:
        head.close()
        cache.close()
    installs = [line for line in box.uv_log.read_text().splitlines() if line.startswith("pip install")]
    assert len(installs) == 2
    assert "rayslice-cache=" in installs[0] and "rayslice=https://pypi.internal.example/simple" in installs[1]
    assert "installing through the package cache failed: installing from the index" in box.log
    assert not any(state.startswith("retrying") for state in box.cloud.states)


def test_compute_engine_host_gets_its_identity_from_instance_names(host, tmp_path):
    """No Cloud-TPU-API attributes: worker number from instance/name in the slice's host list."""
    spec = _spec(rayAuth="none", platform="compute")
    attributes = host_attributes(spec, 0)
    metadata = sandbox.base_metadata(
        {"accelerator-type": "v6e-16", **attributes}, name=names.host_name(spec.slice_name(0), 2)
    )
    cloud = sandbox.StubCloud(metadata, {})
    box = _box(host, tmp_path, cloud)
    hosts = attributes[names.ATTR_SLICE_HOSTS]
    port = sandbox.free_port()
    script = box.render(spec, port)
    listener = _Head(port)
    try:
        assert box.boot(script).returncode == 0
        box.wait(lambda: _joined(box))
        # The Ray service's first run took the identity boot had read: one read of instance/name.
        assert cloud.gets["instance/name"] == 1
        first = box.ray_log.read_text()
        # A restarted run reads it afresh, and finds the same.
        _kill_ray(box)
        box.wait(lambda: _joined(box) and len(box.ray_starts()) == 2, timeout=30)
        assert cloud.gets["instance/name"] == 2
    finally:
        listener.close()
    again = box.ray_log.read_text().removeprefix(first)
    for env in (first, again):
        assert "TPU_WORKER_ID=2" in env
        assert f"TPU_WORKER_HOSTNAMES={hosts}" in env
        assert f"TPU_NAME={spec.slice_name(0)}" in env
        assert "TPU_ACCELERATOR_TYPE=v6e-16" in env and "TPU_TOPOLOGY=4x4" in env
    assert all(f"--address=127.0.0.1:{port}" in start for start in box.ray_starts())


def _boot_compute_host(
    host: list[sandbox.Sandbox],
    tmp_path: Path,
    spec: spec_module.ClusterSpec,
    worker_name: int,
    google: dict,
    *,
    ip: str = "127.0.0.1",
    head_address: str | None = None,
) -> sandbox.Sandbox:
    """Boot instance `worker_name` of a compute slice whose metadata also has Google's `google`
    attributes, at `ip`, against a head listening on 127.0.0.1; returns the joined sandbox."""
    attributes = host_attributes(spec, 0, head_address=head_address)
    name = names.host_name(spec.slice_name(0), worker_name)
    metadata = sandbox.base_metadata({**google, **attributes}, name=name)
    cloud = sandbox.StubCloud({**metadata, "instance/network-interfaces/0/ip": ip}, {})
    box = _box(host, tmp_path, cloud)
    port = sandbox.free_port()
    script = box.render(spec, port)
    listener = _Head(port)
    try:
        assert box.boot(script).returncode == 0
        box.wait(lambda: _joined(box))
    finally:
        listener.close()
    assert f"--address=127.0.0.1:{port}" in box.ray_starts()[0]
    return box


BUCKET_CACHE = compilation_cache.bucket_location("rayslice-xla-0123abcd")


def _ray_environment(box: sandbox.Sandbox, script: Path) -> dict[str, str]:
    """The JAX_ variables of the first `ray start` after booting `script` (worker 0: the head)."""
    assert box.boot(script).returncode == 0
    box.wait(lambda: _joined(box))
    lines = box.ray_log.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.startswith("JAX_"))


@pytest.mark.parametrize(
    "attribute, rendered, expected",
    [
        (BUCKET_CACHE, "", BUCKET_CACHE),  # a cloud host: its bucket, named in metadata
        (BUCKET_CACHE, "/sim-shared/jax-compilation-cache", "/sim-shared/jax-compilation-cache"),
        (None, "/sim-shared/jax-compilation-cache", "/sim-shared/jax-compilation-cache"),
        (None, "", None),  # neither: JAX keeps its own default (no cache)
    ],
    ids=["bucket from metadata", "rendered folder wins", "rendered folder alone", "none"],
)
def test_ray_gets_the_compilation_cache_and_the_settings_that_cache_every_step(
    host, tmp_path, attribute, rendered, expected
):
    spec = _spec(rayAuth="none")
    extra = {names.ATTR_COMPILATION_CACHE: attribute} if attribute else {}
    box = _box(host, tmp_path, _cloud(spec, extra=extra))
    env = _ray_environment(box, box.render(spec, sandbox.free_port(), compilation_cache=rendered))
    assert env == (compilation_cache.environment(expected) if expected else {})


def test_a_tpu7x_host_reporting_v7x_runs_the_script_rendered_for_tpu7x(host, tmp_path):
    """Compute Engine is asked for tpu7x-16; the host reports v7x-16 (catalog.reported_name)."""
    spec = _spec(rayAuth="none", platform="compute", acceleratorType="tpu7x-16")
    box = _boot_compute_host(host, tmp_path, spec, 1, {"accelerator-type": "v7x-16"})
    env = box.ray_log.read_text()
    assert "TPU_ACCELERATOR_TYPE=tpu7x-16" in env and "TPU_WORKER_ID=1" in env
    assert f"--labels={names.PLATFORM_LABEL}=compute" in box.ray_starts()[0]


# Worker 2's instance name is 3rd in rayslice's list, but Google numbers it 1: Google's number
# and Google's host list win together, never one from each source.
GOOGLE_HOSTS = "127.0.0.1,10.0.0.12,10.0.0.13,10.0.0.14"


def _endpoints(hosts: str) -> str:
    """`worker-network-endpoints` of comma-separated `hosts` (the TPU VM's format)."""
    return ",".join(f"unknown:unknown:{ip}" for ip in hosts.split(","))


ENDPOINTS = _endpoints(GOOGLE_HOSTS)


@pytest.mark.parametrize(
    "google",
    [
        # worker-id first (a Compute Engine TPU host), then tpu-env's WORKER_ID, then
        # agent-worker-number (a Cloud TPU VM): the others disagree and must lose.
        {"worker-id": "1", "tpu-env": "WORKER_ID: '3'\n", "agent-worker-number": "0"},
        {"tpu-env": "TOPOLOGY: '4x4'\nWORKER_ID: '1'\n", "agent-worker-number": "0"},
        {"tpu-env": "TOPOLOGY: 4x4\nWORKER_ID: 1\n"},  # unquoted, as a published TPU7x log prints it
        {"agent-worker-number": "1"},
    ],
    ids=["worker-id", "tpu-env", "tpu-env-unquoted", "agent-worker-number"],
)
def test_compute_engine_host_takes_worker_and_hosts_from_googles_attributes(host, tmp_path, google):
    spec = _spec(rayAuth="none", platform="compute")
    google = {"accelerator-type": "v6e-16", "worker-network-endpoints": ENDPOINTS, **google}
    box = _boot_compute_host(host, tmp_path, spec, 2, google)
    env = box.ray_log.read_text()
    assert "TPU_WORKER_ID=1" in env and f"TPU_WORKER_HOSTNAMES={GOOGLE_HOSTS}" in env
    assert "TPU_TOPOLOGY=4x4" in env
    assert "worker=1 (from Google's attributes)" in box.log


def test_without_googles_host_list_the_worker_and_hosts_come_from_rayslices(host, tmp_path):
    spec = _spec(rayAuth="none", platform="compute")
    box = _boot_compute_host(host, tmp_path, spec, 2, {"accelerator-type": "v6e-16", "worker-id": "1"})
    env = box.ray_log.read_text()
    hosts = host_attributes(spec, 0)[names.ATTR_SLICE_HOSTS]
    assert "TPU_WORKER_ID=2" in env and f"TPU_WORKER_HOSTNAMES={hosts}" in env
    assert f"worker=2 (from {names.ATTR_SLICE_HOSTS})" in box.log


# head=slice on compute: infra writes the address it reserved for `-w0` as the head address, and
# the host at that address is the head whichever host Google numbers worker 0 (no source says).
def test_the_compute_host_at_the_head_address_is_the_head_though_google_numbers_it_1(host, tmp_path):
    spec = _spec(rayAuth="none", platform="compute")
    endpoints = _endpoints("10.0.0.11,127.0.0.1,10.0.0.13,10.0.0.14")
    google = {"accelerator-type": "v6e-16", "worker-id": "1", "worker-network-endpoints": endpoints}
    attributes = host_attributes(spec, 0, head_address="127.0.0.1")
    name = names.host_name(spec.slice_name(0), 0)
    box = _box(
        host, tmp_path, sandbox.StubCloud(sandbox.base_metadata({**google, **attributes}, name=name), {})
    )
    assert box.boot(box.render(spec, sandbox.free_port())).returncode == 0
    box.wait(lambda: _joined(box))
    assert "--head" in box.ray_starts()[0]
    assert "role=head worker=1 (from Google's attributes)" in box.log
    assert "TPU_WORKER_ID=1" in box.ray_log.read_text()  # the TPU runtime keeps Google's number


def test_a_compute_host_google_numbers_0_joins_the_head_address(host, tmp_path):
    spec = _spec(rayAuth="none", platform="compute")
    endpoints = _endpoints("127.0.0.2,127.0.0.1,10.0.0.13,10.0.0.14")
    google = {"accelerator-type": "v6e-16", "worker-id": "0", "worker-network-endpoints": endpoints}
    box = _boot_compute_host(host, tmp_path, spec, 1, google, ip="127.0.0.2", head_address="127.0.0.1")
    assert "role=worker worker=0 (from Google's attributes)" in box.log
    assert "TPU_WORKER_ID=0" in box.ray_log.read_text()


def test_tpu_vm_host_exports_the_tpu_api_identity(host, tmp_path):
    spec = _spec(rayAuth="none")
    cloud = _cloud(spec)
    box = _box(host, tmp_path, cloud)
    assert box.boot(box.render(spec, sandbox.free_port())).returncode == 0
    box.wait(lambda: _joined(box))
    env = box.ray_log.read_text()
    assert "TPU_WORKER_ID=0" in env and "TPU_NAME=sandbox-slice-0" in env and "TPU_TOPOLOGY=4x4" in env
    assert "TPU_WORKER_HOSTNAMES=127.0.0.1,127.0.0.1,127.0.0.1,127.0.0.1" in env
    assert "--head" in box.ray_starts()[0]


@pytest.mark.slow  # the wheelhouse: filled from the package index on first use
def test_install_from_a_private_index_bootstraps_the_pinned_uv(host, tmp_path, wheelhouse):
    """Real pip and real uv against a local simple index behind basic auth: uv is installed by
    pip with --require-hashes, then the requirements by uv, both authenticated with the
    credentials read from Secret Manager (never an argv, never the log)."""
    uv_wheel = next(wheelhouse.glob(f"uv-{UV_VERSION}-*manylinux_2_17_x86_64*.whl"), None)
    six_wheel = next(wheelhouse.glob("six-*.whl"), None)
    if uv_wheel is None or six_wheel is None:
        pytest.fail(f"{wheelhouse} lacks uv {UV_VERSION} or six; build it with bench/wheelhouse.py")
    index = sandbox.WheelIndex(wheelhouse, [uv_wheel.name, six_wheel.name], "builder", INDEX_PASSWORD)
    try:
        spec = _spec(rayAuth="none", packageIndex="https://placeholder.example/simple")
        cloud = _cloud(spec, extra={names.ATTR_INDEX_CREDENTIALS_SECRET: "index-creds"})
        box = _box(host, tmp_path, cloud, real_uv=True)
        # The spec refuses http://; the test index is plain http on loopback, so it goes in as a
        # rendered value, and the lock pins one small wheel instead of the jax preset.
        six = f"six=={six_wheel.name.split('-')[1]} --hash=sha256:{sha256(six_wheel)}\n"
        script = box.render(spec, sandbox.free_port(), package_index=index.url, requirements=[], **_lock(six))
        assert box.boot(script, RAYSLICE_RETRY_MAX_DELAY_S="2").returncode == 0
        box.wait(lambda: "starting" in cloud.states or cloud.state.startswith("failed"), timeout=120)
        assert "starting" in cloud.states, box.log[-3000:]
        uv = box.root / "opt/rayslice/uv/bin/uv"
        version = sandbox.subprocess.run([str(uv), "--version"], capture_output=True, text=True).stdout
        assert version.split()[1] == UV_VERSION
        assert uv_wheel.name in index.served and six_wheel.name in index.served
        venv_python = box.root / "opt/rayslice/venv/bin/python"
        check = sandbox.subprocess.run([str(venv_python), "-c", "import six"], capture_output=True)
        assert check.returncode == 0
        assert (box.root / "opt/rayslice/venv/.rayslice-install").exists()
        _no_secret_anywhere(box, INDEX_PASSWORD)
        assert not list(Path("/tmp").glob("tmp*netrc*"))
    finally:
        index.shutdown()


# ---- locked installs: real uv, offline, from a wheelhouse of tiny wheels -----------------------


def _lock(body: str, python: str = "3.11") -> dict[str, str]:
    """The rendered values of a lock with this body (what `variables.package_variables` gives)."""
    lock = locks.Lock(locks.header("test", ["alpha"], python, None, ()), body)
    return {
        "lock": base64.b64encode(lock.text.encode()).decode(),
        "lock_digest": lock.digest,
        "lock_python": python,
    }


def _pin(wheel: Path) -> str:
    name, version = wheel.name.split("-")[:2]
    return f"{name}=={version} \\\n    --hash=sha256:{sha256(wheel)}\n"


def _locked_box(host, tmp_path, body: str, python: str = "3.11", requirements: tuple[str, ...] = ()):
    """A host whose wheelhouse holds alpha 1.0 and 2.0 (both need beta), beta 1.0 and gamma 1.0
    (needs alpha), booted with real uv (already in place, as after its bootstrap) and this lock."""
    values = {"package_mode": "wheels", "package_dir": str(tmp_path / "wheels"), "find_links": []}
    return _uv_box(host, tmp_path, requirements=list(requirements), **values, **_lock(body, python))


def _uv_box(host, tmp_path, **values: object):
    """A host with real uv in place (as after its bootstrap), booted with these rendered values."""
    spec = _spec(rayAuth="none")
    cloud = _cloud(spec)
    box = _box(host, tmp_path, cloud, real_uv=True)
    uv = box.root / "opt/rayslice/uv/bin/uv"
    uv.parent.mkdir(parents=True)
    uv.symlink_to(locks.uv_binary())
    script = box.render(spec, sandbox.free_port(), **values)
    assert box.boot(script, RAYSLICE_RETRY_MAX_DELAY_S="1").returncode == 0
    return box, cloud


def _wheels(tmp_path: Path) -> dict[str, Path]:
    wheels = tmp_path / "wheels"
    return {
        "alpha1": make_wheel(wheels, "alpha", "1.0", ("beta",)),
        "alpha2": make_wheel(wheels, "alpha", "2.0", ("beta",)),
        "beta": make_wheel(wheels, "beta", "1.0"),
        "gamma": make_wheel(wheels, "gamma", "1.0", ("alpha",)),
    }


def _installed(box: sandbox.Sandbox, module: str) -> str | None:
    python = box.root / "opt/rayslice/venv/bin/python"
    found = sandbox.subprocess.run(
        [str(python), "-c", f"import {module}; print({module}.VERSION)"], capture_output=True, text=True
    )
    return found.stdout.strip() if found.returncode == 0 else None


def test_a_locked_host_installs_the_lock_as_it_is_without_resolving(host, tmp_path):
    """alpha needs beta, which the lock leaves out: --no-deps installs alpha alone, as locked."""
    wheels = _wheels(tmp_path)
    box, cloud = _locked_box(host, tmp_path, _pin(wheels["alpha1"]))
    box.wait(lambda: "starting" in cloud.states or cloud.state.startswith("failed"), timeout=120)
    assert "starting" in cloud.states, box.log[-3000:]
    assert (_installed(box, "alpha"), _installed(box, "beta")) == ("1.0", None)
    assert "installing the lock" in box.log
    assert (box.root / "opt/rayslice/venv/.rayslice-install").exists()


def test_a_lock_whose_hash_does_not_match_installs_nothing_and_is_retried(host, tmp_path):
    wheels = _wheels(tmp_path)
    tampered = f"alpha==1.0 \\\n    --hash=sha256:{sha256(wheels['alpha2'])}\n"
    box, cloud = _locked_box(host, tmp_path, tampered)
    box.wait(lambda: any(s.startswith("retrying: install") for s in cloud.states), timeout=120)
    assert _installed(box, "alpha") is None
    assert "starting" not in cloud.states
    assert not (box.root / "opt/rayslice/venv/.rayslice-install").exists()


def test_the_heads_package_cache_installs_its_own_lock_as_it_is(host, tmp_path):
    """The head's cache venv gets exactly its lock (`variables.CACHE_LOCK`; here alpha 1.0, which
    needs beta): real uv, --require-hashes --no-deps, so beta stays out and alpha 2.0 is not taken."""
    wheels = _wheels(tmp_path)
    cache = locks.Lock(locks.header("package-cache", ["alpha"], "3.11", None, ()), _pin(wheels["alpha1"]))
    values = {"package_mode": "wheels", "package_dir": str(tmp_path / "wheels"), "find_links": []}
    values |= {"package_cache": "1", "cache_lock_digest": cache.digest}
    values |= {"cache_lock": base64.b64encode(cache.text.encode()).decode()}
    box, _ = _uv_box(host, tmp_path, requirements=[], **values, **_lock(_pin(wheels["beta"])))
    marker = box.root / "opt/rayslice/cache-venv/.rayslice-install"
    try:
        box.wait(marker.exists, timeout=120)
    finally:  # the cache's own supervisor: proxpi is not in the stand-in lock, so it restarts
        pidfile = box.root / "var/lib/rayslice/rayslice-cache.pid"
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)
    assert marker.read_text() == cache.digest
    python = box.root / "opt/rayslice/cache-venv/bin/python"
    probe = "import importlib.util as u, alpha; print(alpha.VERSION, u.find_spec('beta') is None)"
    found = sandbox.subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True)
    assert found.stdout.split() == ["1.0", "True"]
    assert f"from the lock {cache.digest}" in box.log


def test_requirements_beside_the_lock_keep_its_versions(host, tmp_path):
    """gamma needs any alpha; the wheelhouse's newest is 2.0, the lock holds 1.0, and 1.0 stays."""
    wheels = _wheels(tmp_path)
    box, cloud = _locked_box(
        host, tmp_path, _pin(wheels["alpha1"]) + _pin(wheels["beta"]), requirements=("gamma",)
    )
    box.wait(lambda: "starting" in cloud.states or cloud.state.startswith("failed"), timeout=120)
    assert "starting" in cloud.states, box.log[-3000:]
    assert (_installed(box, "alpha"), _installed(box, "gamma")) == ("1.0", "1.0")


def test_a_stack_lock_is_installed_alone_resolving_nothing(host, tmp_path, index):
    """A stack lock made as the Pulumi program makes one (real uv against an index of tiny wheels,
    under a base lock that pins alpha 1.0 and beta): gamma needs any alpha and the index's newest
    is 2.0. The host installs the lock alone (nothing left to resolve), and alpha stays 1.0."""
    wheels = tmp_path / "wheels"  # the `index` fixture's wheels, also the host's wheelhouse
    base_body = _pin(wheels / "alpha-1.0-py3-none-any.whl") + _pin(wheels / "beta-1.0-py3-none-any.whl")
    base = locks.Lock(locks.header("test", ["alpha<2"], "3.11", None, ()), base_body)
    wanted = {**locks.header("test", ["gamma"], "3.11", index, ()), "base": base.digest}
    lock = stack_locks.resolve_beside(base, wanted)
    assert lock.pins() == ["alpha==1.0", "beta==1.0", "gamma==1.0"]
    values = package_variables(_spec(), PackageSource.parse(f"wheels:{wheels}"), lock)
    assert values["requirements"] == [] and values["lock_digest"] == lock.digest
    box, cloud = _uv_box(host, tmp_path, **values)
    box.wait(lambda: "starting" in cloud.states or cloud.state.startswith("failed"), timeout=120)
    assert "starting" in cloud.states, box.log[-3000:]
    assert [_installed(box, m) for m in ("alpha", "beta", "gamma")] == ["1.0", "1.0", "1.0"]
    assert f"installing the lock {lock.digest} into" in box.log  # no ", then <requirements>,"


def test_a_lock_for_another_python_is_a_permanent_failure(host, tmp_path):
    wheels = _wheels(tmp_path)
    box, cloud = _locked_box(host, tmp_path, _pin(wheels["alpha1"]), python="3.10")
    box.wait(lambda: cloud.state.startswith("failed"), timeout=120)
    assert "is for Python 3.10 but this host's venv has Python 3.11" in cloud.state
    assert _installed(box, "alpha") is None


# ---- images: the builder's install, and a host booting from what it left ----------------------


def _builder(host: list[sandbox.Sandbox], tmp_path: Path, spec: spec_module.ClusterSpec) -> sandbox.Sandbox:
    """Run the image builder's boot in `tmp_path`'s root: it installs, then stops."""
    metadata = sandbox.base_metadata(image_builder_attributes(spec), name="rayslice-image-builder")
    box = _box(host, tmp_path / "builder", sandbox.StubCloud(metadata, {}))
    result = box.boot(box.render(spec, sandbox.free_port()))
    assert result.returncode == 0, result.stderr
    return box


def _booted_from(
    host: list[sandbox.Sandbox], tmp_path: Path, builder: sandbox.Sandbox, spec: spec_module.ClusterSpec
) -> sandbox.Sandbox:
    """A slice's host whose disk is a copy of the builder's (what an image gives it)."""
    shutil.copytree(builder.root, tmp_path / "host" / "root", symlinks=True)
    box = _box(host, tmp_path / "host", _cloud(spec))
    assert box.boot(box.render(spec, sandbox.free_port())).returncode == 0
    box.wait(lambda: _joined(box))
    return box


def test_the_image_builder_installs_then_leaves_only_the_venv(host, tmp_path):
    spec = _spec(rayAuth="none", platform="compute", acceleratorType="v6e-4")
    box = _builder(host, tmp_path, spec)
    assert box.cloud.states[-1] == names.STATE_IMAGE_READY
    assert "installing" in box.cloud.states
    assert box.uv_count.read_text().strip() == "1"
    marker = box.root / "opt/rayslice/venv/.rayslice-install"
    assert marker.read_text() == install_fingerprint(spec, PackageSource("pypi"))
    assert box.supervisor_pid() is None and not box.ray_starts()  # no Ray on a builder
    # Nothing of the builder's own boot stays on the disk the image is made from.
    assert not (box.root / "var/lib/rayslice").exists()
    assert not (box.root / "var/log/rayslice").exists()


def test_a_host_booted_from_the_image_skips_the_install(host, tmp_path):
    spec = _spec(rayAuth="none")
    box = _booted_from(host, tmp_path, _builder(host, tmp_path, spec), spec)
    assert "requirements unchanged" in box.log
    assert not box.uv_count.exists()  # uv never ran on the host
    assert "installing" not in box.cloud.states


def test_a_host_booted_from_an_image_for_other_requirements_installs_as_usual(host, tmp_path):
    baked = _spec(rayAuth="none", requirements=["six"])
    spec = _spec(rayAuth="none")
    box = _booted_from(host, tmp_path, _builder(host, tmp_path, baked), spec)
    old, new = (install_fingerprint(s, PackageSource("pypi")) for s in (baked, spec))
    assert f"holds the install {old}, not {new}" in box.log
    assert "installing over it" in box.log
    assert box.uv_count.read_text().strip() == "1"
    assert (box.root / "opt/rayslice/venv/.rayslice-install").read_text() == new


def test_a_preempted_host_starts_no_ray_until_the_marker_is_gone_and_boot_clears_it(host, tmp_path):
    """What the preemption watcher relies on: once it has written the marker and stopped Ray, the
    supervisor's next run_ray waits instead of starting Ray again (the GCS would list the node
    alive again just before Ray Train restarts); a withdrawn notice (the watcher removes the
    marker) lets Ray start, and a boot clears a marker left from before the VM stopped."""
    spec = _spec(rayAuth="none")
    cloud = _cloud(spec)
    box = _box(host, tmp_path, cloud)
    script = box.render(spec, sandbox.free_port())
    marker = box.root / "var/lib/rayslice/preempted"
    assert box.boot(script).returncode == 0
    box.wait(lambda: _joined(box))
    marker.write_text("notice\n")
    _kill_ray(box)  # what `ray stop` does
    box.wait(lambda: "Ray stays stopped: this host got its preemption notice" in box.log, timeout=30)
    time.sleep(2)
    assert len(box.ray_starts()) == 1
    marker.unlink()  # the notice withdrawn
    box.wait(lambda: len(box.ray_starts()) == 2, timeout=30)

    box.stop()  # the VM stopped with the marker in place
    marker.write_text("notice\n")
    assert box.boot(script).returncode == 0
    box.wait(lambda: len(box.ray_starts()) == 3, timeout=30)
    assert not marker.exists()


@pytest.mark.parametrize("where", ["rendered folder", "metadata"])
def test_the_host_ships_its_boot_log_to_the_record_as_it_runs_without_the_token(host, tmp_path, where):
    """The record service (`ship-record`) starts at boot and writes the boot log into the record
    while the host runs, every later line too, with the Ray token filtered out. Its location is
    the rendered folder (the simulator's) or, on the cloud, the one metadata names (a folder here:
    the sandbox has no Cloud Storage)."""
    spec = _spec(rayAuth="token")
    folder = tmp_path / "record"
    attribute = {names.ATTR_RECORD: str(folder)} if where == "metadata" else {}
    box = _box(host, tmp_path, _cloud(spec, extra=attribute))
    rendered = str(folder) if where == "rendered folder" else ""
    script = box.render(spec, sandbox.free_port(), record=rendered, record_interval_s=1)
    assert box.boot(script).returncode == 0
    box.wait(lambda: _joined(box))
    with (box.root / "var/log/rayslice/boot.log").open("a") as log:
        log.write(f"a job printed RAY_AUTH_TOKEN={TOKEN} and {TOKEN}\n")
    bucket = record.FolderBucket(folder)
    stream = f"hosts/sandbox-slice-0-vm0/{record.BOOT_LOG}"

    def shipped() -> str:
        return record.streams(bucket, "").get(stream, "")

    box.wait(lambda: "a job printed" in shipped())
    assert "state: joined" in shipped() and TOKEN not in shipped()
    assert not any(TOKEN.encode() in p.read_bytes() for p in folder.rglob("*") if p.is_file())


def test_without_a_record_location_the_host_ships_nothing_and_says_so_once(host, tmp_path):
    spec = _spec(rayAuth="none")
    box = _box(host, tmp_path, _cloud(spec))
    assert box.boot(box.render(spec, sandbox.free_port())).returncode == 0
    box.wait(lambda: _joined(box))
    box.wait(lambda: "no record location" in box.log)
    pidfile = box.root / "var/lib/rayslice/rayslice-record.pid"
    box.wait(lambda: not _group_alive(int(pidfile.read_text())))  # its supervisor ended
    assert box.log.count("no record location") == 1
