"""Fixtures of the boot-script sandbox tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from rayslice.local.google.metadata_server import MetadataServer
from rayslice.local.simulation.package_index import IndexServer
from tests.startup_scripts import sandbox
from tests.startup_scripts.tiny_wheels import make_wheel


@pytest.fixture
def host() -> Iterator[list[sandbox.Sandbox]]:
    """Sandboxes the test made; their supervisors are killed afterwards whatever happened."""
    made: list[sandbox.Sandbox] = []
    yield made
    for box in made:
        box.stop()
        box.cloud.shutdown()


@pytest.fixture
def index(tmp_path) -> Iterator[str]:
    """A PEP 503 index on loopback serving tiny wheels (`tmp_path/wheels`): alpha 1.0 and 2.0
    (needing beta), beta 1.0, gamma 1.0 (needing alpha)."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "alpha", "1.0", ("beta",))
    make_wheel(wheels, "alpha", "2.0", ("beta",))
    make_wheel(wheels, "beta", "1.0")
    make_wheel(wheels, "gamma", "1.0", ("alpha",))
    server = IndexServer(("127.0.0.1", 0), wheels, 0.0, tmp_path / "counts.json")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    """A metadata server on loopback with an empty instance: the guest attributes a head writes."""
    server = MetadataServer(("127.0.0.1", 0), {"instance": {}})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()
