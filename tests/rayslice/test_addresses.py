"""`rayslice.addresses`: internal means the listed ranges, after unwrapping IPv4-mapped ones.

Python's `is_private` also holds ranges that reach the internet (Teredo 2001::/32 and the rest
of 2001::/23, the IPv4-mapped ::ffff:0:0/96, link-local), so both decisions built on this module
(the Ray token over plain http, dashboardSourceRanges with rayAuth=none) must not use it.
"""

from __future__ import annotations

import ipaddress

import pytest

from rayslice import addresses


@pytest.mark.parametrize(
    "address, internal",
    [
        ("10.1.2.3", True),
        ("172.31.255.255", True),
        ("192.168.0.1", True),
        ("100.64.0.1", True),
        ("127.0.0.1", True),
        ("::1", True),
        ("fd12::1", True),
        ("::ffff:10.0.0.1", True),  # an IPv4-mapped private address is that address
        ("2001::1", False),  # Teredo: tunnels to a public host
        ("2001:2::1", False),  # benchmarking, within 2001::/23
        ("::ffff:8.8.8.8", False),
        ("169.254.169.254", False),  # link-local: no network of the user's own
        ("fe80::1", False),
        ("192.0.2.1", False),  # documentation
        ("34.1.2.3", False),
    ],
)
def test_an_address_is_internal_only_in_the_listed_ranges(address, internal):
    assert addresses.is_internal(ipaddress.ip_address(address)) is internal


@pytest.mark.parametrize(
    "network, internal",
    [
        ("10.0.0.0/8", True),
        ("::ffff:10.0.0.0/104", True),
        ("::ffff:0:0/96", False),  # all of IPv4, mapped
        ("2001::/32", False),
        ("2001::/23", False),
        ("fc00::/7", True),
        ("fc00::/6", False),
        ("100.0.0.0/9", False),  # wider than the shared address space, which it holds
    ],
)
def test_a_network_is_internal_only_within_a_listed_range(network, internal):
    assert addresses.is_internal_network(ipaddress.ip_network(network)) is internal


def test_ipv4_mapped_ranges_count_as_the_ipv4_they_stand_for():
    nets = [ipaddress.ip_network("::ffff:34.0.0.0/104"), ipaddress.ip_network("35.0.0.0/8")]
    assert addresses.public_addresses(nets, 4) == 2 * 2**24
    assert addresses.public_addresses(nets, 6) == 0
