"""The simulated ``libtpu`` package, imported in a test as a simulated host's processes import it.

The machine's venv may hold the real libtpu wheel (rayslice fit compiles with it), and another
test of the same process may have imported it: `sdk` sets the real modules aside and puts the
simulated runtime's site dir first on sys.path, all through the test's monkeypatch, which puts
everything back as it was when the test ends.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import pytest

from rayslice.local.host import tpu_runtime

SIMULATED = ("libtpu", "libtpu.sdk", "libtpu.sdk.slice", "libtpu.sdk.tpumonitoring")


def sdk(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The simulated ``libtpu.sdk`` (its ``tpumonitoring`` and ``slice``), for this test only."""
    for name in [n for n in sys.modules if n == "libtpu" or n.startswith("libtpu.")]:
        monkeypatch.delitem(sys.modules, name)  # the real one comes back afterwards
    for name in SIMULATED:  # recorded as absent: the simulated one goes afterwards
        monkeypatch.setitem(sys.modules, name, None)
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(tpu_runtime.SITE_DIR))
    return importlib.import_module("libtpu.sdk")
