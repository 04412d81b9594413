"""The controller as its VM gets it: a reproducible zipapp that runs with nothing else of rayslice."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from rayslice import spec
from rayslice.infra.metadata import controller_metadata
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.names import ATTR_CLUSTER, ATTR_PLATFORM, ATTR_RECOVERY_BUNDLE, HEAD_VM_SLICE_INDEX
from rayslice.recovery import bundle
from rayslice.startup_scripts import host_attributes
from rayslice.startup_scripts.controller import controller_attributes, render_controller
from tests.conftest import REPO
from tests.imports import closure
from tests.recovery.conftest import CLUSTER, PROJECT, ZONE, seed

# Runs the zipapp as `python recovery.pyz ARGS` does, after removing the finder of this checkout's
# editable install, then reports every rayslice module loaded from anywhere but the zip.
RUNNER = """
import json, runpy, sys
archive, args = sys.argv[1], sys.argv[2:]
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
sys.argv = [archive, *args]
try:
    runpy.run_path(archive, run_name="__main__")
    code = 0
except SystemExit as exc:
    code = exc.code
outside = sorted(
    name for name, module in sys.modules.items()
    if name.split(".")[0] == "rayslice" and not (getattr(module, "__file__", "") or "").startswith(archive)
)
print(json.dumps({"code": code, "outside": outside}))
"""


# The earliest date a zip entry can carry: what every entry must say, whenever it is built.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def test_the_bundle_is_reproducible_and_holds_only_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two builds a day and a half apart (the clock zipfile reads is moved, not slept) give the
    same bytes, and no entry carries the time it was built."""
    data = bundle.build()
    later = time.time() + 36 * 3600 + 17
    monkeypatch.setattr(time, "time", lambda: later)
    monkeypatch.setattr(
        time, "localtime", lambda seconds=None: time.gmtime(later if seconds is None else seconds)
    )
    assert data == bundle.build()
    entries = zipfile.ZipFile(io.BytesIO(data)).infolist()
    assert {entry.date_time for entry in entries} == {ZIP_EPOCH}
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert names == ["__main__.py", *bundle.MODULES]
    assert base64.b64decode(bundle.encoded()) == data


def test_the_bundle_holds_exactly_the_controllers_import_closure() -> None:
    """Every module the controller imports from rayslice is in `MODULES`, and nothing else is."""
    assert closure([bundle.ENTRY]) == set(bundle.MODULES)
    assert len(set(bundle.MODULES)) == len(bundle.MODULES)


def test_the_bundle_runs_one_pass_against_the_api_with_nothing_else_of_rayslice(
    cloud: CloudApiEmulator, adc: Path, tmp_path: Path
) -> None:
    seed(cloud, "tpu-vm")
    archive = tmp_path / "recovery.pyz"
    archive.write_bytes(bundle.build())
    events = tmp_path / "events.jsonl"
    args = ["--once", f"--project={PROJECT}", f"--zone={ZONE}", f"--cluster={CLUSTER}"]
    args += ["--platform=tpu-vm", "--slices=2", "--no-guest-attributes", f"--event-log={events}"]
    args += [f"--state-dir={tmp_path / 'state'}"]
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, str(archive), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ""},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report == {"code": 0, "outside": []}, result.stderr
    # It asked the API about both slices (the emulation saw the GETs) and found nothing to do.
    gets = [c.path.rsplit("/", 1)[-1] for c in cloud.calls if c.method == "GET" and "/nodes/" in c.path]
    assert sorted(set(gets)) == [f"{CLUSTER}-slice-0", f"{CLUSTER}-slice-1"]
    assert cloud.mutations() == [] and not events.exists()
    # And kept each slice's spec where a restarted controller finds it.
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [
        f"{CLUSTER}-slice-0.json",
        f"{CLUSTER}-slice-1.json",
    ]


def test_only_the_controller_vm_carries_the_controller() -> None:
    spot = spec.load({"acceleratorType": "v6e-16", "capacity": "spot", "slices": 2}, require_zone=False)
    controller = controller_attributes(spot)
    assert controller[ATTR_RECOVERY_BUNDLE] == bundle.encoded()
    assert (controller[ATTR_CLUSTER], controller[ATTR_PLATFORM]) == (spot.name, spot.platform)
    # Neither the head VM (Ray and every job's driver) nor a TPU host ever gets it.
    for index in (HEAD_VM_SLICE_INDEX, 0, 1):
        assert not {ATTR_RECOVERY_BUNDLE, ATTR_CLUSTER, ATTR_PLATFORM} & set(host_attributes(spot, index))


def test_the_controller_script_pins_the_bundles_hash() -> None:
    spot = spec.load({"acceleratorType": "v6e-16", "capacity": "spot", "slices": 2}, require_zone=False)
    script = render_controller(spot)
    assert f"BUNDLE_SHA256={hashlib.sha256(base64.b64decode(bundle.encoded())).hexdigest()}\n" in script


def _mypy(tree: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """mypy, with the project's settings but the controller VM's Python (`bundle.PYTHON`), over
    every file of the bundle extracted into `tree`, found by walking it (not by a list)."""
    files = sorted(str(path.relative_to(tree)) for path in tree.rglob("*.py"))
    command = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml")]
    command += ["--python-version", bundle.PYTHON, "--cache-dir", str(cache), "--no-error-summary", *files]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tree)


def test_the_bundle_type_checks_on_the_controller_vms_python(tmp_path: Path) -> None:
    """The controller VM runs the bundle with its image's python3 (`bundle.PYTHON`, 3.10), where
    rayslice itself needs 3.11: mypy, told that Python, refuses any name that Python lacks. The
    second half shows it does (a 3.11-only name, added to one shipped module, fails it)."""
    tree = tmp_path / "bundle"
    zipfile.ZipFile(io.BytesIO(bundle.build())).extractall(tree)
    assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*.py")) == sorted(
        ["__main__.py", *bundle.MODULES]
    )
    result = _mypy(tree, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    events = tree / "rayslice/recovery/events.py"
    events.write_text(
        events.read_text() + "\nimport datetime\n\nSTARTED = datetime.datetime.now(datetime.UTC)\n"
    )
    result = _mypy(tree, tmp_path / "cache")
    assert result.returncode == 1 and 'Module has no attribute "UTC"' in result.stdout, result.stdout


def test_the_controller_vm_metadata_fits_compute_engines_limit() -> None:
    """Compute Engine allows 512 KB of metadata per instance, keys and values together."""
    spot = spec.load({"acceleratorType": "v6e-16", "capacity": "spot", "slices": 2}, require_zone=False)
    metadata = controller_metadata(spot, render_controller(spot))
    assert metadata[ATTR_RECOVERY_BUNDLE] == bundle.encoded()
    assert sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items()) < 512 * 1024
