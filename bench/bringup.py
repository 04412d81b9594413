"""Bring-up of a simulated slice: rayslice's boot script against the guide done literally and the floor.

Measured in one run, on the same kind of simulated hosts and from the same local wheelhouse:

* guide: what the guide asks a person to do, host after host: create a venv, ``pip install -r
  requirements.txt``, then ``ray start --head`` on the first host and ``ray start --address``
  on the others (the address pasted in).
* first boot: every host boots at once and runs the rendered boot script (uv install into a
  venv, role from metadata, wait for the head, Ray under a supervisor).
* reboot: every host of that slice reboots; the script finds its requirements installed (the
  fast path).
* floor: the same hosts, everything already installed, and each host's boot runs nothing but a
  supervisor loop around ``ray start`` with the head's address written in. No boot script can
  beat it, so it is the yardstick for the reboot.

Every clock starts when the hosts are powered on (a reboot's power-off comes before it: the
hosts are switched off together, untimed) and stops when the head's state API shows every host
as an alive Ray node with TPU chips. The reboot and the floor are repeated (``--repeats``) and
their medians reported. Each figure is printed as a multiple of the floor and as a share of the
guide.

Internet mode (``--internet``) measures what a real host sees instead: the hosts install from a
package index across a slow link (`rayslice.local.simulation.internet`: each host's link to the
index capped at ``--rate-mbit``, every answer delayed ``--latency-ms``; hosts reach each other at
full speed), with the head's package cache (``--cache``) or without it. For each of
``--accelerator-types`` (default 1, 4 and 8 hosts) it brings up ``--repeats`` fresh slices, each
timed for a cold first boot, one reboot and one floor run, and reports their medians, the
ratios to the floor, and the bytes each host and the whole cluster fetched from the index in
the cold first boot (the reboot and the floor fetch nothing). Hosts install the preset's lock
(hash-checked, nothing resolved); a run where one did not is refused. Each fresh slice is then
captured as a host image (`rayslice.local.simulation.images`, a baked image's stand-in), and a
second fresh slice of the same type boots from it: its first boot is timed against its own
floor, and its bytes from the index counted.

The cold first boot is also set against its physical floor (`physical_floor`): what no boot
script can avoid, whatever it does. The bytes that cross the busiest link (with the cache, the
head's; without it, each host's own, in parallel) at the link's rate, plus one host's install
CPU-seconds (uv and pip, sampled from /proc during the cold first boot: `InstallCpu`) over the
cores that host has, plus the ``ray start`` floor. A simulated host has all of this machine's
cores, but shares them with every other simulated host: the report says so beside the figure.

Run as root: ``.venv/bin/python bench/bringup.py`` (it takes several minutes), or
``.venv/bin/python bench/bringup.py --internet --cache`` (tens of minutes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cpu_by_process import TICKS_PER_S, kind  # bench/cpu_by_process.py, beside this script
from wheelhouse import ensure_wheelhouse  # bench/wheelhouse.py: a script's own folder is on sys.path

from rayslice import spec as spec_module
from rayslice.local.simulation.internet import Link, SimulatedInternet, index_url
from rayslice.local.simulation.simulator import INDEX_SOURCE, Simulation
from rayslice.local.simulation.state import HostPlan
from rayslice.names import DASHBOARD_PORT, GCS_PORT
from rayslice.startup_scripts.variables import preset_lock, requirement_lines

REPO = Path(__file__).resolve().parents[1]
OBJECT_STORE = 100 * 1024 * 1024
NODE_TIMEOUT_S = 900
SUPERVISOR_DELAY_S = 1
# How often the clocks ask the head's state API. A floor is 3 s or so, so a coarser poll would
# blur the ratios to it by a sixth or more.
POLL_S = 0.1


@dataclass(frozen=True)
class Figures:
    """Seconds until every host is an alive Ray node, for each way of bringing a slice up."""

    guide: float
    first_boot: float
    reboot: float
    floor: float


@dataclass(frozen=True)
class Row:
    label: str
    seconds: float
    of_floor: float  # seconds / floor: how many floors this path takes
    of_guide: float  # seconds / guide: the share of the guide's time


def rows(figures: Figures) -> list[Row]:
    """Each figure with its ratio to the floor and to the guide, floor first, guide last."""
    for field, value in vars(figures).items():
        if not value > 0:
            raise ValueError(f"{field} must be a positive number of seconds, not {value!r}")
    labels = [
        ("floor: installed, only supervisor + ray start", figures.floor),
        ("rayslice reboot (requirements installed)", figures.reboot),
        ("rayslice first boot, all hosts at once", figures.first_boot),
        ("guide done literally, host after host", figures.guide),
    ]
    return [Row(label, s, s / figures.floor, s / figures.guide) for label, s in labels]


def report(figures: Figures, accelerator_type: str, hosts: int, repeats: int, date: str) -> str:
    """The table the benchmark prints (and docs/benchmarks.md records)."""
    lines = [
        f"{date}: simulated {accelerator_type}, {hosts} hosts, one wheelhouse, one run on this machine "
        f"(reboot and floor: median of {repeats})",
        "",
        "| path | seconds | x floor | x guide |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {r.label} | {r.seconds:.1f} | {r.of_floor:.2f} | {r.of_guide:.3f} |" for r in rows(figures)]
    return "\n".join(lines)


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


def floor_script(host: HostPlan, head_ip: str, ray: str, temp_dir: str, chips: int) -> str:
    """One host's boot in the floor run: a supervisor loop around `ray start`, nothing else.

    No metadata, no install check, no wait for the head: the worker's `ray start` retries the
    head's GCS port itself. `ray` is the Ray the boot script installed on this host.
    """
    q = shlex.quote
    args = [
        "start",
        "--block",
        "--disable-usage-stats",
        f"--node-ip-address={host.ip}",
        f"--object-store-memory={OBJECT_STORE}",
        f"--temp-dir={temp_dir}",
        f"--resources={json.dumps({'TPU': chips})}",
    ]
    if host.ip == head_ip:
        args += [
            "--head",
            f"--port={GCS_PORT}",
            f"--dashboard-host={host.ip}",
            f"--dashboard-port={DASHBOARD_PORT}",
        ]
    else:
        args += [f"--address={head_ip}:{GCS_PORT}"]
    argv = " ".join(q(a) for a in [ray, *args])
    return f"""#!/bin/bash
# bench/bringup.py floor run on {q(host.name)}: only a supervisor and ray start.
set -euo pipefail
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
# shellcheck disable=SC2016 # "$@" expands in the inner bash
setsid bash -c 'while :; do "$@" || true; sleep {SUPERVISOR_DELAY_S}; done' _ {argv} \\
  </dev/null >/dev/null 2>&1 &
"""


def installed_ray(host_root: Path) -> Path:
    """The `ray` executable the boot script installed below a host's root (one venv under opt/)."""
    found = sorted(p for p in host_root.glob("opt/**/bin/ray") if p.is_file())
    if len(found) != 1:
        raise RuntimeError(
            f"expected one venv with bin/ray under {host_root / 'opt'}, found {[str(p) for p in found]}: "
            "the floor reuses what the boot script installed"
        )
    return found[0]


def wait_for_nodes(
    sim: Simulation, count: int, timeout: float, exclude: frozenset[str] = frozenset()
) -> float:
    """Seconds until `count` alive TPU nodes (none of them in `exclude`) are registered."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            nodes = [n for n in sim.ray_nodes() if n["resources"].get("TPU") and n["id"] not in exclude]
        except (OSError, ValueError, KeyError):  # head down or starting: no answer, or not JSON yet
            nodes = []
        if len(nodes) == count:
            return time.monotonic() - start
        time.sleep(POLL_S)
    raise RuntimeError(f"{count} nodes did not come up within {timeout:.0f}s; states: {sim.states()}")


def _alive_ids(sim: Simulation) -> frozenset[str]:
    try:
        return frozenset(n["id"] for n in sim.ray_nodes())
    except (OSError, ValueError, KeyError):
        return frozenset()


def _timed(
    power_on: Callable[[], None], sim: Simulation, hosts: int, power_off: Callable[[], None] = lambda: None
) -> float:
    """Seconds from `power_on` until `hosts` new alive TPU nodes. `power_off`, run first, is
    outside the clock, so every path is timed from power-on: a first boot, a reboot and the floor
    alike, and a host's Ray shutting down (about 2 s) counts in none of them."""
    before = _alive_ids(sim)
    power_off()
    start = time.monotonic()
    power_on()
    wait_for_nodes(sim, hosts, timeout=NODE_TIMEOUT_S, exclude=before)
    return time.monotonic() - start


def reboots_and_floors(
    sim: Simulation, spec: spec_module.ClusterSpec, repeats: int
) -> tuple[list[float], list[float]]:
    """On a slice whose first boot is done: `repeats` reboots of every host, then `repeats` floor
    runs (each host's boot replaced by `floor_script`, around the Ray the boot script installed)."""
    hosts = sim.plan.hosts
    count = spec.tpu.hosts

    def power_off() -> None:
        sim.power_off_all([host.name for host in hosts])

    def power_on() -> None:
        for host in hosts:
            sim.boot(host.name)

    reboots = [_timed(power_on, sim, count, power_off) for _ in range(repeats)]
    head_ip = sim.plan.head.ip
    for host in hosts:
        paths = sim.paths(host.name)
        ray = installed_ray(paths.root)
        inner = f"{sim.plan.root}/{ray.relative_to(paths.root)}"  # the same file, seen from inside
        paths.script.write_text(
            floor_script(host, head_ip, inner, f"{sim.plan.root}/tmp/ray", spec.tpu.chips_per_host)
        )
    floors = [_timed(power_on, sim, count, power_off) for _ in range(repeats)]
    return reboots, floors


def run_rayslice(
    spec: spec_module.ClusterSpec, wheelhouse: Path, workdir: Path, repeats: int
) -> tuple[float, list[float], list[float]]:
    """First boot, then `repeats` reboots, then `repeats` floor runs, on one simulated slice."""
    sim = Simulation.create(spec, workdir / "rayslice", package_source=f"wheels:{wheelhouse}", insecure=True)
    try:
        first = _timed(sim.boot_all, sim, spec.tpu.hosts)
        reboots, floors = reboots_and_floors(sim, spec, repeats)
        return first, reboots, floors
    finally:
        sim.destroy()


@dataclass(frozen=True)
class InternetRun:
    """One fresh slice in internet mode: seconds of each path, and the bytes each machine
    fetched from the index during the cold first boot (by host name)."""

    first_boot: float
    reboot: float
    floor: float
    fetched: dict[str, int]
    # CPU-seconds each host's installers (uv, pip) used in the cold first boot, by host name.
    install_cpu: dict[str, float]
    # A second fresh slice of the same type whose hosts boot an image of the first one's install
    # (`hostImage`): its first boot, its own floor, and what it fetched from the index.
    image_boot: float
    image_floor: float
    image_fetched: dict[str, int]


@dataclass(frozen=True)
class PhysicalFloor:
    """What a cold first boot cannot go below, whatever the boot script does: its bytes over the
    busiest link at the link's rate, one host's install CPU over its cores, and ``ray start``."""

    link_s: float
    install_s: float
    ray_floor_s: float

    @property
    def seconds(self) -> float:
        return self.link_s + self.install_s + self.ray_floor_s


def physical_floor(
    fetched: dict[str, int], rate_mbit: float, install_cpu: dict[str, float], cores: int, ray_floor_s: float
) -> PhysicalFloor:
    """The cold first boot's physical floor from what it fetched (bytes by host: each host has a
    link of its own, so the busiest link's bytes set the pace), the link's rate, the install
    CPU-seconds by host (the most any one host spent), the cores one host has, and the ``ray
    start`` floor measured on the same slice."""
    if not rate_mbit > 0 or cores < 1 or not fetched or not install_cpu:
        raise ValueError("a floor needs a positive rate, a core, and the bytes and CPU of some host")
    return PhysicalFloor(
        link_s=max(fetched.values()) * 8 / (rate_mbit * 1e6),
        install_s=max(install_cpu.values()) / cores,
        ray_floor_s=ray_floor_s,
    )


@dataclass
class InstallCpu:
    """CPU-seconds of each simulated host's installers (processes `cpu_by_process.kind` names
    ``installer: ...``), sampled from /proc every `interval` seconds while `sampling`. A process
    belongs to the host whose network namespace it runs in. A sample misses at most the last
    `interval` of each installer's life."""

    namespaces: dict[int, str]  # network namespace inode -> host name
    interval: float = 0.2
    proc: Path = Path("/proc")

    def __post_init__(self) -> None:
        self._ticks: dict[tuple[str, str], tuple[str, int]] = {}  # (pid, start) -> (host, ticks)

    def sample(self) -> None:
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                namespace = os.stat(entry / "ns" / "net").st_ino
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue  # gone since the listing
            host = self.namespaces.get(namespace)
            comm = stat[stat.find("(") + 1 : stat.rfind(")")]
            if host is None or not kind(comm, cmdline).startswith("installer:"):
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            self._ticks[(entry.name, fields[19])] = (host, int(fields[11]) + int(fields[12]))

    def by_host(self) -> dict[str, float]:
        seconds = dict.fromkeys(self.namespaces.values(), 0.0)
        for host, ticks in self._ticks.values():
            seconds[host] += ticks / TICKS_PER_S
        return seconds

    @contextmanager
    def sampling(self) -> Iterator[None]:
        done = threading.Event()

        def loop() -> None:
            while not done.wait(self.interval):
                self.sample()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self.sample()


def install_cpu_of(sim: Simulation) -> InstallCpu:
    """A sampler for the installers of `sim`'s Ray hosts."""
    return InstallCpu({os.stat(f"/run/netns/{h.netns}").st_ino: h.name for h in sim.plan.hosts})


def internet_spec(
    accelerator_type: str, cache: bool, host_image: str | None = None
) -> spec_module.ClusterSpec:
    """A slice whose hosts install from the simulated internet's index, with or without the cache
    (and booting `host_image`, if given)."""
    config = {
        "acceleratorType": accelerator_type,
        "rayAuth": "none",
        "packageIndex": index_url(),
        "allowInsecurePackageIndex": "true",
        "packageCache": str(cache).lower(),
        **({"hostImage": host_image} if host_image else {}),
    }
    return spec_module.load(config, require_zone=False)


def check_locked(sim: Simulation, spec: spec_module.ClusterSpec) -> None:
    """Refuse a run whose hosts did not install the preset's lock: the figures are for locked
    installs (hash-checked, nothing resolved), and a host that resolved would say otherwise."""
    lock = preset_lock(spec)
    if lock is None:
        raise RuntimeError(
            f"no preset lock for {spec.preset} with Ray {spec.ray_version}: nothing to measure"
        )
    unlocked = [
        h.name
        for h in sim.plan.hosts
        if f"installing the lock {lock.digest}" not in sim.paths(h.name).boot_log.read_text()
    ]
    if unlocked:
        raise RuntimeError(f"hosts {unlocked} did not install the lock {lock.digest}; see their boot logs")


def _fresh_slice(
    spec: spec_module.ClusterSpec,
    wheelhouse: Path,
    workdir: Path,
    link: Link,
    host_image: Path | None = None,
    before_reboots: Callable[[Simulation], None] = lambda sim: None,
) -> tuple[float, dict[str, int], dict[str, float], float, float]:
    """A fresh slice in `workdir` behind its own simulated internet: its first boot, the bytes
    each machine fetched and each host's install CPU-seconds in it, then (after
    `before_reboots`) one reboot and one floor run."""
    (workdir / "internet").mkdir(parents=True)
    sim = Simulation.create(
        spec, workdir / "sim", package_source=INDEX_SOURCE, insecure=True, host_image=host_image
    )
    try:
        with SimulatedInternet(sim, wheelhouse, link, workdir / "internet") as internet:
            installers = install_cpu_of(sim)
            with installers.sampling():
                first = _timed(sim.boot_all, sim, spec.tpu.hosts)
            fetched = internet.fetched()
            before_reboots(sim)
            (reboot,), (floor,) = reboots_and_floors(sim, spec, 1)
            return first, fetched, installers.by_host(), reboot, floor
    finally:
        sim.destroy()


def run_internet(spec: spec_module.ClusterSpec, wheelhouse: Path, workdir: Path, link: Link) -> InternetRun:
    """Cold first boot (bytes counted), one reboot and one floor run of a fresh slice; then a
    second fresh slice booting an image of the first one's install, and its own floor."""
    image = workdir / "image"
    fingerprints: list[str] = []

    def capture(sim: Simulation) -> None:
        check_locked(sim, spec)
        fingerprints.append(sim.capture_image(sim.plan.hosts[0].name, image))

    first, fetched, install_cpu, reboot, floor = _fresh_slice(
        spec, wheelhouse, workdir / "cold", link, None, capture
    )
    image_spec = internet_spec(spec.accelerator_type, spec.package_cache, f"rayslice-host-{fingerprints[0]}")
    image_boot, image_fetched, _, _, image_floor = _fresh_slice(
        image_spec, wheelhouse, workdir / "imaged", link, image
    )
    return InternetRun(first, reboot, floor, fetched, install_cpu, image_boot, image_floor, image_fetched)


def internet_report(
    runs: dict[str, list[InternetRun]], link: Link, cache: bool, hosts: dict[str, int], date: str
) -> str:
    """The internet mode's table: medians over each type's runs; bytes of the cold first boot.

    ``x first of fewest`` is the first boot against the one of the fewest hosts measured (the
    growth with slice size); ``x fewest's bytes`` is the cluster's bytes against that slice's.
    The image columns are the second slice of each run (booting an image of the first one's
    install), its first boot against its own floor.
    """
    mb = 1e6
    first_type = min(runs, key=lambda t: hosts[t])
    base_first = statistics.median(r.first_boot for r in runs[first_type])
    base_bytes = statistics.median(sum(r.fetched.values()) for r in runs[first_type])
    repeats = min(len(r) for r in runs.values())
    lines = [
        f"{date}: simulated slices in internet mode, {'with' if cache else 'without'} the package cache; "
        f"each host's link to the index {link.rate_mbit:g} Mbit/s, {link.latency_ms:g} ms per answer; "
        f"medians of {repeats} fresh slices",
        "",
        "| type | hosts | first boot s | x floor | x first of fewest | reboot s | x floor | floor s "
        "| MB fetched per host (min-max) | MB per cluster | x fewest's bytes "
        "| image boot s | x its floor | its floor s | image MB per cluster |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for accelerator_type, found in sorted(runs.items(), key=lambda item: hosts[item[0]]):
        first = statistics.median(r.first_boot for r in found)
        reboot = statistics.median(r.reboot for r in found)
        floor = statistics.median(r.floor for r in found)
        per_host = [b for r in found for b in r.fetched.values()]
        cluster = statistics.median(sum(r.fetched.values()) for r in found)
        image_boot = statistics.median(r.image_boot for r in found)
        image_floor = statistics.median(r.image_floor for r in found)
        image_cluster = statistics.median(sum(r.image_fetched.values()) for r in found)
        lines.append(
            f"| {accelerator_type} | {hosts[accelerator_type]} | {first:.1f} | {first / floor:.2f} "
            f"| {first / base_first:.2f} | {reboot:.1f} | {reboot / floor:.2f} | {floor:.1f} "
            f"| {min(per_host) / mb:.0f}-{max(per_host) / mb:.0f} | {cluster / mb:.0f} "
            f"| {cluster / base_bytes:.2f} | {image_boot:.1f} | {image_boot / image_floor:.2f} "
            f"| {image_floor:.1f} | {image_cluster / mb:.0f} |"
        )
    return "\n".join(lines)


def floor_report(runs: dict[str, list[InternetRun]], link: Link, cores: int, hosts: dict[str, int]) -> str:
    """The cold first boot against its physical floor (`physical_floor`), medians over each type's
    runs. The last column is what the floor's install term would be if every simulated host's
    install had to share this machine's cores, as it does here (a real host has its own)."""
    lines = [
        f"Cold first boot against its physical floor (goal: 1.3x at most); {cores} cores per host, "
        "shared here by every simulated host",
        "",
        "| type | hosts | first boot s | MB over the busiest link | link s | install CPU-s (busiest host) "
        "| install s | ray start floor s | physical floor s | x physical floor "
        "| all installs on the shared cores s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for accelerator_type, found in sorted(runs.items(), key=lambda item: hosts[item[0]]):
        floors = [physical_floor(r.fetched, link.rate_mbit, r.install_cpu, cores, r.floor) for r in found]
        first = statistics.median(r.first_boot for r in found)
        floor = statistics.median(f.seconds for f in floors)
        shared = statistics.median(sum(r.install_cpu.values()) / cores for r in found)
        lines.append(
            f"| {accelerator_type} | {hosts[accelerator_type]} | {first:.1f} "
            f"| {statistics.median(max(r.fetched.values()) for r in found) / 1e6:.0f} "
            f"| {statistics.median(f.link_s for f in floors):.1f} "
            f"| {statistics.median(max(r.install_cpu.values()) for r in found):.1f} "
            f"| {statistics.median(f.install_s for f in floors):.1f} "
            f"| {statistics.median(f.ray_floor_s for f in floors):.1f} | {floor:.1f} | {first / floor:.2f} "
            f"| {shared:.1f} |"
        )
    return "\n".join(lines)


def main_internet(args: argparse.Namespace) -> int:
    link = Link(args.rate_mbit, args.latency_ms)
    specs = {t: internet_spec(t, args.cache) for t in args.accelerator_types.split(",")}
    wheelhouse = args.wheelhouse
    for spec in specs.values():
        wheelhouse = ensure_wheelhouse(args.wheelhouse, spec)
    runs: dict[str, list[InternetRun]] = {}
    with tempfile.TemporaryDirectory(prefix="rayslice-bench-") as tmp:
        for accelerator_type, spec in specs.items():
            for i in range(args.repeats):
                run = run_internet(spec, wheelhouse, Path(tmp) / f"{accelerator_type}-{i}", link)
                runs.setdefault(accelerator_type, []).append(run)
                print(
                    f"{accelerator_type} #{i + 1}: first boot {run.first_boot:.1f} s, "
                    f"reboot {run.reboot:.1f} s, floor {run.floor:.1f} s; fetched {json.dumps(run.fetched)}; "
                    f"from the image: first boot {run.image_boot:.1f} s, floor {run.image_floor:.1f} s, "
                    f"fetched {json.dumps(run.image_fetched)}; install CPU-s "
                    f"{json.dumps({h: round(c, 1) for h, c in run.install_cpu.items()})}",
                    flush=True,
                )
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    hosts = {t: spec.tpu.hosts for t, spec in specs.items()}
    print("\n" + internet_report(runs, link, args.cache, hosts, date))
    print("\n" + floor_report(runs, link, os.cpu_count() or 1, hosts))
    return 0


def run_guide(spec: spec_module.ClusterSpec, wheelhouse: Path, workdir: Path) -> float:
    probe = Simulation.create(spec, workdir / "guide", script="#!/bin/bash\n", insecure=True)
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--accelerator-type", default="v6e-16")
    parser.add_argument("--wheelhouse", type=Path, default=REPO / ".wheelhouse")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="reboots and floor runs (internet mode: slices) to take the median of",
    )
    internet = parser.add_argument_group("internet mode")
    internet.add_argument(
        "--internet", action="store_true", help="hosts install from an index across a slow link"
    )
    internet.add_argument("--cache", action="store_true", help="with the head's package cache (packageCache)")
    internet.add_argument("--rate-mbit", type=float, default=200.0, help="each host's link to the index")
    internet.add_argument(
        "--latency-ms", type=float, default=20.0, help="the index's delay before each answer"
    )
    internet.add_argument(
        "--accelerator-types", default="v6e-8,v6e-16,v6e-32", help="comma-separated (1, 4 and 8 hosts)"
    )
    args = parser.parse_args(argv)
    # Stopped with SIGTERM (`kill`, or a shell that started it in the background, where SIGINT is
    # ignored), it still removes the slice it was timing: the `finally` blocks run on SystemExit.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.internet:
        return main_internet(args)
    spec = spec_module.load({"acceleratorType": args.accelerator_type, "rayAuth": "none"}, require_zone=False)
    wheelhouse = ensure_wheelhouse(args.wheelhouse, spec)
    with tempfile.TemporaryDirectory(prefix="rayslice-bench-") as tmp:
        workdir = Path(tmp)
        guide = run_guide(spec, wheelhouse, workdir)
        first, reboots, floors = run_rayslice(spec, wheelhouse, workdir, args.repeats)
    figures = Figures(
        guide=guide, first_boot=first, reboot=statistics.median(reboots), floor=statistics.median(floors)
    )
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(report(figures, spec.accelerator_type, spec.tpu.hosts, args.repeats, date))
    each = {"reboots": reboots, "floors": floors}
    print("\n" + "; ".join(f"{k}: {', '.join(f'{s:.1f}' for s in v)} s" for k, v in each.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
