"""Bring-up of a simulated v6e-16 slice: rayslice's boot script against the guide done literally.

Measured in one process, on the same simulated hosts and the same local wheelhouse:

* rayslice: every host boots at once and runs the rendered boot script (uv install into a
  venv, role from metadata, wait for the head, Ray under a supervisor); the clock stops when
  the head's state API shows every host as an alive Ray node.
* guide: what the guide asks a person to do, host after host: create a venv, ``pip install -r
  requirements.txt``, then ``ray start --head`` on the first host and ``ray start --address``
  on the others (the address pasted in); the clock stops at the same condition.
* reboot: every host of the rayslice slice reboots; the script finds its requirements
  installed (the fast path) and the clock stops when all hosts are alive Ray nodes again.

Run as root: ``.venv/bin/python bench/bringup.py`` (prints seconds and ratios).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

from rayslice import spec as spec_module
from rayslice.local.simulator import Simulation
from rayslice.local.wheelhouse import ensure_wheelhouse
from rayslice.names import GCS_PORT
from rayslice.startup_scripts.variables import requirement_lines

REPO = Path(__file__).resolve().parents[1]
OBJECT_STORE = 100 * 1024 * 1024


def wait_for_nodes(
    sim: Simulation, count: int, timeout: float, exclude: frozenset[str] = frozenset()
) -> float:
    """Seconds until `count` alive TPU nodes (none of them in `exclude`) are registered."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            nodes = [n for n in sim.ray_nodes() if n["resources"].get("TPU") and n["id"] not in exclude]
        except OSError:
            nodes = []
        if len(nodes) == count:
            return time.monotonic() - start
        time.sleep(0.5)
    raise RuntimeError(f"{count} nodes did not come up within {timeout:.0f}s; states: {sim.states()}")


def guide_script(head_ip: str, head_name: str, wheelhouse: Path, lines: list[str], chips: int) -> str:
    """The guide's manual steps as one host would type them (venv, pip install, ray start)."""
    q = shlex.quote
    requirements = "\\n".join(lines)
    common = (
        f"--node-ip-address=\"$(hostname -i | cut -d' ' -f1)\" --resources={q(json.dumps({'TPU': chips}))} "
        f"--object-store-memory={OBJECT_STORE} --disable-usage-stats"
    )
    return f"""#!/bin/bash
set -euo pipefail
export RAY_AUTH_MODE=disabled
cd "$HOME"
printf {q(requirements)}'\\n' > requirements.txt
python3 -m venv guide-venv
guide-venv/bin/pip install --quiet --no-index --find-links {q(str(wheelhouse))} -r requirements.txt
if [[ $(hostname) == {q(head_name)} ]]; then
  guide-venv/bin/ray start --head --port={GCS_PORT} --dashboard-host={q(head_ip)} {common}
else
  guide-venv/bin/ray start --address={q(f"{head_ip}:{GCS_PORT}")} {common}
fi
"""


def run_rayslice(spec: spec_module.ClusterSpec, wheelhouse: Path, workdir: Path) -> tuple[float, float]:
    sim = Simulation.create(spec, workdir / "rayslice", package_source=f"wheels:{wheelhouse}")
    try:
        start = time.monotonic()
        sim.boot_all()
        wait_for_nodes(sim, spec.tpu.hosts, timeout=900)
        first = time.monotonic() - start
        before = frozenset(n["id"] for n in sim.ray_nodes())
        start = time.monotonic()
        for host in sim.plan.hosts:
            sim.reboot(host.name)
        wait_for_nodes(sim, spec.tpu.hosts, timeout=900, exclude=before)
        return first, time.monotonic() - start
    finally:
        sim.destroy()


def run_guide(spec: spec_module.ClusterSpec, wheelhouse: Path, workdir: Path) -> float:
    probe = Simulation.create(spec, workdir / "guide", script="#!/bin/bash\n")
    head = probe.plan.head
    script = guide_script(head.ip, head.name, wheelhouse, requirement_lines(spec), spec.tpu.chips_per_host)
    for host in probe.plan.hosts:
        probe.paths(host.name).script.write_text(script)
    try:
        start = time.monotonic()
        for host in probe.plan.hosts:  # one host after the other, as a person does it
            probe.boot(host.name)
            while probe.script_exit(host.name) is None:
                time.sleep(0.5)
            if probe.script_exit(host.name) != 0:
                raise RuntimeError(f"guide steps failed on {host.name}; see {probe.paths(host.name).console}")
        wait_for_nodes(probe, spec.tpu.hosts, timeout=300)
        return time.monotonic() - start
    finally:
        probe.destroy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator-type", default="v6e-16")
    parser.add_argument("--wheelhouse", type=Path, default=REPO / ".wheelhouse")
    args = parser.parse_args(argv)
    spec = spec_module.load({"acceleratorType": args.accelerator_type, "rayAuth": "none"}, require_zone=False)
    wheelhouse = ensure_wheelhouse(args.wheelhouse, spec)
    with tempfile.TemporaryDirectory(prefix="rayslice-bench-") as tmp:
        workdir = Path(tmp)
        guide = run_guide(spec, wheelhouse, workdir)
        first, reboot = run_rayslice(spec, wheelhouse, workdir)
    hosts = spec.tpu.hosts
    print(f"simulated {spec.accelerator_type}: {hosts} hosts, same wheelhouse, this machine")
    print(f"guide, host after host (pip, ray start):   {guide:7.1f} s")
    print(
        f"rayslice boot script, all hosts at once:   {first:7.1f} s   guide / rayslice = {guide / first:.2f}x"
    )
    print(
        f"rayslice reboot (requirements installed):  {reboot:7.1f} s   first boot / reboot = {first / reboot:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
