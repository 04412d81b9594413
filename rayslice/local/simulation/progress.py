"""What simulated hosts report: their published boot states, their startup script's exit status
and the Ray nodes the head's dashboard lists. Nothing here changes a host."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from rayslice.errors import SimulatorError
from rayslice.local.host.processes import is_alive
from rayslice.local.simulation.recorded import RecordedSimulation, boot_process
from rayslice.names import DASHBOARD_PORT, GUEST_ATTRIBUTE_NAMESPACE, STATE_FAILED_PREFIX, STATE_KEY


class HostProgress(RecordedSimulation):
    """Reads each host's state (its guest attributes and exit file) and Ray's view of the cluster."""

    def guest_attributes(self, name: str) -> dict[str, str]:
        """The host's guest attributes in the rayslice namespace (from its metadata server's file)."""
        try:
            data = json.loads(self.paths(name).guest_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return data.get(GUEST_ATTRIBUTE_NAMESPACE, {})

    def script_exit(self, name: str) -> int | None:
        """The startup script's exit status at the last boot; None while it runs or before a boot."""
        try:
            text = self.paths(name).exit_file.read_text().strip()
        except FileNotFoundError:
            return None
        return int(text) if text else None

    def states(self) -> dict[str, str]:
        """Each host's published state (``installing``, ``waiting: head``, ``joined``, ``failed: …``).

        A script that exited non-zero without publishing a failure reads as ``failed: startup-script
        exited N``, and a host whose PID 1 died before its script ended as ``failed: host stopped``
        (`report` shows the console, where its traceback went), so nobody waits for a host that
        has given up.
        """
        states = {}
        for host in self.plan.hosts:
            state = self.guest_attributes(host.name).get(STATE_KEY, "")
            code = self.script_exit(host.name)
            if code not in (None, 0) and not state.startswith(STATE_FAILED_PREFIX):
                state = f"{STATE_FAILED_PREFIX}startup-script exited {code}"
            elif code is None and self._stopped(host.name):
                state = f"{STATE_FAILED_PREFIX}host stopped before its startup-script ended (see its console)"
            states[host.name] = state
        return states

    def _stopped(self, name: str) -> bool:
        """Whether the host was powered on and its PID 1 is gone without a power-off."""
        ref = self.state.processes.get(boot_process(name))
        return ref is not None and not is_alive(ref)

    def report(self, lines: int = 12) -> str:
        """Each machine's state, script exit, and the ends of its boot log and console: what a
        failed wait prints, since a simulation (and a CI run's) is gone once it is removed."""
        parts = []
        for host in self.plan.machines:
            paths = self.paths(host.name)
            state = self.guest_attributes(host.name).get(STATE_KEY, "")
            parts.append(
                f"--- {host.name} ({host.ip}) state {state!r}, script exit {self.script_exit(host.name)}"
                + (", PID 1 gone" if self._stopped(host.name) else "")
            )
            for title, log in (
                ("boot log", paths.boot_log),
                ("console", paths.console),
            ):
                tail = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
                parts.append(f"  {title}:" if tail else f"  {title}: (none)")
                parts.extend(f"    {line}" for line in tail)
        return "\n".join(parts)

    def wait_for(
        self,
        condition: Callable[[dict[str, str]], bool],
        timeout: float,
        on_change: Callable[[dict[str, str]], None] | None = None,
    ) -> dict[str, str]:
        """Poll `states()` until `condition` holds; raise SimulatorError on timeout."""
        deadline = time.monotonic() + timeout
        last: dict[str, str] = {}
        while True:
            current = self.states()
            if current != last and on_change is not None:
                on_change(current)
            last = current
            if condition(current):
                return current
            if time.monotonic() > deadline:
                raise SimulatorError(
                    f"timed out after {timeout:.0f}s; host states: {current}\n{self.report()}"
                )
            time.sleep(0.5)

    def dashboard_url(self) -> str:
        return f"http://{self.plan.head.ip}:{DASHBOARD_PORT}"

    def ray_nodes(self, timeout: float = 30) -> list[dict[str, Any]]:
        """Alive Ray nodes from the head's state API (through the bridge): ip, head, resources, labels.

        The timeout is long on purpose: the dashboard goes on serving a request whose client gave
        up, so a poller with a short timeout piles requests onto a head that is slow already.
        """
        request = urllib.request.Request(f"{self.dashboard_url()}/api/v0/nodes?detail=1&limit=10000")
        if self.token_file.exists():
            request.add_header("Authorization", f"Bearer {self.token_file.read_text().strip()}")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
        with opener.open(request, timeout=timeout) as response:
            nodes = json.load(response)["data"]["result"]["result"]
        return [
            {
                "id": n["node_id"],
                "ip": n["node_ip"],
                "head": n["is_head_node"],
                "resources": n["resources_total"],
                "labels": n["labels"],
                "start_time_ms": n.get("start_time_ms"),  # tells a rebooted host's old node from its new one
            }
            for n in nodes
            if n["state"] == "ALIVE"
        ]
