"""The README's quick start runs as printed, on a simulated slice.

Every line of the quick start's fenced bash blocks that calls `rayslice` (or `.venv/bin/rayslice`)
runs in order, with nothing added to it, and must exit 0. The test brings up its own slice
first, the way `scripts/demo.sh` does (`rayslice local up`), in its own state directory given
through RAYSLICE_STATE_DIR, so the lines need no `--state-dir`; the `simulation_dir` fixture
removes whatever is left.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RAYSLICE = str(Path(sys.executable).with_name("rayslice"))
PROGRAMS = ("rayslice", ".venv/bin/rayslice")
FENCED_BASH = re.compile(r"^```(?:bash|sh|shell|console)?[ \t]*\n(.*?)^```", re.M | re.S)


def quick_start(readme: str) -> str:
    """The text of the README's "Quick start" section, up to the next heading of the same level."""
    match = re.search(r"^(#+)\s+Quick start\b.*?$", readme, re.M | re.I)
    assert match, "README.md has no 'Quick start' section"
    level = len(match.group(1))
    end = re.compile(rf"^#{{1,{level}}}\s", re.M).search(readme, match.end())
    return readme[match.end() : end.start() if end else len(readme)]


def rayslice_lines(section: str) -> list[list[str]]:
    """argv of every `rayslice` line in the section's fenced code blocks (comments dropped)."""
    lines = []
    for block in FENCED_BASH.findall(section):
        for line in block.splitlines():
            argv = shlex.split(line, comments=True)
            if argv and argv[0] in PROGRAMS:
                lines.append(argv[1:])
    return lines


def test_the_parser_takes_rayslice_lines_from_the_quick_start_only():
    readme = (
        "# x\n## Quick start\n```bash\nbash scripts/demo.sh\n.venv/bin/rayslice local status   # hosts\n"
        "rayslice run jax_train -- --steps 20\n```\n### More\n```bash\nrayslice run --list\n```\n"
        "## Deploy\n```bash\nrayslice preview\n```\n"
    )
    assert rayslice_lines(quick_start(readme)) == [
        ["local", "status"],
        ["run", "jax_train", "--", "--steps", "20"],
        ["run", "--list"],
    ]


def _rayslice(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [RAYSLICE, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    print(
        f"$ rayslice {shlex.join(argv)}\n{result.stdout[-4000:]}{result.stderr[-3000:]}"
    )  # shown on failure
    return result


def test_every_quick_start_command_runs_as_printed(simulation_dir):
    lines = rayslice_lines(quick_start((REPO / "README.md").read_text(encoding="utf-8")))
    assert len(lines) >= 3, f"the quick start shows too few rayslice commands to be a quick start: {lines}"
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.defpath}",
        "HOME": os.environ.get("HOME", "/root"),
        "RAYSLICE_STATE_DIR": str(simulation_dir),
    }
    if not any(argv[:2] == ["local", "up"] for argv in lines):  # the demo's slice, as demo.sh makes it
        up = _rayslice(["local", "up"], env, timeout=900)
        assert up.returncode == 0, "rayslice local up failed"
    for argv in lines:
        result = _rayslice(argv, env, timeout=900)
        assert result.returncode == 0, f"`rayslice {shlex.join(argv)}` exited {result.returncode}"
