"""An elastic cluster's slice on demand, next to a cold bring-up of the same slice, in one run.

The elastic cluster is `infra/Pulumi.example-compute-elastic-v6e-16.yaml` as v6e-4 (one host of
4 chips a slice, 0 to 2 slices): a CPU head VM and the controller VM, no TPU host. A job
submitted with ``rayslice run`` asks for one slice with Ray's own ``slice_placement_group`` and
runs a task on it. The head publishes Ray's demand, the controller reads it through the emulated
Compute API and adds the slice, whose host boots the real boot script and joins (docs/elastic.md).

Clocks, all on this machine's wall clock (the job prints its own):

* **slice on demand**: from the job asking for the slice until its task ran on it;
* **slice gone**: from the job's end until the slice's host is powered off, of which
  ``idleTimeoutSeconds`` is the wait the user chose and the rest is rayslice's (the head's
  publishing interval, the controller's pass, the deletion);
* **cold bring-up** (the baseline): the same slice as a fixed cluster (head VM, controller VM,
  one v6e-4 host), from create until every host is a Ray node.

The ratio slice-on-demand / cold bring-up says what asking for a slice costs next to having
deployed it. Run as root (about three minutes a repeat)::

    .venv/bin/python bench/elastic.py [--idle-s 30] [--repeats 1]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from recovery import BRING_UP_TIMEOUT_S, RAYSLICE, alive_nodes, bring_up, wait

from rayslice import cli
from rayslice import spec as spec_module
from rayslice.local.simulation.simulator import Simulation

EXAMPLE = str(Path(__file__).resolve().parents[1] / "infra" / "Pulumi.example-compute-elastic-v6e-16.yaml")
# The same slice as a fixed cluster: a head VM, the controller VM, one v6e-4 host.
FIXED = {"platform": "compute", "acceleratorType": "v6e-4", "head": "vm"}
RUN_TIMEOUT_S = 900
JOB = """
import socket, time

import ray
from ray.util.tpu import slice_placement_group

ray.init()
print(f"ASKED {time.time()}", flush=True)
group = slice_placement_group(topology="2x2", accelerator_version="v6e", head_reservation_timeout_s=600)
ray.get(group.placement_group.ready(), timeout=600)


@ray.remote(num_cpus=0, resources={"TPU": 4})
def host():
    return socket.gethostname()


print("HOST " + ray.get(host.options(placement_group=group.placement_group).remote()), flush=True)
print(f"RAN {time.time()}", flush=True)
group.shutdown()
print(f"ENDED {time.time()}", flush=True)
"""


def _stamp(name: str, text: str) -> float:
    found = re.search(rf"^{name} ([0-9.]+)$", text, re.M)
    if found is None:
        raise RuntimeError(f"the job printed no {name} line:\n{text[-2000:]}")
    return float(found[1])


def cold(state_dir: Path) -> float:
    sim, seconds = bring_up(spec_module.load(FIXED, require_zone=False), state_dir)
    sim.destroy()
    return seconds


def on_demand(state_dir: Path, idle_s: int, job: Path) -> tuple[float, float]:
    spec = cli.load_spec(
        EXAMPLE, ["acceleratorType=v6e-4", f"idleTimeoutSeconds={idle_s}"], require_zone=False
    )
    sim = Simulation.create(spec, state_dir)
    try:
        sim.boot_all()
        wait(lambda: len(alive_nodes(sim)) == 1, BRING_UP_TIMEOUT_S, "the head alone")
        argv = [RAYSLICE, "run", str(job), "--address", sim.dashboard_url()]
        if sim.token_file.exists():
            argv += ["--token-file", str(sim.token_file)]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if result.returncode != 0:
            raise RuntimeError(f"the job failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
        asked, ran, ended = (_stamp(n, result.stdout) for n in ("ASKED", "RAN", "ENDED"))
        host = f"{spec.slice_name(0)}-w0"
        wait(lambda: not Simulation.open(state_dir).running(host), idle_s + 300, "the idle slice's removal")
        return ran - asked, time.time() - ended
    finally:  # reopened: the state file also records the slice's host, which the emulation added
        Simulation.open(state_dir).destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-s", type=int, default=30, help="the elastic cluster's idleTimeoutSeconds")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    colds, demands, gones = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as tmp:
        job = Path(tmp) / "one_slice.py"
        job.write_text(JOB)
        for repeat in range(args.repeats):
            colds.append(cold(Path(tmp) / f"cold-{repeat}"))
            demand, gone = on_demand(Path(tmp) / f"elastic-{repeat}", args.idle_s, job)
            demands.append(demand)
            gones.append(gone)
            print(
                f"repeat {repeat}: cold {colds[-1]:.1f} s, on demand {demand:.1f} s, gone {gone:.1f} s",
                flush=True,
            )
    cold_s, demand_s, gone_s = (statistics.median(v) for v in (colds, demands, gones))
    print(f"cold bring-up (baseline)        {cold_s:7.1f} s")
    print(f"slice on demand (ask -> ran)    {demand_s:7.1f} s   {demand_s / cold_s:5.2f} x cold bring-up")
    print(f"slice gone (job end -> off)     {gone_s:7.1f} s   of which idleTimeoutSeconds {args.idle_s} s")
    print(f"  rayslice's part of it         {gone_s - args.idle_s:7.1f} s")


if __name__ == "__main__":
    main()
