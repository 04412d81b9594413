"""The README's quick start runs as printed, on a simulated slice.

Every line of the quick start's fenced bash blocks that calls `rayslice` (or `.venv/bin/rayslice`)
runs in order, with nothing added to it, and must exit 0. They run on the slice `scripts/demo.sh`
leaves running, brought up the same way (`rayslice local up`, so with every production default)
in its own state directory given through RAYSLICE_STATE_DIR, so the lines need no `--state-dir`.
Before them, a test checks what that slice is: Compute Engine hosts (the default platform for a
v6e) that joined Ray with the identity derived from their instance names. `rayslice local up`
and `local down` through the CLI are checked here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rayslice import names
from rayslice.local.host import netns
from rayslice.local.host.processes import is_alive
from rayslice.local.simulation.simulator import Simulation
from rayslice.local.simulation.state import STATE_FILE
from tests.integration.clusters import SHORT_WAITS, raylet_environment

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


@dataclass
class Demo:
    """The demo's slice: where it lives, the environment the README's lines run in, `local up`'s output."""

    state_dir: Path
    env: dict[str, str]
    up: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """The slice the quick start runs on, brought up the way `scripts/demo.sh` does (`rayslice
    local up`, defaults only, so its hosts run Ray with its production settings), in its own state
    directory given through RAYSLICE_STATE_DIR; removed afterwards whatever the tests did."""
    state_dir = tmp_path_factory.mktemp("readme") / "sim"
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.defpath}",
        "HOME": os.environ.get("HOME", "/root"),
        "RAYSLICE_STATE_DIR": str(state_dir),
    }
    if "PYTHONPATH" in os.environ:  # a checkout's own code, as the tests import it
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    try:
        yield Demo(state_dir, env, _rayslice(["local", "up"], env, timeout=900))
    finally:
        if (state_dir / STATE_FILE).exists():
            Simulation.open(state_dir).destroy()


# Cloud-TPU-API attributes a Compute Engine host must do without (issue 9.5); it has Google's
# `platforms.COMPUTE_TPU_ATTRIBUTES` (issue 19.5) and rayslice's names as well.
CLOUD_TPU_API_ONLY = ("instance-id", "agent-worker-number")


def test_the_demos_slice_is_compute_engine_hosts_that_joined_with_identities_from_their_names(demo):
    assert demo.up.returncode == 0, "rayslice local up failed"
    assert "waiting: head" in demo.up.stdout and "all hosts joined" in demo.up.stdout
    sim = Simulation.open(demo.state_dir)
    spec = sim.spec()
    assert spec.platform == "compute"  # the default for the demo's v6e
    tpu, head_resource = spec.tpu, f"TPU-{spec.accelerator_type}-head"
    # Worker order is the order Pulumi created the per-instance configs in, which it leaves open.
    assert sorted(h.name for h in sim.plan.hosts) == [
        names.host_name(spec.slice_name(0), w) for w in range(tpu.hosts)
    ]
    for host in sim.plan.hosts:
        attributes = json.loads(sim.paths(host.name).metadata_tree.read_text())["instance"]["attributes"]
        assert not set(CLOUD_TPU_API_ONLY) & set(attributes)
        # `local up` leaves Ray's own timeouts alone (the other tests' hosts shorten them).
        assert not set(raylet_environment(sim, host.name)) & set(SHORT_WAITS)

    status = _rayslice(["local", "status", "--json"], demo.env, timeout=120)
    assert status.returncode == 0
    report = json.loads(status.stdout)
    assert [h["state"] for h in report["hosts"]] == ["joined"] * tpu.hosts
    nodes = report["ray"]["nodes"]
    assert len(nodes) == tpu.hosts
    # The head is `-w0`, where the stack's outputs point, whichever worker number the twin gave
    # it; Ray's nodes above were read from the dashboard at that host's address.
    w0 = names.host_name(spec.slice_name(0), 0)
    assert [h["name"] for h in report["hosts"] if h["role"] == "head"] == [w0]
    assert report["dashboard"] == f"http://{sim.plan.host(w0).ip}:{names.DASHBOARD_PORT}"
    totals = report["ray"]["totals"]
    assert (
        totals["TPU"] == tpu.chips and totals[head_resource] == 1 and totals[spec.slice_name(0)] == tpu.hosts
    )
    by_ip = {n["ip"]: n for n in nodes}
    for host in report["hosts"]:
        node = by_ip[host["ip"]]
        assert node["resources"]["TPU"] == tpu.chips_per_host and node["resources"][spec.slice_name(0)] == 1
        assert node["labels"]["ray.io/tpu-worker-id"] == str(host["worker"])
        assert (head_resource in node["resources"]) == (host["worker"] == 0)


def test_every_quick_start_command_runs_as_printed(demo):
    lines = rayslice_lines(quick_start((REPO / "README.md").read_text(encoding="utf-8")))
    assert len(lines) >= 3, f"the quick start shows too few rayslice commands to be a quick start: {lines}"
    assert not any(argv[:2] == ["local", "up"] for argv in lines), (
        "the quick start runs on the slice scripts/demo.sh leaves running; bringing it up is demo.sh's"
    )
    assert demo.up.returncode == 0, "rayslice local up failed"
    sim = Simulation.open(demo.state_dir)
    refs = list(sim.state.processes.values())
    for argv in lines:
        result = _rayslice(argv, demo.env, timeout=900)
        assert result.returncode == 0, f"`rayslice {shlex.join(argv)}` exited {result.returncode}"
    if ["local", "down"] in lines:  # nothing of the slice is left
        assert not any(is_alive(ref) for ref in refs)
        assert not any(netns.netns_exists(h.netns) for h in sim.plan.hosts)
        assert not demo.state_dir.exists()
        _the_record_outlives_the_slice(demo, sim)


def _the_record_outlives_the_slice(demo: Demo, sim: Simulation) -> None:
    """After `local down`, `rayslice history` shows the quick start's job (its status and log),
    the cluster's events and boot logs, and the job's goodput (issue 42)."""
    listed = _rayslice(["history", "--json"], demo.env, timeout=120)
    assert listed.returncode == 0
    [cluster] = [c for c in json.loads(listed.stdout) if c["cluster"].endswith("/" + sim.plan.run_id)]
    [job] = [j for j in cluster["jobs"] if "jax_train" in j["entrypoint"]]
    assert job["status"] == "SUCCEEDED" and cluster["info"]["ended"]
    log = _rayslice(["history", "--job", job["job_id"]], demo.env, timeout=120)
    assert log.returncode == 0 and re.search(r"step +19 +loss", log.stdout)
    shown = _rayslice(["history", sim.plan.run_id], demo.env, timeout=120)
    assert shown.returncode == 0
    assert "events (" in shown.stdout and f"goodput of {job['job_id']}" in shown.stdout
    assert f"boot logs of {len(sim.plan.hosts)} host(s)" in shown.stdout
    # Written by the hosts as they ran (pieces named by their byte range and the shipper's random
    # part), not copied at `down`.
    kept = [p for p in sim.record_folder.rglob("*") if p.is_file()]
    for host in sim.plan.hosts:
        pieces = [p for p in kept if p.parent == sim.record_folder / "hosts" / host.name / "boot.log"]
        assert pieces and all(re.fullmatch(r"\d{12}-\d{12}-[0-9a-f]{8}", p.name) for p in pieces), host.name
    report = _rayslice(["goodput", "--json", job["job_id"]], demo.env, timeout=120)
    assert report.returncode == 0
    figures = json.loads(report.stdout)
    assert figures["steps_lost"] == 0 and figures["last_step"] == 19 and figures["productive_s"] > 0
