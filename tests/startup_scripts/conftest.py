"""Fixtures of the boot-script sandbox tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rayslice.local.google.metadata_server import MetadataServer
from rayslice.local.simulation.package_index import IndexServer
from tests import serving
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


def _tiny_packages(wheels: Path) -> None:
    make_wheel(wheels, "alpha", "1.0", ("beta",))
    make_wheel(wheels, "alpha", "2.0", ("beta",))
    make_wheel(wheels, "beta", "1.0")
    make_wheel(wheels, "gamma", "1.0", ("alpha",))


@pytest.fixture
def index(tmp_path) -> Iterator[str]:
    """A PEP 503 index on loopback serving tiny wheels (`tmp_path/wheels`): alpha 1.0 and 2.0
    (needing beta), beta 1.0, gamma 1.0 (needing alpha)."""
    _tiny_packages(tmp_path / "wheels")
    yield from _serve(tmp_path)


# Ray releases the jax preset's stand-ins are served with (`release_index`): none has a shipped lock.
STAND_IN_RAY_RELEASES = ("2.50.0", "2.51.0")


@pytest.fixture
def release_index(tmp_path) -> Iterator[str]:
    """`index`'s wheels and tiny stand-ins of what the jax preset's lines and Ray name (jax,
    optax, orbax-checkpoint, etils, Ray `STAND_IN_RAY_RELEASES`), within the preset's ranges, so a Ray
    release without a shipped lock resolves whole without the network. The stand-ins declare no
    extras (uv resolves `jax[tpu]` and `ray[default,train]` to the packages alone, with a warning)."""
    wheels = tmp_path / "wheels"
    _tiny_packages(wheels)
    make_wheel(wheels, "jax", "0.10.3", ("beta",))
    make_wheel(wheels, "optax", "0.2.9", ("jax",))
    make_wheel(wheels, "orbax_checkpoint", "0.12.9")
    make_wheel(wheels, "etils", "1.15.0")
    for release in STAND_IN_RAY_RELEASES:
        make_wheel(wheels, "ray", release)
    yield from _serve(tmp_path)


def _serve(tmp_path: Path) -> Iterator[str]:
    """`tmp_path/wheels` served on loopback as a PEP 503 index, until the test ends."""
    server = IndexServer(("127.0.0.1", 0), tmp_path / "wheels", 0.0, tmp_path / "counts.json")
    serving.start(server)
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    serving.stop(server)


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    """A metadata server on loopback with an empty instance: the guest attributes a head writes."""
    server = MetadataServer(("127.0.0.1", 0), {"instance": {}})
    serving.start(server)
    yield server
    serving.stop(server)
