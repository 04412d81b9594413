"""Start-up hook of simulated TPU hosts: Python imports this from PYTHONPATH in every process.

Only simulated TPU hosts put this directory on PYTHONPATH and set ``RAYSLICE_SIMULATED_TPU=1``
(see `rayslice.local.host.tpu_runtime`). It loads the simulated TPU runtime and nothing else.
"""

import os

if os.environ.get("RAYSLICE_SIMULATED_TPU") == "1":
    import rayslice_simulated_tpu  # type: ignore[import-not-found]  # beside this file, on PYTHONPATH

    rayslice_simulated_tpu.install()
