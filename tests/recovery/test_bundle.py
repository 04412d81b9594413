"""The controller as the head VM gets it: a reproducible zipapp that runs with nothing else of rayslice."""

from __future__ import annotations

import ast
import base64
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from rayslice import spec
from rayslice.infra.metadata import host_metadata
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.names import ATTR_CLUSTER, ATTR_PLATFORM, ATTR_RECOVERY_BUNDLE, HEAD_VM_SLICE_INDEX
from rayslice.recovery import bundle
from rayslice.startup_scripts import host_attributes, render
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


def test_the_bundle_is_reproducible_and_holds_only_the_controller() -> None:
    data = bundle.build()
    assert data == bundle.build()
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


def test_only_the_head_vm_of_a_recovering_cluster_carries_the_controller() -> None:
    spot = spec.load({"acceleratorType": "v6e-16", "capacity": "spot", "slices": 2}, require_zone=False)
    head = host_attributes(spot, HEAD_VM_SLICE_INDEX)
    assert head[ATTR_RECOVERY_BUNDLE] == bundle.encoded()
    assert (head[ATTR_CLUSTER], head[ATTR_PLATFORM]) == (spot.name, spot.platform)
    assert ATTR_RECOVERY_BUNDLE not in host_attributes(spot, 0)  # TPU hosts never get it
    off = spec.load(
        {"acceleratorType": "v6e-16", "capacity": "spot", "slices": 2, "recovery": False}, require_zone=False
    )
    assert not {ATTR_RECOVERY_BUNDLE, ATTR_CLUSTER} & set(host_attributes(off, HEAD_VM_SLICE_INDEX))


# Standard-library names that Python 3.11 added (its "What's New"): none may appear in the bundle.
NEW_IN_311 = {
    ("datetime", "UTC"),
    ("typing", "Self"),
    ("typing", "LiteralString"),
    ("typing", "Never"),
    ("typing", "assert_never"),
    ("typing", "reveal_type"),
    ("typing", "Required"),
    ("typing", "NotRequired"),
    ("enum", "StrEnum"),
    ("asyncio", "TaskGroup"),
    ("asyncio", "timeout"),
}
NEW_MODULES_311 = {"tomllib", "wsgiref.types"}


def test_the_bundle_is_python_3_10_code() -> None:
    """An offline head VM runs it with Ubuntu 22.04's Python 3.10 (see rayslice.recovery.bundle)."""
    archive = zipfile.ZipFile(io.BytesIO(bundle.build()))
    for name in archive.namelist():
        tree = ast.parse(archive.read(name), filename=name, feature_version=(3, 10))
        for node in ast.walk(tree):
            assert not isinstance(node, ast.TryStar), f"{name}:{node.lineno}: except* is 3.11"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert (node.value.id, node.attr) not in NEW_IN_311, f"{name}:{node.lineno}"
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not {(node.module, a.name) for a in node.names} & NEW_IN_311, f"{name}:{node.lineno}"
                assert node.module not in NEW_MODULES_311, f"{name}:{node.lineno}"
            if isinstance(node, ast.Import):
                assert not {a.name for a in node.names} & NEW_MODULES_311, f"{name}:{node.lineno}"


def test_the_head_metadata_with_the_controller_fits_compute_engines_limit() -> None:
    """Compute Engine allows 512 KB of metadata per instance, keys and values together."""
    spot = spec.load({"acceleratorType": "v6e-16", "capacity": "spot", "slices": 2}, require_zone=False)
    metadata = host_metadata(spot, render(spot), HEAD_VM_SLICE_INDEX, token_secret="rayslice-ray-token")
    assert metadata[ATTR_RECOVERY_BUNDLE] == bundle.encoded()
    assert sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items()) < 512 * 1024
