"""Shared test helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout (design docs, reference tables, fixtures)."""
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} is missing: the tests need ../shared beside the checkout")
    return SHARED
