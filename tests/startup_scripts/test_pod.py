"""The pod start script's variables and rendering (running it: tests/integration/test_pod_start.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rayslice import spec as specs
from rayslice.errors import InvalidInput
from rayslice.startup_scripts import pod
from rayslice.startup_scripts.variables import preset_lock

SHELLCHECK = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")


def gke_spec(accelerator: str = "v6e-16", slices: int = 1, **extra) -> specs.ClusterSpec:
    zone = {"v6e": "us-east5-b", "v5p": "us-east5-a", "tpu7x": "us-central1-c"}[accelerator.split("-")[0]]
    return specs.load(
        {
            "platform": "gke",
            "acceleratorType": accelerator,
            "zone": zone,
            "slices": slices,
            "name": "demo",
            **extra,
        }
    )


@pytest.mark.parametrize(
    "accelerator,slices,source",
    [
        ("v6e-4", 1, None),
        ("v6e-16", 2, None),
        ("v5p-16", 1, "wheels:/srv/wheels"),
        ("tpu7x-16", 3, "venv:/opt/ray venv"),
    ],
)
def test_rendered_script_passes_bash_n_and_shellcheck(tmp_path, accelerator, slices, source):
    script = tmp_path / "pod-start.sh"
    script.write_text(pod.render_pod_start(gke_spec(accelerator, slices, preset="xla"), source))
    subprocess.run(["bash", "-n", str(script)], check=True)
    result = subprocess.run([SHELLCHECK, "--severity=warning", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_hostnames_are_per_slice_lists_ordered_by_worker_id():
    variables = pod.pod_variables(gke_spec("v6e-16", slices=2))
    assert variables["slice_hostnames"] == [
        "demo-s0-h0,demo-s0-h1,demo-s0-h2,demo-s0-h3",
        "demo-s1-h0,demo-s1-h1,demo-s1-h2,demo-s1-h3",
    ]
    assert variables["slice_names"] == ["demo-slice-0", "demo-slice-1"]
    assert variables["megascale_coordinator"] == "demo-s0-h0"
    assert variables["hosts"] == 4 and variables["num_slices"] == 2


def test_requirements_are_the_boot_scripts():
    cluster_spec = gke_spec(requirements='["optax>=0.2"]', packageIndex="https://pypi.internal/simple")
    variables = pod.pod_variables(cluster_spec)
    # The preset and Ray come from its lock; only the user's line is resolved in the container.
    assert variables["requirements"] == ["optax>=0.2"]
    assert variables["lock"] and variables["lock_digest"] == preset_lock(cluster_spec).digest
    assert variables["package_index"] == "https://pypi.internal/simple"
    assert variables["package_mode"] == "pypi"


def test_hostile_values_stay_quoted():
    script = pod.render_pod_start(gke_spec(), "venv:/tmp/a b;$(touch /tmp/pwned)")
    assert "PACKAGE_DIR='/tmp/a b;$(touch /tmp/pwned)'" in script


def test_image_follows_the_ray_version():
    assert pod.ray_image(gke_spec(rayVersion="2.61.1")) == "rayproject/ray:2.61.1-py311"


def test_unknown_package_source_is_refused():
    with pytest.raises(InvalidInput, match="wheels:DIR or venv:DIR"):
        pod.pod_variables(gke_spec(), "pip:/x")
