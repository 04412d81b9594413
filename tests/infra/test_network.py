"""The existing-network warnings of `rayslice.infra.network`, as `rayslice preview` prints them."""

from __future__ import annotations

from rayslice import cli

EXISTING_PRIVATE_INDEX = [
    "zone=us-east5-b",
    "network=shared",
    "subnetwork=sub",
    "packageIndex=https://idx.example/simple",
    "packageIndexCredentialsSecret=idx",
    "allowForeignPackageIndexSecret=true",
]


def _preview_warnings(caplog, overrides: list[str]) -> str:
    """The warnings the program logs under `rayslice preview` (the offline engine logs them)."""
    caplog.clear()
    args = ["preview"]
    for pair in overrides:
        args += ["--set", pair]
    assert cli.main(args) == 0
    return caplog.text


def test_a_cache_of_a_private_index_on_an_existing_network_is_named_in_a_warning(caplog):
    """The cache serves what it fetched with the index's credentials to any VM the network's own
    rules admit (issue 43, L11): the warning says so; without the cache there is nothing to say."""
    err = _preview_warnings(caplog, EXISTING_PRIVATE_INDEX)
    assert "package cache (port 3141) fetches packages from the index with its credentials" in err
    assert "shared VPC" in err and "packageCache=false" in err
    assert "package cache" not in _preview_warnings(caplog, [*EXISTING_PRIVATE_INDEX, "packageCache=false"])
