"""Linux network plumbing for simulated hosts: one bridge, and per host a namespace with a veth.

Every function acts on names it is given (never on a pattern), so it can only touch what the
simulation planned. Hosts get a subnet route and nothing else — no default route — so no
traffic leaves the bridge; the metadata address 169.254.169.254 sits on each namespace's own
loopback, and ``/etc/netns/<ns>/hosts`` (which ``ip netns exec`` bind-mounts over /etc/hosts)
names it ``metadata.google.internal``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from rayslice.errors import SimulatorError
from rayslice.local.google.metadata_server import METADATA_HOST, METADATA_IP
from rayslice.local.host.processes import cmdline

NETNS_ETC = Path("/etc/netns")
NETNS_RUN = Path("/run/netns")  # where `ip netns add` pins each named namespace
# Candidate subnets: carrier-grade NAT space, rarely used on a developer machine or in CI.
CANDIDATE_SPACE = ipaddress.IPv4Network("100.64.0.0/10")


# A simulation's run id: every name below carries it, so parallel simulations never collide.
# Interface names must fit Linux's 15 characters: ``rsl<id>`` is 9.
RUN_ID = re.compile(r"[0-9a-f]{6}")


def bridge_name(run_id: str) -> str:
    return f"rsl{run_id}"


def host_links(run_id: str, index: int, name: str) -> tuple[str, str, str]:
    """(namespace, bridge-side veth, host-side veth) of host `index` named `name`."""
    return f"rsl-{run_id}-{name}", f"rsl{run_id}h{index}", f"rsl{run_id}p{index}"


# A failed `ip` command is a simulator failure: the message holds the command and its stderr.
# The name stays for importers; rayslice.errors holds the classes.
NetnsError = SimulatorError


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check=check)


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return proc


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 route and address on this machine, so a new subnet can avoid them."""
    used = []
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default" and not dst.startswith(("broadcast", "local")):
            used.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
    for link in json.loads(ip("-j", "-4", "addr").stdout or "[]"):
        for addr in link.get("addr_info", []):
            used.append(ipaddress.IPv4Network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    return used


def free_subnet(
    prefix: int, used: Sequence[ipaddress.IPv4Network], rng: random.Random
) -> ipaddress.IPv4Network:
    """A random subnet of CANDIDATE_SPACE that overlaps nothing in `used`."""
    count = 2 ** (prefix - CANDIDATE_SPACE.prefixlen)
    for _ in range(200):
        index = rng.randrange(count)
        candidate = ipaddress.IPv4Network(
            (int(CANDIDATE_SPACE.network_address) + index * 2 ** (32 - prefix), prefix)
        )
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise NetnsError(f"no free /{prefix} subnet in {CANDIDATE_SPACE}")


def link_exists(name: str) -> bool:
    return ip("link", "show", "dev", name, check=False).returncode == 0


def netns_exists(name: str) -> bool:
    return name in ip("netns", "list").stdout.split()


def create_bridge(name: str, gateway: str, prefix: int) -> None:
    ip("link", "add", name, "type", "bridge")
    ip("addr", "add", f"{gateway}/{prefix}", "dev", name)
    ip("link", "set", name, "up")


def create_host_network(netns: str, veth: str, peer: str, bridge: str, address: str, prefix: int) -> None:
    """Namespace `netns` with eth0 (`address`) on `bridge`, loopback up and the metadata IP on it."""
    ip("netns", "add", netns)
    ip("link", "add", veth, "type", "veth", "peer", "name", peer)
    ip("link", "set", veth, "master", bridge)
    ip("link", "set", veth, "up")
    ip("link", "set", peer, "netns", netns)
    ip("-n", netns, "link", "set", peer, "name", "eth0")
    ip("-n", netns, "addr", "add", f"{address}/{prefix}", "dev", "eth0")
    ip("-n", netns, "link", "set", "eth0", "up")
    ip("-n", netns, "link", "set", "lo", "up")
    ip("-n", netns, "addr", "add", f"{METADATA_IP}/32", "dev", "lo")


def write_etc(netns: str, hostname: str, peers: dict[str, str]) -> None:
    """The namespace's /etc/hosts (itself, every other host, the metadata server) and an empty resolv.conf."""
    etc = NETNS_ETC / netns
    etc.mkdir(parents=True, exist_ok=True)
    lines = ["127.0.0.1\tlocalhost", f"{METADATA_IP}\t{METADATA_HOST}"]
    lines += [f"{address}\t{name}" for name, address in peers.items()]
    (etc / "hosts").write_text("\n".join(lines) + "\n")
    (etc / "hostname").write_text(hostname + "\n")
    (etc / "resolv.conf").write_text("# simulated host: no DNS, names come from /etc/hosts\n")


def netns_pids(netns: str) -> list[int]:
    """PIDs of every process in the namespace (``ip netns pids``, which matches by the exact name)."""
    proc = ip("netns", "pids", netns, check=False)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def in_netns(pid: int, netns: str) -> bool:
    """Whether process `pid` lives in the named namespace, or is the `ip netns exec` about to enter it.

    The simulator only signals a recorded PID when this holds for the namespace of the host the
    PID was recorded for: a PID in a tampered state file cannot make it kill anything else.
    """
    try:
        mine, target = os.stat(f"/proc/{pid}/ns/net"), os.stat(NETNS_RUN / netns)
        if (mine.st_dev, mine.st_ino) == (target.st_dev, target.st_ino):
            return True
    except OSError:
        pass
    return cmdline(pid)[:4] == ["ip", "netns", "exec", netns]


def delete_netns(netns: str) -> None:
    if netns_exists(netns):
        ip("netns", "del", netns)
    shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)


def delete_link(name: str) -> None:
    """Delete a link if it exists (a veth also vanishes, asynchronously, with its peer's namespace)."""
    if ip("link", "del", name, check=False).returncode != 0 and link_exists(name):
        ip("link", "del", name)
