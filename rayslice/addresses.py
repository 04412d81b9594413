"""Which network addresses stay inside an organisation's own networks.

Two decisions rest on it: whether `rayslice run` may send the Ray token over plain http (only to
an internal address), and which of the dashboard's source ranges are public (those need token
auth, and together they must stay narrow). Internal means the ranges of `INTERNAL`, listed one
by one: the private ranges (RFC 1918), the RFC 6598 shared address space, which is not routed on
the internet (the simulator's bridges use it), IPv6 unique local addresses (RFC 4193) and
loopback. The list is explicit because Python's `is_private` also holds ranges that reach the
internet: Teredo (2001::/32) and the rest of 2001::/23, whose addresses tunnel to public hosts,
and the IPv4-mapped ::ffff:0:0/96. An IPv4-mapped address or range is judged as the IPv4 one it
stands for (`unwrap`).
"""

from __future__ import annotations

import ipaddress

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

SHARED_ADDRESS_SPACE = ipaddress.IPv4Network("100.64.0.0/10")
INTERNAL: tuple[Network, ...] = (
    ipaddress.IPv4Network("10.0.0.0/8"),  # RFC 1918
    ipaddress.IPv4Network("172.16.0.0/12"),  # RFC 1918
    ipaddress.IPv4Network("192.168.0.0/16"),  # RFC 1918
    SHARED_ADDRESS_SPACE,  # RFC 6598
    ipaddress.IPv4Network("127.0.0.0/8"),  # loopback
    ipaddress.IPv6Network("fc00::/7"),  # unique local (RFC 4193)
    ipaddress.IPv6Network("::1/128"),  # loopback
)
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def unwrap(network: Network) -> Network:
    """An IPv4-mapped IPv6 range (within ::ffff:0:0/96) as the IPv4 range it stands for."""
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_MAPPED):
        low = int(network.network_address) & 0xFFFFFFFF
        return ipaddress.IPv4Network((low, network.prefixlen - 96))
    return network


def is_internal(address: Address) -> bool:
    """Whether `address` lies in one of the `INTERNAL` ranges."""
    return is_internal_network(ipaddress.ip_network(address))


def is_internal_network(network: Network) -> bool:
    """Whether every address of `network` lies in one of the `INTERNAL` ranges."""
    network = unwrap(network)
    return any(
        network.version == internal.version and network.subnet_of(internal)  # type: ignore[arg-type]  # same family
        for internal in INTERNAL
    )


def public_addresses(networks: list[Network], version: int) -> int:
    """How many addresses of IP `version` the public ones of `networks` cover together, overlaps
    counted once (a range that is not wholly internal counts whole; an IPv4-mapped one as IPv4)."""
    unwrapped = [unwrap(n) for n in networks]
    public = [n for n in unwrapped if n.version == version and not is_internal_network(n)]
    merged = ipaddress.collapse_addresses(public)  # type: ignore[type-var]  # one family per call
    return sum(n.num_addresses for n in merged)
