"""The built wheel: folders map onto rayslice.* and nothing else lands at the top level; every
command is registered by entry point and ships with the wheel."""

from __future__ import annotations

import zipfile


def test_wheel_has_only_the_rayslice_package(rayslice_wheel):
    names = zipfile.ZipFile(rayslice_wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"rayslice"}
    for sub in ("infra", "startup_scripts", "workloads", "local"):
        assert f"rayslice/{sub}/__init__.py" in names
    assert "rayslice/startup_scripts/startup.sh.j2" in names
    assert "rayslice/__main__.py" in names  # `python -m rayslice`
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(rayslice_wheel).read(entry_points).decode()
    assert "rayslice = rayslice.cli:entry_point" in text
    commands = text.split("[rayslice.commands]")[1].split("\n[")[0]
    registered = dict(line.split(" = ") for line in commands.strip().splitlines())
    assert registered == {
        "image": "rayslice.infra.commands:image_group",
        "local": "rayslice.local.commands:local_group",
        "preview": "rayslice.infra.commands:preview_command",
        "render": "rayslice.startup_scripts.commands:render_command",
        "run": "rayslice.jobs.commands:run_command",
        "status": "rayslice.recovery.commands:status_command",
        "fit": "rayslice.fit.commands:fit_command",
        "history": "rayslice.observability.commands:history_command",
        "goodput": "rayslice.observability.commands:goodput_command",
    }
    for target in registered.values():  # every registered module is in the wheel
        assert target.split(":")[0].replace(".", "/") + ".py" in names
