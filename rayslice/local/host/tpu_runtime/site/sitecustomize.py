"""Start-up hook of simulated TPU hosts: Python imports this from PYTHONPATH in every process.

Only simulated TPU hosts put this directory on PYTHONPATH and set ``RAYSLICE_SIMULATED_TPU=1``
(see `rayslice.local.host.tpu_runtime`). Every process of such a host starts through here (Ray's
daemons and workers, the boot script's helpers), and most never import JAX or torch_xla. So this
file imports nothing itself: it puts a finder first on ``sys.meta_path`` that loads the simulated
TPU runtime at the first import of either, and hands that import to the runtime's own hook. The
runtime's standard-library imports (``urllib.request`` and the like) cost about 35 ms of CPU per
process, which the suite's simulated hosts paid hundreds of times.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # `typing` itself is an import every process would pay for
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

RUNTIME_PACKAGES = ("jax", "torch_xla")  # the packages `rayslice_simulated_tpu` wraps


class _LoadRuntimeOnFirstUse:
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in RUNTIME_PACKAGES:
            return None
        sys.meta_path.remove(self)
        import rayslice_simulated_tpu  # type: ignore[import-not-found]  # beside this file, on PYTHONPATH

        spec: ModuleSpec | None = rayslice_simulated_tpu.install().find_spec(fullname, path, target)
        return spec


if os.environ.get("RAYSLICE_SIMULATED_TPU") == "1":
    sys.meta_path.insert(0, _LoadRuntimeOnFirstUse())
