"""The simulated ``libtpu`` package of a simulated TPU host (on PYTHONPATH, beside sitecustomize).

A real TPU VM's ``libtpu`` wheel holds the TPU runtime (``libtpu.so``) and ``libtpu.sdk``, the
Python interface that monitoring tools (tpu-info, google-cloud-mldiagnostics) and Ray's
``SubslicePlacementGroup`` call. This one answers the same ``sdk`` calls from what the simulated
chips run (`rayslice_simulated_tpu`). It has no runtime to load: JAX and torch_xla, which import
``libtpu`` to find one, get a path that does not exist and run on their CPU clients, as the
simulated runtime has them do anyway.
"""

import os


def get_library_path() -> str:
    """Where a real wheel's ``libtpu.so`` would be; nothing is there (see the module's doc)."""
    return os.path.join(os.path.dirname(__file__), "libtpu.so")
