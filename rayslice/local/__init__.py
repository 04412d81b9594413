"""The local simulator: TPU slices as Linux network namespaces on one machine (`rayslice.local`).

Three layers, each importing only the ones below it (tests/rayslice/test_imports.py):

- `rayslice.local.simulation` and `rayslice.local.commands` on top: the plan and its state file,
  `Simulation` (builds, boots and tears down hosts), the bridge from the cloud API emulation to
  the simulated hosts, ``rayslice local`` and its status report.
- `rayslice.local.host`: the Linux machinery of a simulated host, which needs root (network
  namespaces, the packet filter, processes, private files, the host's PID 1, the simulated TPU
  runtime).
- `rayslice.local.google`: fakes of Google's services (the GCE metadata server, what a host's
  metadata holds, the cloud API emulation). They need no root and know nothing of Linux
  namespaces, so tests run them in-process.

`wheelhouse` serves tests and benchmarks only.
"""
