"""A simulated internet for one simulation: a package index behind a slow link from every host.

A real slice installs from a package index across the internet (through Cloud NAT), each host
over a link of its own, while its hosts talk to each other at VPC speed. `SimulatedInternet`
gives a simulation the same shape:

* the index (`package_index`, serving a wheelhouse) runs in a network namespace of its own,
  ``rsl-<run id>-internet``, on the simulation's bridge at the subnet's last address, and every
  host's ``/etc/hosts`` names it `INDEX_HOST` (a ``.test`` name, reserved by RFC 2606, so it can
  never be a real one);
* each host's bridge port (the root-namespace end of its veth, whose egress is what the host
  receives) gets an HTB qdisc: one class capped at the link's rate for packets from the index,
  and an uncapped default class for everything else, so host-to-host traffic (Ray, the package
  cache on the head) keeps full speed. Latency is added by the index itself (`package_index`
  ``--latency-ms``), since this machine's kernel has no netem.

A spec that installs from it sets ``packageIndex`` to `index_url` (with
``allowInsecurePackageIndex``). The namespace, its veth and the server are this object's: `stop`
(or leaving the ``with`` block) removes them; the qdiscs go with the hosts' veths when the
simulation is destroyed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from rayslice.errors import SimulatorError
from rayslice.local.host import netns
from rayslice.local.simulation.simulator import Simulation

INDEX_HOST = "pypi.internet.test"
INDEX_PORT = 8080
START_S = 60  # scanning (hashing) a wheelhouse of ~0.5 GB takes a few seconds


def index_url() -> str:
    """The packageIndex of a spec whose hosts install from the simulated internet."""
    return f"http://{INDEX_HOST}:{INDEX_PORT}/simple/"


@dataclass(frozen=True)
class Link:
    """Each host's link to the index: bandwidth and the delay before every answer."""

    rate_mbit: float
    latency_ms: float

    def __post_init__(self) -> None:
        if not self.rate_mbit > 0 or not self.latency_ms >= 0:
            raise SimulatorError(
                f"a link needs a positive rate and a non-negative latency, not {self.rate_mbit} Mbit/s, "
                f"{self.latency_ms} ms"
            )


class SimulatedInternet:
    """The index, its namespace and the hosts' shaped links, for one simulation (see the module)."""

    def __init__(self, sim: Simulation, wheelhouse: Path, link: Link, workdir: Path):
        self.sim = sim
        self.wheelhouse = wheelhouse
        self.link = link
        self.counts = workdir / "index-bytes.json"
        self.log = workdir / "index.log"
        run_id = sim.plan.run_id
        self.netns = f"rsl-{run_id}-internet"
        self.veth, self.peer = f"rsl{run_id}i0", f"rsl{run_id}i1"
        network = sim.plan.ip_network
        self.address = str(network.broadcast_address - 1)
        taken = {sim.plan.gateway, *(h.ip for h in sim.plan.machines)}
        if self.address in taken:
            raise SimulatorError(f"the subnet {network} has no free last address for the index")
        self._server: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SimulatedInternet:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """The index's namespace and server, its name in every host's /etc/hosts, the shaping."""
        plan = self.sim.plan
        prefix = plan.ip_network.prefixlen
        netns.create_host_network(self.netns, self.veth, self.peer, plan.bridge, self.address, prefix)
        for host in plan.machines:
            with (netns.NETNS_ETC / host.netns / "hosts").open("a") as hosts:
                hosts.write(f"{self.address}\t{INDEX_HOST}\n")
        for host in plan.machines:
            self._shape(host.veth)
        with self.log.open("ab") as log:
            self._server = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.netns,
                    sys.executable,
                    "-m",
                    "rayslice.local.simulation.package_index",
                    "--wheelhouse",
                    str(self.wheelhouse),
                    "--bind",
                    self.address,
                    "--port",
                    str(INDEX_PORT),
                    "--latency-ms",
                    str(self.link.latency_ms),
                    "--counts",
                    str(self.counts),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + START_S
        while not self._listening():
            if self._server.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SimulatorError(f"the simulated package index did not start; see {self.log}")
            time.sleep(0.2)

    def _listening(self) -> bool:
        """Whether the index accepts connections (asked from inside its namespace)."""
        probe = f"import socket; socket.create_connection(({self.address!r}, {INDEX_PORT}), timeout=1)"
        return (
            subprocess.run(
                ["ip", "netns", "exec", self.netns, sys.executable, "-c", probe], capture_output=True
            ).returncode
            == 0
        )

    def _shape(self, device: str) -> None:
        """HTB on a host's bridge port: packets from the index in class 1:10 at the link's rate,
        everything else in the default class 1:20 at a rate no veth reaches."""
        rate = f"{self.link.rate_mbit}mbit"
        qdisc = ["dev", device, "parent", "1:"]
        for command in (
            ["qdisc", "add", "dev", device, "root", "handle", "1:", "htb", "default", "20"],
            ["class", "add", *qdisc, "classid", "1:10", "htb", "rate", rate, "ceil", rate],
            ["class", "add", *qdisc, "classid", "1:20", "htb", "rate", "100gbit"],
            ["filter", "add", *qdisc, "protocol", "ip", "prio", "1", "u32",
             "match", "ip", "src", f"{self.address}/32", "flowid", "1:10"],
        ):  # fmt: skip
            proc = subprocess.run(["tc", *command], capture_output=True, text=True)
            if proc.returncode != 0:
                raise SimulatorError(f"tc {' '.join(command)}: {proc.stderr.strip()}")

    def fetched(self) -> dict[str, int]:
        """Bytes each machine has fetched from the index so far, by host name (0 for none)."""
        by_ip = json.loads(self.counts.read_text()) if self.counts.exists() else {}
        return {h.name: int(by_ip.get(h.ip, 0)) for h in self.sim.plan.machines}

    def set_reachable(self, reachable: bool) -> None:
        """Cut the index off the bridge (the internet is down) or bring it back."""
        netns.ip("link", "set", self.veth, "up" if reachable else "down")

    def stop(self) -> None:
        """Stop the server and remove the namespace (its veth pair goes with it)."""
        if self._server is not None and self._server.poll() is None:
            self._server.terminate()
            try:
                self._server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
        self._server = None
        for pid in netns.netns_pids(self.netns):  # anything left in the index's namespace
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        netns.delete_netns(self.netns)
        netns.delete_link(self.veth)
