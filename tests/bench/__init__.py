"""Tests of the benchmarks' pure parts; `load` imports a script from bench/, which is not a package."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str) -> ModuleType:
    """bench/<name>.py as the top-level module `name`, as its siblings import it.

    A bench script runs as ``python bench/<script>.py``, which puts bench/ on sys.path, and
    imports its siblings by their plain names (``from wheelhouse import ...``); here bench/ goes
    on the end of sys.path once, so each file is one module whoever imports it.
    """
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    return importlib.import_module(name)
