"""Tests of the benchmarks' pure parts; `load` imports a script from bench/, which is not a package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str) -> ModuleType:
    """bench/<name>.py as module ``bench_<name>`` (registered first: its dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
