"""The controller VM's boot script, run by real bash against a stub metadata server: it runs the
controller only if the bundle in metadata is the one whose sha256 it was rendered with."""

from __future__ import annotations

import base64
import contextlib
import io
import os
import signal
import sys
import zipfile
from pathlib import Path

import pytest

from rayslice import names
from rayslice import spec as spec_module
from rayslice.local.host.processes import cmdline
from rayslice.recovery import bundle
from rayslice.startup_scripts import RenderOptions
from rayslice.startup_scripts.controller import controller_attributes, render_controller
from rayslice.startup_scripts.variables import SUPERVISOR_RESTART_DELAY_S
from tests.startup_scripts import sandbox

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


@pytest.mark.parametrize(
    "value, reason",
    [(_tampered(), "(sha256 differs); refusing to run it"), ("not base64 at all!", "is not valid base64")],
    ids=["changed-bundle", "not-base64"],
)
def test_a_bundle_changed_in_metadata_is_refused_and_never_run(
    tmp_path: Path, value: str, reason: str
) -> None:
    attributes = {**controller_attributes(SPOT), names.ATTR_RECOVERY_BUNDLE: value}
    metadata = sandbox.base_metadata(attributes, name=names.controller_name(SPOT.name))
    metadata["instance/zone"] = "projects/1/zones/us-east5-b"
    cloud = sandbox.StubCloud(metadata, {})
    box = sandbox.Sandbox(tmp_path, cloud)
    options = RenderOptions(supervisor="process", package_source=f"venv:{sys.prefix}", root=str(box.root))
    script = tmp_path / "controller.sh"
    script.write_text(render_controller(SPOT, options))
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
