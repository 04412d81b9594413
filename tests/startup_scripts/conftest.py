"""Fixtures of the boot-script sandbox tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.startup_scripts import sandbox


@pytest.fixture
def host() -> Iterator[list[sandbox.Sandbox]]:
    """Sandboxes the test made; their supervisors are killed afterwards whatever happened."""
    made: list[sandbox.Sandbox] = []
    yield made
    for box in made:
        box.stop()
        box.cloud.shutdown()
