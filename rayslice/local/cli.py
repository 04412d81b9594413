"""`rayslice local up|status|down|reboot|restart-head`: flag wiring and display for the simulator.

The simulation lives in a state directory (``--state-dir``, default ``$RAYSLICE_STATE_DIR`` or
``./.state/local``), one simulation per directory. `up` writes the state file before creating
anything, so `down` also cleans up after a crashed or interrupted `up`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rayslice import cli
from rayslice.local.netns import NetnsError
from rayslice.local.simulator import FAILED_PREFIX, JOINED, Simulation, SimulatorError, require_root
from rayslice.local.state import DEFAULT_STATE_DIR, default_state_dir
from rayslice.local.status import format_report, status_report


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir) if args.state_dir else default_state_dir()


def _cmd_up(args: argparse.Namespace) -> int:
    spec = cli.spec_from_args(args, require_zone=False)
    package_source = f"wheels:{Path(args.wheelhouse).resolve()}" if args.wheelhouse else None
    state_dir = _state_dir(args)
    sim = _run(lambda: Simulation.create(spec, state_dir, package_source=package_source))
    hosts = sim.plan.hosts
    print(
        f"simulating {spec.slices} x {spec.accelerator_type} ({spec.tpu.hosts} host(s) x "
        f"{spec.tpu.chips_per_host} chips per slice), head={spec.head}: {len(hosts)} hosts on "
        f"{sim.plan.network}, state in {sim.state_dir}"
    )
    start = time.monotonic()
    width = max(len(h.name) for h in hosts)

    def show(states: dict[str, str]) -> None:
        for name, state in states.items():
            if state != shown.get(name):
                print(f"[{time.monotonic() - start:6.1f}s] {name:<{width}}  {state or 'booting'}", flush=True)
                shown[name] = state

    shown: dict[str, str] = {}
    try:
        _run(sim.boot_all)
        states = sim.wait_for(
            lambda s: all(v == JOINED or v.startswith(FAILED_PREFIX) for v in s.values()),
            args.timeout,
            on_change=show,
        )
    except SimulatorError as exc:
        print(f"rayslice: {exc}", file=sys.stderr)
        states = sim.states()
    except KeyboardInterrupt:
        print(
            f"\ninterrupted; the simulation stays as it is: `rayslice local down --state-dir {sim.state_dir}` "
            "removes it",
            file=sys.stderr,
        )
        raise
    ok = all(v == JOINED for v in states.values())
    print(f"{'all hosts joined' if ok else 'bring-up failed'} after {time.monotonic() - start:.1f}s\n")
    print(format_report(status_report(sim)))
    if not ok:
        print(
            f"\nboot logs: {sim.state_dir}/hosts/<host>/console.log; `rayslice local down` removes everything"
        )
    return 0 if ok else 1


def _cmd_status(args: argparse.Namespace) -> int:
    sim = _run(lambda: Simulation.open(_state_dir(args)))
    report = status_report(sim)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    sim = _run(lambda: Simulation.open(_state_dir(args)))
    _run(sim.destroy)
    print(f"removed simulation {sim.plan.run_id}: {len(sim.plan.hosts)} hosts, bridge {sim.plan.bridge}")
    return 0


def _cmd_reboot(args: argparse.Namespace) -> int:
    sim = _run(lambda: Simulation.open(_state_dir(args)))
    _run(lambda: sim.reboot(args.host))
    print(f"rebooted {args.host}; `rayslice local status` shows its progress")
    return 0


def _cmd_restart_head(args: argparse.Namespace) -> int:
    sim = _run(lambda: Simulation.open(_state_dir(args)))
    result = _run(sim.restart_head_ray)
    print(result.stdout + result.stderr, end="")
    return result.returncode


def _run(action):
    """Run a simulator action as root, turning its expected failures into the CLI's UserError."""
    try:
        require_root()
        return action()
    except (SimulatorError, NetnsError) as exc:
        raise cli.UserError(str(exc)) from exc


def register(sub: argparse._SubParsersAction) -> None:
    local = sub.add_parser("local", help="a simulated TPU slice on this machine (network namespaces, root)")
    commands = local.add_subparsers(dest="local_command", required=True, metavar="COMMAND")

    def add(name: str, help: str, func) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help)
        parser.add_argument(
            "--state-dir",
            metavar="DIR",
            help=f"where the simulation's state lives (default: $RAYSLICE_STATE_DIR or {DEFAULT_STATE_DIR})",
        )
        parser.set_defaults(func=func)
        return parser

    p = add("up", "create the simulated hosts, boot them and wait until all joined Ray", _cmd_up)
    cli.add_spec_args(p)
    p.add_argument(
        "--wheelhouse",
        metavar="DIR",
        help="install from this local wheelhouse (default: reuse the venv rayslice runs from)",
    )
    p.add_argument("--timeout", type=float, default=600, metavar="S", help="give up waiting after S seconds")
    p = add("status", "hosts, roles, boot states, Ray nodes and resources", _cmd_status)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add("down", "remove every namespace, veth, bridge, process and file of the simulation", _cmd_down)
    p = add("reboot", "power a host off and boot it again (the startup script runs again)", _cmd_reboot)
    p.add_argument("host", help="host name, as `rayslice local status` lists it")
    add("restart-head", "`ray stop` on the head host; its supervisor starts Ray again", _cmd_restart_head)
