"""Keep the simulation's bridge subnet to root: other local users cannot reach the hosts.

Simulated hosts run Ray as root. Anyone who reaches a head's dashboard, GCS or client port can
run code there, so besides Ray's token auth the simulator guards the bridge with a packet filter
in the machine's own network namespace:

* output: a packet that leaves through the simulation's bridge, or is addressed to its subnet,
  from a socket of any user but root (``meta skuid != 0``) is dropped — the connect fails at
  once with EPERM;
* forward: a packet routed into the bridge from any other interface (a container, another
  machine when forwarding is on) is dropped;
* input: a host may not open a connection to the machine itself (the gateway, or any other
  address of the root namespace: sshd, a developer's local servers): from the bridge only
  replies to the machine's own connections pass, and new TCP connections from the `admitted`
  hosts (the one that runs the recovery controller, to reach the cloud API emulation).

Hosts talk to each other across the bridge (layer 2) and to their metadata server on their own
loopback, so no rule touches them. With nftables the rules form one table named after the
bridge (``inet rsl<run id>``), created and deleted by that exact name. Without ``nft``, the same
rules go into iptables/ip6tables' OUTPUT and FORWARD chains with a comment naming the run, and
are deleted by their exact specification. With neither tool there is no filter: `install` says
so and token auth is then the only guard (`Simulation.create` refuses ``insecure`` in that case).
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections.abc import Sequence

from rayslice.errors import SimulatorError
from rayslice.local.host.netns import RUN_ID, bridge_name

NFT = "nft"
IPTABLES = "iptables"
NONE = "none"


def available_backend() -> str:
    """The filter this machine offers: nft, else iptables, else none."""
    if shutil.which("nft"):
        return NFT
    if shutil.which("iptables"):
        return IPTABLES
    return NONE


def nft_ruleset(run_id: str, network: str, admitted: Sequence[str] = ()) -> str:
    """The nftables table of one simulation (fed to ``nft -f -``)."""
    table, bridge = _names(run_id)
    return "\n".join(
        [
            f"table inet {table} {{",
            "  chain output {",
            "    type filter hook output priority 0; policy accept;",
            f'    oifname "{bridge}" meta skuid != 0 drop',
            f"    ip daddr {network} meta skuid != 0 drop",
            "  }",
            "  chain forward {",
            "    type filter hook forward priority 0; policy accept;",
            f'    oifname "{bridge}" iifname != "{bridge}" drop',
            "  }",
            "  chain input {",
            "    type filter hook input priority 0; policy accept;",
            f'    iifname "{bridge}" ct state established,related accept',
            *(
                f'    iifname "{bridge}" ip saddr {_address(a)} meta l4proto tcp ct state new accept'
                for a in admitted
            ),
            f'    iifname "{bridge}" drop',
            "  }",
            "}",
            "",
        ]
    )


def iptables_rules(run_id: str, network: str, admitted: Sequence[str] = ()) -> list[list[str]]:
    """(command, chain, rule...) of each iptables/ip6tables rule, without the -A/-D verb, in the
    order they apply (`install` puts them, in this order, ahead of the chain's own rules)."""
    _, bridge = _names(run_id)
    tag = ["-m", "comment", "--comment", f"rayslice simulation {run_id}"]
    not_root = ["-m", "owner", "!", "--uid-owner", "0"]
    replies = ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED"]
    new_tcp = ["-p", "tcp", "-m", "conntrack", "--ctstate", "NEW"]
    admit = [
        ["iptables", "INPUT", "-i", bridge, "-s", _address(a), *new_tcp, *tag, "-j", "ACCEPT"]
        for a in admitted
    ]
    return [
        ["iptables", "OUTPUT", "-o", bridge, *not_root, *tag, "-j", "DROP"],
        ["iptables", "OUTPUT", "-d", network, *not_root, *tag, "-j", "DROP"],
        ["iptables", "FORWARD", "-o", bridge, "!", "-i", bridge, *tag, "-j", "DROP"],
        ["iptables", "INPUT", "-i", bridge, *replies, *tag, "-j", "ACCEPT"],
        *admit,
        ["iptables", "INPUT", "-i", bridge, *tag, "-j", "DROP"],
        ["ip6tables", "OUTPUT", "-o", bridge, *not_root, *tag, "-j", "DROP"],
        ["ip6tables", "FORWARD", "-o", bridge, "!", "-i", bridge, *tag, "-j", "DROP"],
        ["ip6tables", "INPUT", "-i", bridge, *replies, *tag, "-j", "ACCEPT"],
        ["ip6tables", "INPUT", "-i", bridge, *tag, "-j", "DROP"],
    ]


def install(backend: str, run_id: str, network: str, admitted: Sequence[str] = ()) -> None:
    """Create the simulation's rules with `backend` (a no-op for ``none``); `admitted`: the
    hosts' addresses that may open TCP connections to the machine."""
    if backend == NFT:
        _run([NFT, "-f", "-"], stdin=nft_ruleset(run_id, network, admitted))
    elif backend == IPTABLES:
        position: dict[tuple[str, str], int] = {}
        for tool, chain, *rule in iptables_rules(run_id, network, admitted):
            if tool == "ip6tables" and not shutil.which(tool):
                continue
            position[tool, chain] = position.get((tool, chain), 0) + 1
            _run([tool, "-w", "-I", chain, str(position[tool, chain]), *rule])
    elif backend != NONE:
        raise SimulatorError(f"unknown firewall backend {backend!r}")


def remove(backend: str, run_id: str, network: str, admitted: Sequence[str] = ()) -> None:
    """Delete exactly the rules `install` made for this run (absent ones are skipped)."""
    if backend == NFT:
        table, _ = _names(run_id)
        if _run([NFT, "list", "table", "inet", table], check=False).returncode == 0:
            _run([NFT, "delete", "table", "inet", table])
    elif backend == IPTABLES:
        for tool, chain, *rule in iptables_rules(run_id, network, admitted):
            if not shutil.which(tool):
                continue
            while _run([tool, "-w", "-C", chain, *rule], check=False).returncode == 0:
                _run([tool, "-w", "-D", chain, *rule])


def _address(text: str) -> str:
    """An IPv4 address, checked: it is written into a ruleset."""
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise SimulatorError(f"{text!r} is not an IPv4 address") from None


def _names(run_id: str) -> tuple[str, str]:
    """(nft table, bridge) of a run, both the bridge's name; the run id is checked first."""
    if not RUN_ID.fullmatch(run_id):
        raise SimulatorError(f"run id {run_id!r} is not six hex digits")
    return bridge_name(run_id), bridge_name(run_id)


def _run(
    argv: Sequence[str], *, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SimulatorError(f"{' '.join(argv)}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return proc
