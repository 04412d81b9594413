"""The built wheel: folders map onto rayslice.* and nothing else lands at the top level; every
command is registered by entry point and ships with the wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests.conftest import REPO


def test_wheel_has_only_the_rayslice_package(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = tmp_path.glob("rayslice-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"rayslice"}
    for sub in ("infra", "startup_scripts", "workloads", "local"):
        assert f"rayslice/{sub}/__init__.py" in names
    assert "rayslice/startup_scripts/startup.sh.j2" in names
    assert "rayslice/__main__.py" in names  # `python -m rayslice`
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "rayslice = rayslice.cli:entry_point" in text
    commands = text.split("[rayslice.commands]")[1].split("\n[")[0]
    registered = dict(line.split(" = ") for line in commands.strip().splitlines())
    assert registered == {
        "local": "rayslice.local.commands:local_group",
        "preview": "rayslice.infra.commands:preview_command",
        "render": "rayslice.startup_scripts.commands:render_command",
        "run": "rayslice.jobs.commands:run_command",
        "status": "rayslice.recovery.commands:status_command",
    }
    for target in registered.values():  # every registered module is in the wheel
        assert target.split(":")[0].replace(".", "/") + ".py" in names
