"""`rayslice local up|status|down|reboot|restart-head`: flag wiring and display for the simulator.

The simulation lives in a state directory (``--state-dir``, default ``$RAYSLICE_STATE_DIR`` or
``./.state/local``), one simulation per directory. `up` writes the state file before creating
anything, so `down` also cleans up after a crashed or interrupted `up`.

Only the commands that create, change or remove namespaces and processes need root; `status`
reads the state file and asks the head's dashboard, so any user who can read the state dir may
run it. `default_cluster` is how `rayslice run` and `rayslice status` find the simulated cluster:
they reach this module through the ``local`` entry point of ``rayslice.clusters``
(`rayslice.clusters`), so neither imports the simulator.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from rayslice.cli import Group, load_spec, spec_options
from rayslice.clusters import FoundCluster
from rayslice.errors import EXIT_JOB_FAILED, EXIT_OK, SimulatorError
from rayslice.local.google.cloud_api.emulator import MAX_NOTICE_S
from rayslice.local.simulation import recording
from rayslice.local.simulation.cloud_bridge import (
    cloud_access,
    cloud_config,
    request_capacity,
    request_preempt,
)
from rayslice.local.simulation.simulator import Simulation, require_root
from rayslice.local.simulation.state import DEFAULT_STATE_DIR, STATE_DIR_ENV, STATE_FILE, default_state_dir
from rayslice.local.simulation.status import format_report, status_report
from rayslice.names import PREEMPTION_NOTICE_S, STATE_FAILED_PREFIX, STATE_JOINED
from rayslice.printable import escaped

F = TypeVar("F", bound=Callable[..., Any])
WATCH_S = 2.0  # `local status --watch` refreshes this often unless told
T = TypeVar("T")


def default_cluster() -> FoundCluster | None:
    """The simulation in the default state dir, if any: its dashboard and token, its spec (with
    the project and zone its cloud API emulation serves) and how that emulation is reached."""
    state_dir = default_state_dir()
    if not (state_dir / STATE_FILE).is_file():
        return None
    try:
        sim = Simulation.open(state_dir)
    except (SimulatorError, OSError, ValueError, KeyError, TypeError):
        return None
    token = sim.token_file
    try:
        access, problem = cloud_access(sim.state_dir), ""
    except SimulatorError as exc:
        access, problem = None, str(exc)
    return FoundCluster(
        where=f"the simulation in {sim.state_dir}",
        dashboard_url=sim.dashboard_url(),
        token_file=token if token.is_file() else None,
        config=cloud_config(sim.spec()),
        cloud=access,
        cloud_problem=problem,
        record=recording.location(sim),
    )


def default_record_root() -> str | None:
    """The simulator's record folder in the default state dir (`rayslice history`), which
    `rayslice local down` keeps; None before any simulation wrote one."""
    root = recording.record_root(default_state_dir())
    return str(root) if root.is_dir() else None


def state_dir_option(func: F) -> F:
    return click.option(
        "--state-dir",
        metavar="DIR",
        type=click.Path(file_okay=False, path_type=Path),
        help=f"Where the simulation's state lives (default: ${STATE_DIR_ENV} or {DEFAULT_STATE_DIR}).",
    )(func)


def _open(state_dir: Path | None) -> Simulation:
    return Simulation.open(state_dir or default_state_dir())


def _as_root(action: Callable[[], T]) -> T:
    """Run a simulator action that needs root; without root, say so before touching anything."""
    require_root()
    return action()


@click.group("local", cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
def local_group() -> None:
    """A simulated TPU slice on this machine (network namespaces; needs root except `status`)."""


@local_group.command("up")
@spec_options
@state_dir_option
@click.option(
    "--wheelhouse",
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Install from this local wheelhouse (default: reuse the venv rayslice runs from).",
)
@click.option(
    "--timeout",
    type=float,
    default=600,
    show_default=True,
    metavar="S",
    help="Give up waiting after S seconds.",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Allow rayAuth=none: any local user could then submit jobs that run as root.",
)
@click.option(
    "--zone-capacity",
    type=click.IntRange(0),
    metavar="HOSTS",
    help="The zone's free hosts of the slices' type before the program runs (default: room for all). "
    "A flex-start or reserved slice then waits for `rayslice local capacity`, an on-demand or Spot "
    "slice is made in part (the rest later); a TPU node beyond it fails.",
)
def up_command(
    stack_file: str | None,
    overrides: tuple[str, ...],
    state_dir: Path | None,
    wheelhouse: str | None,
    timeout: float,
    insecure: bool,
    zone_capacity: int | None,
) -> int:
    """Create the simulated hosts, boot them and wait until all joined Ray.

    The hosts are what the Pulumi program deployed to the emulated cloud; a flex-start slice
    whose request waits for capacity (--zone-capacity) has none yet: they boot and join when
    `rayslice local capacity` gives the zone room."""
    spec = load_spec(stack_file, overrides, require_zone=False)
    package_source = f"wheels:{Path(wheelhouse).resolve()}" if wheelhouse else None
    where = state_dir or default_state_dir()
    sim = _as_root(
        lambda: Simulation.create(
            spec, where, package_source=package_source, insecure=insecure, zone_capacity=zone_capacity
        )
    )
    for warning in sim.warnings:
        click.echo(f"rayslice: warning: {warning}", err=True)
    recording.start(sim)
    hosts = sim.plan.hosts
    click.echo(
        f"simulating {spec.slices} x {spec.accelerator_type} ({spec.tpu.hosts} host(s) x "
        f"{spec.tpu.chips_per_host} chips per slice), head={spec.head}: {len(hosts)} hosts on "
        f"{sim.plan.network}, state in {sim.state_dir}"
    )
    start = time.monotonic()
    width = max(len(h.name) for h in hosts)
    shown: dict[str, str] = {}

    def show(states: dict[str, str]) -> None:
        for name, state in states.items():
            if state != shown.get(name):
                click.echo(f"[{time.monotonic() - start:6.1f}s] {name:<{width}}  {state or 'booting'}")
                shown[name] = state

    try:
        _as_root(sim.boot_all)
        states = sim.wait_for(
            lambda s: all(v == STATE_JOINED or v.startswith(STATE_FAILED_PREFIX) for v in s.values()),
            timeout,
            on_change=show,
        )
    except SimulatorError as exc:
        click.echo(f"rayslice: {exc}", err=True)
        states = sim.states()
    except KeyboardInterrupt:
        click.echo(
            f"\ninterrupted; the simulation stays as it is: "
            f"`rayslice local down --state-dir {sim.state_dir}` removes it",
            err=True,
        )
        raise
    ok = all(v == STATE_JOINED for v in states.values())
    click.echo(f"{'all hosts joined' if ok else 'bring-up failed'} after {time.monotonic() - start:.1f}s\n")
    click.echo(format_report(status_report(sim)))
    if not ok:
        click.echo(
            f"\nboot logs: {sim.state_dir}/hosts/<host>/console.log; `rayslice local down` removes everything"
        )
    return EXIT_OK if ok else EXIT_JOB_FAILED


@local_group.command("status")
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--watch",
    "watch_s",
    type=click.FloatRange(min=0.5),
    is_flag=False,
    flag_value=WATCH_S,
    default=None,
    help=f"Show it again every N seconds (default {WATCH_S:g}) until Ctrl-C.",
)
def status_command(state_dir: Path | None, as_json: bool, watch_s: float | None) -> int:
    """Hosts, roles, boot states, each host's Ray node(s) and chips (duty cycle, HBM), and the
    cluster's resources (no root needed)."""
    where = state_dir or default_state_dir()
    try:
        while True:
            text = _status_text(where, as_json)
            if watch_s is None:
                click.echo(text)
                return EXIT_OK
            click.clear()
            click.echo(f"{time.strftime('%H:%M:%S')}, again every {watch_s:g} s (Ctrl-C stops)\n{text}")
            time.sleep(watch_s)
    except KeyboardInterrupt:
        return EXIT_OK


def _status_text(where: Path, as_json: bool) -> str:
    try:
        report = status_report(Simulation.open(where))
    except PermissionError as exc:
        raise SimulatorError(
            f"cannot read {exc.filename or where}: the simulation's state belongs to the user who ran "
            "`rayslice local up` (root); run status as that user, or make the state dir readable to you"
        ) from None
    return json.dumps(report, indent=2) if as_json else format_report(report)


@local_group.command("down")
@state_dir_option
def down_command(state_dir: Path | None) -> int:
    """Remove every namespace, veth, bridge, process and file of the simulation, except its record.

    First its hosts' boot logs, Ray's job logs and events and the controller's events are copied
    into the record folder, which stays: `rayslice history` reads it after."""
    sim = _as_root(lambda: _open(state_dir))
    try:
        kept = f"kept its record in {recording.collect(sim)}: `rayslice history` shows it"
    except Exception as exc:  # the record (its hosts wrote part of it) never stops a removal
        kept = escaped(f"rayslice: warning: its record could not be completed: {type(exc).__name__}: {exc}")
    _as_root(sim.destroy)
    click.echo(f"removed simulation {sim.plan.run_id}: {len(sim.plan.hosts)} hosts, bridge {sim.plan.bridge}")
    click.echo(kept)
    return EXIT_OK


@local_group.command("reboot")
@state_dir_option
@click.argument("host")
def reboot_command(state_dir: Path | None, host: str) -> int:
    """Power HOST off and boot it again (its startup script runs again).

    HOST is a host name as `rayslice local status` lists it.
    """
    sim = _as_root(lambda: _open(state_dir))
    try:
        sim.plan.host(host)
    except KeyError as exc:
        raise SimulatorError(str(exc.args[0])) from None
    _as_root(lambda: sim.reboot(host))
    click.echo(f"rebooted {host}; `rayslice local status` shows its progress")
    return EXIT_OK


@local_group.command("restart-head")
@state_dir_option
def restart_head_command(state_dir: Path | None) -> int:
    """`ray stop` on the head host; its supervisor starts Ray again.

    Prints one line per host; Ray's own output goes to the host's restart-head.log.
    """
    sim = _as_root(lambda: _open(state_dir))
    head = sim.plan.head
    result = sim.restart_head_ray()
    log = sim.paths(head.name).dir / "restart-head.log"
    with log.open("a") as out:
        out.write(
            f"==== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} ray stop --force (exit {result.returncode})\n"
        )
        out.write(result.stdout + result.stderr)
    if result.returncode != 0:
        click.echo(f"{head.name}: `ray stop` failed (exit {result.returncode}); see {log}")
        return EXIT_JOB_FAILED
    click.echo(f"{head.name}: Ray stopped; its supervisor starts it again (detail: {log})")
    for host in sim.plan.hosts:
        if host.name != head.name:
            click.echo(f"{host.name}: untouched; its Ray node rejoins the head once it is back")
    return EXIT_OK


@local_group.command("preempt")
@state_dir_option
@click.option(
    "--notice-s",
    type=click.FloatRange(0, MAX_NOTICE_S),
    default=PREEMPTION_NOTICE_S,
    show_default=True,
    metavar="S",
    help="Seconds between the preemption notice (instance/preempted TRUE) and the power-off; 0: none.",
)
@click.argument("slice_name", metavar="SLICE")
def preempt_command(state_dir: Path | None, notice_s: float, slice_name: str) -> int:
    """Give every host of SLICE a preemption notice, then power them off and have the cloud API
    emulation report the slice preempted, as Compute Engine preempts a Spot VM.

    Asks the simulation's cloud API emulation (`rayslice.local.simulation.cloud_bridge`), which `local up`
    starts with every simulation and `local down` stops. Returns once the hosts are off.
    """

    require_root()
    hosts = request_preempt(state_dir or default_state_dir(), slice_name, notice_s)
    click.echo(f"preempted {slice_name}: notice, then after {notice_s:g} s powered off {', '.join(hosts)}")
    return EXIT_OK


@local_group.command("capacity")
@state_dir_option
@click.option("--zone", metavar="Z", help="The zone (default: the simulation's).")
@click.option(
    "--type",
    "kind",
    metavar="T",
    help="The host type counted: a machine type on compute (default: the slices', e.g. "
    "ct6e-standard-4t), a TPU generation on tpu-vm (default: the slices', e.g. v6e).",
)
@click.argument("hosts", type=click.IntRange(0), metavar="HOSTS")
def capacity_command(state_dir: Path | None, zone: str | None, kind: str | None, hosts: int) -> int:
    """Give the emulated zone HOSTS free hosts of a type, as Google's capacity comes and goes.

    From then on a TPU node, a lone VM or a fixed GKE pool that needs more fails with
    ZONE_RESOURCE_POOL_EXHAUSTED; an on-demand or Spot MIG makes the hosts the zone has and the
    rest as they come; waiting requests (a bulk MIG's wait, a queued resource) that now fit are
    fulfilled whole, in the order they came: their hosts boot and join. `rayslice status` shows
    each slice's state.
    """
    require_root()
    answer = request_capacity(state_dir or default_state_dir(), hosts, zone, kind)
    waiting = ", ".join(answer["waiting"]) or "none"
    free = f"zone {answer['zone']}: {answer['free']} free {answer['type']} host(s)"
    click.echo(f"{free}; requests still waiting: {waiting}")
    return EXIT_OK
