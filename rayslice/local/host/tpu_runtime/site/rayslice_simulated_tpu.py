"""The simulated TPU runtime, as every Python process on a simulated TPU host loads it.

It stands in for what libtpu and the TPU VM image give a real host, so that unmodified JAX and
PyTorch/XLA programs see the host's chips:

- a process sees the chips it holds: those in ``TPU_VISIBLE_CHIPS`` (Ray sets it for a task that
  holds part of a host), else every chip of the host (``/dev/accel*``, or the TPU devices of
  ``/dev/vfio``);
- JAX runs on CPU with one device per chip held (``jax_platforms=cpu``, ``jax_num_cpu_devices``);
- a JAX process that holds all of a host's chips on a multi-host slice joins the other hosts'
  processes by itself before its first computation (as libtpu does), with the coordinator on
  worker 0 of the slice, the process id from the host's TPU worker id, and gloo collectives; a
  user's own ``jax.distributed.initialize()`` finds the same values through a JAX cluster
  environment;
- torch_xla runs on its CPU PJRT client with one device per chip held;
- a JAX process that holds chips records what they run (`Recorder`): per chip, the bytes of the
  live arrays it holds and how busy the process was, in a small file per process in the host's
  state dir; the simulated ``libtpu.sdk`` beside this module (``tpumonitoring``, ``slice``) reads
  those files in any process of the host, and gives the chips' coordinates as a real slice of the
  host's topology has them (`chip_coordinates`).

The host's identity comes from where a TPU VM has it: ``TPU_WORKER_ID`` /
``TPU_WORKER_HOSTNAMES`` / ``MEGASCALE_*`` when set, else the metadata server
(``agent-worker-number``, ``worker-network-endpoints``). The
``sitecustomize`` beside it imports it at a process's first import of JAX or torch_xla, and only
when ``RAYSLICE_SIMULATED_TPU=1``, which only simulated TPU hosts have; it imports nothing outside
the standard library until then.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import importlib.abc
import importlib.machinery
import json
import math
import os
import socket
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

ENABLE_VAR = "RAYSLICE_SIMULATED_TPU"
COORDINATOR_PORT_VAR = "RAYSLICE_SIMULATED_TPU_COORDINATOR_PORT"
DEFAULT_COORDINATOR_PORT = 8476
DEVICES_PER_CHIP_VAR = "RAYSLICE_SIMULATED_TPU_DEVICES_PER_CHIP"
GOOGLE_PCI_VENDOR = "0x1ae0"
VISIBLE_CHIPS_VAR = "TPU_VISIBLE_CHIPS"  # what Ray sets for a task holding part of a host
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/"
METADATA_TIMEOUT_S = 5.0
HBM_BYTES_VAR = "RAYSLICE_SIMULATED_TPU_HBM_BYTES"  # per chip, from the catalog
STATE_DIR_VAR = "RAYSLICE_SIMULATED_TPU_STATE_DIR"
# The host's private /dev/shm (`rayslice.local.host.boot` gives each host its own): what the
# chips run, one file per JAX process that holds chips, gone with the host.
DEFAULT_STATE_DIR = "/dev/shm/rayslice-simulated-tpu"
SAMPLE_S = 0.25  # how often a JAX process samples its own CPU time and live arrays
WINDOW_S = 5.0  # duty cycle and utilization are over this last stretch, as libtpu's are recent figures
# A sample counts as busy when the process used at least this share of one CPU during it: an idle
# JAX process (arrays held, nothing running) uses next to none; one that runs steps, far more.
BUSY_CPU_SHARE = 0.05
STALE_S = 15.0  # a record older than this is from a process that no longer samples: its chips idle


def host_chips(dev: str = "/dev", groups: str = "/sys/kernel/iommu_groups") -> int:
    """The chips of this host, found where Ray and libtpu find them: a ``/dev/accelN`` per chip
    (v4 and older), else a ``/dev/vfio/<group>`` per TPU device whose PCI vendor is Google's,
    ``RAYSLICE_SIMULATED_TPU_DEVICES_PER_CHIP`` devices to a chip (2 on TPU7x)."""
    accel = [p for p in glob.glob(os.path.join(dev, "accel*")) if not os.path.isdir(p)]
    if accel:
        return len(accel)
    try:
        entries = [e for e in os.listdir(os.path.join(dev, "vfio")) if e.isdigit()]
    except OSError:
        return 0
    devices = len([e for e in entries if _google_group(os.path.join(groups, e, "devices"))])
    return devices // max(1, int(os.environ.get(DEVICES_PER_CHIP_VAR, "1")))


def _google_group(devices: str) -> bool:
    """Whether an IOMMU group holds a Google PCI device (a TPU), as Ray 2.60 checks it."""
    try:
        functions = os.listdir(devices)
    except OSError:
        return False
    for function in functions:
        try:
            with open(os.path.join(devices, function, "vendor"), encoding="ascii") as f:
                if f.read().strip().lower() == GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return False


def chips_held(environ: dict[str, str] | None = None) -> int:
    """The chips this process may use: ``TPU_VISIBLE_CHIPS`` if set, else all of the host's."""
    return len(chip_indices(environ))


def chip_indices(environ: dict[str, str] | None = None) -> list[int]:
    """The host chip indices this process holds, in the order its devices come."""
    env = os.environ if environ is None else environ
    visible = env.get(VISIBLE_CHIPS_VAR, "").strip()
    if visible:
        return [int(c) for c in visible.split(",") if c.strip()]
    return list(range(host_chips()))


def metadata(key: str) -> str | None:
    """One ``instance/attributes/`` value from the host's metadata server; None when absent."""
    request = urllib.request.Request(METADATA_URL + key, headers={"Metadata-Flavor": "Google"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=METADATA_TIMEOUT_S) as response:
            return response.read().decode()
    except OSError:
        return None


@dataclass(frozen=True)
class SliceIdentity:
    """Where this host sits: its worker id, its slice's hosts (worker order) and the multislice."""

    worker_id: int
    hosts: tuple[str, ...]
    num_slices: int = 1
    slice_id: int = 0
    megascale_coordinator: str | None = None

    @property
    def process_count(self) -> int:
        return len(self.hosts) * self.num_slices

    @property
    def process_id(self) -> int:
        """What JAX's Cloud TPU cluster detection computes: slice id x hosts per slice + worker id."""
        return self.slice_id * len(self.hosts) + self.worker_id

    def coordinator(self, port: int) -> str:
        host = self.megascale_coordinator or self.hosts[0]
        return f"{host.split(':')[0]}:{port}"  # MEGASCALE_COORDINATOR_ADDRESS may carry a port


def parse_endpoints(endpoints: str) -> tuple[str, ...]:
    """``worker-network-endpoints`` (``unknown:unknown:<ip>,...``) as IPs, worker 0 first."""
    return tuple(entry.split(":")[2] for entry in endpoints.split(",") if entry.count(":") >= 2)


def identity(
    environ: dict[str, str] | None = None, lookup: Callable[[str], str | None] = metadata
) -> SliceIdentity | None:
    """The host's identity from ``TPU_*`` / ``MEGASCALE_*`` variables, else from metadata."""
    env = os.environ if environ is None else environ
    worker = env.get("TPU_WORKER_ID") or lookup("agent-worker-number")
    hostnames = env.get("TPU_WORKER_HOSTNAMES")
    if hostnames:
        hosts = tuple(h.strip() for h in hostnames.split(",") if h.strip())
    else:
        hosts = parse_endpoints(lookup("worker-network-endpoints") or "")
    if worker is None or not worker.strip().isdigit() or not hosts:
        return None
    num_slices = int(env.get("MEGASCALE_NUM_SLICES") or 1)
    return SliceIdentity(
        worker_id=int(worker),
        hosts=hosts,
        num_slices=num_slices,
        slice_id=int(env.get("MEGASCALE_SLICE_ID") or 0) if num_slices > 1 else 0,
        megascale_coordinator=(env.get("MEGASCALE_COORDINATOR_ADDRESS") or None) if num_slices > 1 else None,
    )


def coordinator_port(environ: dict[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    return int(env.get(COORDINATOR_PORT_VAR) or DEFAULT_COORDINATOR_PORT)


def joins_slice(held: int, on_host: int, ident: SliceIdentity | None) -> bool:
    """libtpu's rule: a process spans the slice only when it holds the whole host of a multi-host slice."""
    return ident is not None and held == on_host > 0 and ident.process_count > 1


# ---- what the chips run (read by the simulated libtpu.sdk) ---------------------------------------


def state_dir(environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get(STATE_DIR_VAR) or DEFAULT_STATE_DIR


class Recorder:
    """Samples, in a JAX process that holds chips, what those chips run, and writes it for the host.

    Every `SAMPLE_S` it reads the process's CPU time and the live arrays' bytes per device. A chip
    is a CPU device here, so the process's CPU time is what its chips computed: the duty cycle is
    the share of the last `WINDOW_S` in samples where the process used at least `BUSY_CPU_SHARE`
    of a CPU, the TensorCore utilization the CPU seconds used per chip held over the wall seconds,
    and a chip's HBM the bytes of the live array shards on its device. The record is one JSON file
    per process (``<pid>.json``), replaced whole each time, removed at exit.
    """

    def __init__(self, chips: list[int], directory: str, live_bytes: Callable[[], list[int]]):
        self.chips = chips
        self.path = os.path.join(directory, f"{os.getpid()}.json")
        self.live_bytes = live_bytes
        self.samples: deque[tuple[float, float, bool]] = deque()  # (wall s, CPU s, busy)
        self.last = (time.monotonic(), time.process_time())
        self.stopping = threading.Event()
        os.makedirs(directory, exist_ok=True)

    def sample(self) -> dict[str, Any]:
        """Take one sample, write the record, and return it."""
        now, cpu = time.monotonic(), time.process_time()
        wall, used = now - self.last[0], cpu - self.last[1]
        self.last = (now, cpu)
        self.samples.append((wall, used, used >= BUSY_CPU_SHARE * wall))
        while sum(w for w, _, _ in self.samples) > WINDOW_S and len(self.samples) > 1:
            self.samples.popleft()
        span = sum(w for w, _, _ in self.samples) or 1.0
        duty = 100.0 * sum(w for w, _, busy in self.samples if busy) / span
        util = 100.0 * sum(u for _, u, _ in self.samples) / span / max(1, len(self.chips))
        record = {
            "pid": os.getpid(),
            "time": time.time(),
            "chips": self.chips,
            "hbm_bytes": self.live_bytes(),
            "duty_cycle_pct": round(min(100.0, duty), 2),
            "tensorcore_util_pct": round(min(100.0, util), 2),
        }
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(tmp, self.path)
        return record

    def stop(self, thread: threading.Thread) -> None:
        """At exit, before JAX tears its backends down (atexit runs this first: it was registered
        after JAX's own): no sample may reach into a backend that is going away."""
        self.stopping.set()
        thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def run(self) -> None:
        while not self.stopping.wait(SAMPLE_S):
            try:
                self.sample()
            except Exception:  # a sample that fails (an array freed mid-read) is only skipped
                continue


def _jax_live_bytes() -> list[int]:
    """Bytes of the live arrays' shards on each of this process's devices, in device order; none
    before the process's backends exist.

    The recorder starts before the process joins its slice, and `jax.local_devices()` would
    create the backends from this thread while the main thread is still in
    ``jax.distributed.initialize()``: the backend then comes up half joined, and the coordination
    service aborts the process ("wrong service incarnation")."""
    import jax
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        return []
    local = {d: i for i, d in enumerate(jax.local_devices())}
    held = [0] * len(local)
    for array in jax.live_arrays():
        try:
            shard = math.prod(array.sharding.shard_shape(array.shape)) * array.dtype.itemsize
            for device in array.sharding.addressable_devices:
                if device in local:
                    held[local[device]] += shard
        except Exception:  # deleted between the listing and the read
            continue
    return held


def _start_recorder() -> None:
    """Record what this JAX process's chips run, in a daemon thread, until the process exits."""
    chips = chip_indices()
    if not chips:
        return
    recorder = Recorder(chips, state_dir(), _jax_live_bytes)
    thread = threading.Thread(target=recorder.run, name="rayslice-simulated-tpu-recorder", daemon=True)
    thread.start()
    atexit.register(recorder.stop, thread)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def read_records(environ: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The records of this host's JAX processes that still run and still sample."""
    directory = state_dir(environ)
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".json")]
    except OSError:
        return []
    records = []
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if _alive(int(record.get("pid", 0))) and time.time() - float(record.get("time", 0)) < STALE_S:
            records.append(record)
    return records


@dataclass(frozen=True)
class ChipFigures:
    """What libtpu reports for one chip: duty cycle, TensorCore utilization, HBM used and total."""

    duty_cycle_pct: float
    tensorcore_util_pct: float
    hbm_used: int
    hbm_total: int


def chip_figures(environ: dict[str, str] | None = None) -> list[ChipFigures]:
    """Each of the host's chips, from what its JAX processes recorded; a chip no process holds is
    idle and holds nothing."""
    env = os.environ if environ is None else environ
    total = int(env.get(HBM_BYTES_VAR) or 0)
    chips = host_chips()
    duty, util, used = [0.0] * chips, [0.0] * chips, [0] * chips
    for record in read_records(environ):
        for position, chip in enumerate(record.get("chips", [])):
            if 0 <= chip < chips:
                duty[chip] = max(duty[chip], float(record.get("duty_cycle_pct", 0.0)))
                util[chip] = max(util[chip], float(record.get("tensorcore_util_pct", 0.0)))
                hbm = record.get("hbm_bytes", [])
                used[chip] += int(hbm[position]) if position < len(hbm) else 0
    return [ChipFigures(duty[c], util[c], used[c], total) for c in range(chips)]


# ---- chip coordinates (read by the simulated libtpu.sdk.slice) ----------------------------------


def chips_per_host_bounds(chips: int, rank: int) -> tuple[int, ...]:
    """How a host's chips lie in the slice, as libtpu's TPU_CHIPS_PER_HOST_BOUNDS says: 1 chip
    1x1(x1), 4 chips 2x2(x1), an 8-chip v5e/v6e host 2x4."""
    shape = {1: (1, 1), 2: (1, 2), 4: (2, 2), 8: (2, 4)}[chips]
    return shape if rank == 2 else (*shape, 1)


def chip_coordinates(topology: str, worker: int, chips: int) -> list[tuple[int, ...]]:
    """The (x, y, z) of each chip of worker `worker` of a slice of `topology` (``AxB`` or
    ``AxBxC``: x, y[, z] chips), `chips` chips to a host: hosts tile the slice x first, then y,
    then z (TPU_HOST_BOUNDS = topology / chips-per-host bounds), and a host's chips are x first
    within its block. A 2-D slice's chips have z 0."""
    dims = tuple(int(d) for d in topology.lower().split("x"))
    block = chips_per_host_bounds(chips, len(dims))
    hosts = tuple(d // b for d, b in zip(dims, block, strict=True))
    dims3, block3, hosts3 = (*dims, 1)[:3], (*block, 1)[:3], (*hosts, 1)[:3]
    if not 0 <= worker < math.prod(hosts3) or any(d % b for d, b in zip(dims3, block3, strict=True)):
        raise ValueError(f"no worker {worker} of {chips} chips in a {topology} slice")
    origin = (
        worker % hosts3[0] * block3[0],
        worker // hosts3[0] % hosts3[1] * block3[1],
        worker // (hosts3[0] * hosts3[1]) * block3[2],
    )
    return [
        (
            origin[0] + i % block3[0],
            origin[1] + i // block3[0] % block3[1],
            origin[2] + i // (block3[0] * block3[1]),
        )
        for i in range(chips)
    ]


def host_chip_coordinates(environ: dict[str, str] | None = None) -> list[tuple[str, int, tuple[int, ...]]]:
    """This host's chips as ``(hostname, chip index, coordinates)``, from its topology
    (``TPU_TOPOLOGY``, which the boot script gives Ray and its workers) and worker id."""
    env = os.environ if environ is None else environ
    topology = env.get("TPU_TOPOLOGY") or ""
    ident = identity(environ)
    chips = host_chips()
    if not topology or ident is None or chips == 0:
        raise RuntimeError("no TPU slice here: TPU_TOPOLOGY or the host's worker id is unknown")
    hostname = socket.gethostname()
    coords = chip_coordinates(topology, ident.worker_id, chips)
    return [(hostname, index, xyz) for index, xyz in enumerate(coords)]


# ---- JAX ----------------------------------------------------------------------------------------


def _distributed_initialized() -> bool:
    from jax._src import distributed

    return distributed.global_state.client is not None


def _make_cluster_env() -> None:
    """Register a JAX cluster environment, so a bare ``jax.distributed.initialize()`` finds the slice."""
    from jax._src import clusters

    class SimulatedTpuCluster(clusters.ClusterEnv):
        name = "rayslice-simulated-tpu"
        opt_in_only_method = False

        @classmethod
        def is_env_present(cls) -> bool:
            return host_chips() > 0 and identity() is not None

        @classmethod
        def get_coordinator_address(
            cls, timeout_secs: int | None, override_coordinator_port: Any = None
        ) -> str:
            ident = identity()
            assert ident is not None  # is_env_present said so
            return ident.coordinator(int(override_coordinator_port or coordinator_port()))

        @classmethod
        def get_process_count(cls) -> int:
            ident = identity()
            return ident.process_count if ident and joins_slice(chips_held(), host_chips(), ident) else 1

        @classmethod
        def get_process_id(cls) -> int:
            ident = identity()
            return ident.process_id if ident and joins_slice(chips_held(), host_chips(), ident) else 0

        @classmethod
        def get_local_process_id(cls) -> int | None:
            return None

    # Checked before the others, as JAX's own TPU detection would be on a TPU VM.
    types = clusters.ClusterEnv._cluster_types
    types.remove(SimulatedTpuCluster)
    types.insert(0, SimulatedTpuCluster)


def _configure_jax_backend() -> None:
    """Before JAX's first computation: CPU devices, one per chip held; join the slice if whole host."""
    import jax

    held = chips_held()
    platforms = getattr(jax.config, "jax_platforms", None) or ""
    if not platforms or "tpu" in platforms:
        jax.config.update("jax_platforms", "cpu")
    if held > 0:
        jax.config.update("jax_num_cpu_devices", held)
    _start_recorder()
    ident = identity()
    if joins_slice(held, host_chips(), ident) and not _distributed_initialized():
        assert ident is not None
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            ident.coordinator(coordinator_port()),
            num_processes=ident.process_count,
            process_id=ident.process_id,
        )


def _patch_jax(_module: ModuleType) -> None:
    from jax._src import xla_bridge

    original = xla_bridge.backends
    configured = False

    def backends() -> Any:
        nonlocal configured
        if not configured and not xla_bridge.backends_are_initialized():
            configured = True
            _configure_jax_backend()
        return original()

    backends.__doc__ = original.__doc__
    xla_bridge.backends = backends  # the runtime's one hook into JAX
    _make_cluster_env()


# ---- torch_xla ----------------------------------------------------------------------------------


def _prepare_torch_xla() -> None:
    """PJRT's CPU client with one device per chip held, in place of the TPU client."""
    if os.environ.get("PJRT_DEVICE", "TPU").upper() == "TPU":
        os.environ["PJRT_DEVICE"] = "CPU"
    held = chips_held()
    if held > 0 and "CPU_NUM_DEVICES" not in os.environ:
        os.environ["CPU_NUM_DEVICES"] = str(held)


# ---- import hook --------------------------------------------------------------------------------


class _Loader(importlib.abc.Loader):
    """Runs the real loader, with a step before and after the module's code."""

    def __init__(
        self, inner: importlib.abc.Loader, before: Callable[[], None], after: Callable[[ModuleType], None]
    ):
        self.inner = inner
        self.before = before
        self.after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.before()
        self.inner.exec_module(module)
        self.after(module)

    def __getattr__(self, name: str) -> Any:  # resource readers and the like: the real loader's
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loading of ``jax`` and ``torch_xla`` (top-level packages only, once each)."""

    hooks: ClassVar[dict[str, tuple[Callable[[], None], Callable[[ModuleType], None]]]] = {
        "jax": (lambda: None, _patch_jax),
        "torch_xla": (_prepare_torch_xla, lambda _m: None),
    }

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                before, after = self.hooks[fullname]
                spec.loader = _Loader(spec.loader, before, after)
                return spec
        return None


def install() -> _Finder:
    """Put the import hook first on ``sys.meta_path`` (once per process) and return it."""
    for finder in sys.meta_path:
        if isinstance(finder, _Finder):
            return finder
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    return finder
