"""The controller VM's boot script, run by real bash against a stub metadata server: it installs
only the files its lock names, and runs the controller only if the bundle in metadata is the one
whose sha256 it was rendered with."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rayslice import names
from rayslice import spec as spec_module
from rayslice.local.host.processes import cmdline
from rayslice.observability import record
from rayslice.recovery import bundle
from rayslice.startup_scripts import RenderOptions, controller, locks
from rayslice.startup_scripts.controller import controller_attributes, render_controller
from rayslice.startup_scripts.variables import SUPERVISOR_RESTART_DELAY_S
from tests.startup_scripts import sandbox
from tests.startup_scripts.test_startup_scripts import rendered_values
from tests.startup_scripts.tiny_wheels import make_wheel, sha256

SPOT = spec_module.load({"acceleratorType": "v6e-16", "capacity": "spot", "slices": 2}, require_zone=False)


def _tampered() -> str:
    """The real bundle with one module changed: still a valid zipapp, another hash."""
    source = zipfile.ZipFile(io.BytesIO(bundle.build()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "rayslice/recovery/controller.py":
                data += b"\nimport os  # an attacker's line\n"
            archive.writestr(info, data)
    return base64.b64encode(out.getvalue()).decode()


def _controller_vm(
    tmp_path: Path, attributes: dict[str, str], package_source: str
) -> tuple[sandbox.StubCloud, sandbox.Sandbox, Path]:
    """A sandboxed controller VM with these metadata attributes, and its script rendered for it."""
    metadata = sandbox.base_metadata(attributes, name=names.controller_name(SPOT.name))
    metadata["instance/zone"] = "projects/1/zones/us-east5-b"
    cloud = sandbox.StubCloud(metadata, {})
    box = sandbox.Sandbox(tmp_path, cloud)
    options = RenderOptions(supervisor="process", package_source=package_source, root=str(box.root))
    script = tmp_path / "controller.sh"
    script.write_text(render_controller(SPOT, options))
    return cloud, box, script


@pytest.mark.parametrize(
    "value, reason",
    [(_tampered(), "(sha256 differs); refusing to run it"), ("not base64 at all!", "is not valid base64")],
    ids=["changed-bundle", "not-base64"],
)
def test_a_bundle_changed_in_metadata_is_refused_and_never_run(
    tmp_path: Path, value: str, reason: str
) -> None:
    attributes = {**controller_attributes(SPOT), names.ATTR_RECOVERY_BUNDLE: value}
    cloud, box, script = _controller_vm(tmp_path, attributes, f"venv:{sys.prefix}")
    result = box.boot(script, timeout=60, RAYSLICE_METADATA_DEADLINE_S="5")  # boots the supervisor
    try:
        assert result.returncode == 0, result.stderr
        box.wait(lambda: cloud.state.startswith(names.STATE_FAILED_PREFIX), timeout=60)
        assert reason in cloud.state
        assert names.STATE_WATCHING not in cloud.states
        assert not (box.root / "opt/rayslice/recovery.pyz").exists()  # nothing written where it runs from
        assert "recovery: watching" not in box.log
        # EXIT_PERMANENT ends supervision: the loop that would try again after the restart delay exits.
        box.wait(lambda: _supervisor_loops(box.root) == [], timeout=SUPERVISOR_RESTART_DELAY_S + 30)
        assert len(cloud.states) == 1, cloud.states
    finally:  # a loop that went on trying (the test failed) goes with the test
        for pid in _supervisor_loops(box.root):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def _supervisor_loops(root: Path) -> list[int]:
    """The process supervisors (boot's `bash -c 'while :; ...' _ SCRIPT ...`) of the controller
    script under `root`, found by the script they run."""
    script = str(root / "var/lib/rayslice/controller.sh")
    pids = (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return [pid for pid in pids if (argv := cmdline(pid))[:2] == ["bash", "-c"] and argv[4:5] == [script]]


# ---- what the controller VM installs ----------------------------------------------------------


@pytest.mark.parametrize(
    "index, expected",
    [
        (None, ""),
        ("https://pypi.example.internal/simple", "https://pypi.example.internal/simple"),
        ("http://pypi.example.internal/simple", ""),  # allowInsecurePackageIndex: PyPI over https instead
    ],
    ids=["pypi", "https-index", "http-index"],
)
def test_the_controller_installs_its_hashed_lock_and_never_from_a_plain_http_index(index, expected):
    raw = {"acceleratorType": "v6e-16", "capacity": "spot", "slices": 2}
    if index:
        raw |= {"packageIndex": index, "allowInsecurePackageIndex": True}
    script = render_controller(spec_module.load(raw, require_zone=False))
    values = rendered_values(script)
    assert values["PACKAGE_INDEX"] == expected and "http://pypi" not in script
    lock = locks.parse(base64.b64decode(values["LOCK"]).decode())
    assert lock == controller.controller_lock() and values["LOCK_DIGEST"] == lock.digest
    # The one pip install: the lock file alone, each file checked against its hashes, nothing
    # resolved or built; no requirement name reaches pip.
    pip_args = script.split(" -m pip install ", 1)[1].split(">>", 1)[0].split()
    assert pip_args == [
        *[
            "--quiet",
            "--disable-pip-version-check",
            "--require-hashes",
            "--no-deps",
            "--only-binary",
            ":all:",
        ],
        *["\\", '"${SOURCE_ARGS[@]}"', "-r", '"$lock"'],
    ]
    assert script.count(" -m pip install ") == 1


def test_the_shipped_controller_lock_pins_every_package_by_hash():
    lock = controller.controller_lock()
    assert dict(lock.header) == controller.LOCK.header(), (
        "regenerate: python scripts/lock_presets.py controller"
    )
    assert locks.foreign_line(lock.text) is None
    names = [pin.partition("==")[0] for pin in lock.pins()]
    assert {"google-auth", "requests"} <= set(names) and len(names) == len(set(names))
    blocks = lock.body.split("==")[1:]
    assert all("--hash=sha256:" in block for block in blocks)


def _run_install(tmp_path: Path, wheels: Path) -> tuple[sandbox.Sandbox, subprocess.Popen[str]]:
    """The controller script's payload (`controller.sh run`) on a sandbox whose package source is
    `wheels`: real bash, a real venv and real pip."""
    _, box, script = _controller_vm(tmp_path, controller_attributes(SPOT), f"wheels:{wheels}")
    env = box.environment(RAYSLICE_METADATA_DEADLINE_S="5", RAYSLICE_RETRY_MAX_DELAY_S="1")
    process = subprocess.Popen(
        ["bash", str(script), "run"],
        env=env,
        cwd=tmp_path,
        text=True,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return box, process


def _stand_in_lock(wheels: Path) -> locks.Lock:
    """A controller lock of tiny stand-ins: alpha 1.0 and gamma 1.0 (which needs beta), by hash,
    in a wheelhouse that also holds alpha 2.0 and beta."""
    alpha, gamma = make_wheel(wheels, "alpha", "1.0"), make_wheel(wheels, "gamma", "1.0", ("beta",))
    make_wheel(wheels, "alpha", "2.0")
    make_wheel(wheels, "beta", "1.0")
    body = "".join(
        f"{w.name.split('-')[0]}=={w.name.split('-')[1]} \\\n    --hash=sha256:{sha256(w)}\n"
        for w in (alpha, gamma)
    )
    return locks.Lock(controller.LOCK.header(), body)


def test_the_controller_vm_installs_exactly_the_locked_files(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    lock = _stand_in_lock(wheels)
    monkeypatch.setattr(controller, "controller_lock", lambda: lock)
    box, process = _run_install(tmp_path, wheels)
    try:
        process.wait(timeout=180)  # it installs, writes the bundle, whose controller cannot import google
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert f"from the lock {lock.digest}" in box.log
    python = box.root / "opt/rayslice/venv/bin/python"
    probe = "import importlib.util as u, alpha, gamma; print(alpha.VERSION, u.find_spec('beta') is None)"
    found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout
    assert found.split() == ["1.0", "True"]  # the locked alpha, not 2.0; gamma's beta not resolved
    assert (box.root / "opt/rayslice/recovery.pyz").exists()


def test_the_controller_vm_ships_its_log_and_decisions_to_the_record_as_they_are_written(
    tmp_path: Path,
) -> None:
    """Its second service (`ship-record`) writes the boot log and the controller's event log into
    the record named in metadata (a folder here: the sandbox has no Cloud Storage) while it runs."""
    folder = tmp_path / "record"
    attributes = {**controller_attributes(SPOT), names.ATTR_RECORD: str(folder)}
    _, box, script = _controller_vm(tmp_path, attributes, f"venv:{sys.prefix}")
    try:
        assert box.boot(script, timeout=60, RAYSLICE_RECORD_INTERVAL_S="1").returncode == 0
        decision = (
            '{"time": "2026-12-06T18:00:00Z", "slice": "s-1", "seen": "PREEMPTED", "action": "recreate"}'
        )
        events = box.root / "var/log/rayslice/recovery-events.jsonl"
        events.parent.mkdir(parents=True, exist_ok=True)
        with events.open("a") as out:
            out.write(decision + "\n")
        bucket = record.FolderBucket(folder)
        vm = names.controller_name(SPOT.name)
        box.wait(lambda: record.events(bucket, "") != [], timeout=60)
        assert record.events(bucket, "") == [json.loads(decision)]  # the controller's decision
        shipped = record.streams(bucket, "")
        assert "boot: rayslice controller VM script" in shipped[f"hosts/{vm}/{record.BOOT_LOG}"]
        assert set(shipped) == {f"hosts/{vm}/{record.BOOT_LOG}", f"events/{vm}"}
    finally:
        for pid in _supervisor_loops(box.root):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
