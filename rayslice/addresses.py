"""Which network addresses stay inside an organisation's own networks.

Two decisions rest on it: whether `rayslice run` may send the Ray token over plain http (only to
an internal address), and which of the dashboard's source ranges are public (those need token
auth, and together they must stay narrow). Internal means loopback, the private ranges (RFC 1918,
IPv6 unique local) and the RFC 6598 shared address space, which is not routed on the internet
(the simulator's bridges use it).
"""

from __future__ import annotations

import ipaddress

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

SHARED_ADDRESS_SPACE = ipaddress.IPv4Network("100.64.0.0/10")


def is_internal(address: Address) -> bool:
    """Whether `address` is loopback, private or in the shared address space."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_loopback
        or address.is_private
        or (isinstance(address, ipaddress.IPv4Address) and address in SHARED_ADDRESS_SPACE)
    )


def is_internal_network(network: Network) -> bool:
    """Whether every address of `network` is internal."""
    if isinstance(network, ipaddress.IPv4Network) and network.subnet_of(SHARED_ADDRESS_SPACE):
        return True
    return network.is_private or network.is_loopback


def public_addresses(networks: list[Network], version: int) -> int:
    """How many addresses of IP `version` the public ones of `networks` cover together, overlaps
    counted once (a range that is not wholly internal counts whole)."""
    public = [n for n in networks if n.version == version and not is_internal_network(n)]
    merged = ipaddress.collapse_addresses(public)  # type: ignore[type-var]  # one family per call
    return sum(n.num_addresses for n in merged)
