"""Compile a job's step for a TPU topology on this machine and read what XLA planned per chip.

Nothing here touches a cloud or a cluster: the devices are libtpu's compile-only devices of the
topology (`jax.experimental.topologies.get_topology_desc`), which exist on any x86 machine where
libtpu is installed (`rayslice[fit]`). Expected failures raise `InvalidInput` (exit 2) with one
line that says what to do.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayslice import catalog, compilation_cache, workloads
from rayslice.catalog import TpuType
from rayslice.errors import InvalidInput

EXTRA = "rayslice[fit]"
ENTRY_POINT = "fit_step"

# libtpu lays a topology's chips out over hosts of this many chips (x, y, z); the catalog says how
# many chips a host of the shape has. Without it, libtpu assumes 4-chip hosts and a 1x1 topology
# does not build.
_HOST_BOUNDS = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}
# Where libtpu's own logs go unless TPU_LOG_DIR says otherwise. Its default, /tmp/tpu_logs, is
# streamed by every Ray node of the same machine into its jobs' output (Ray 2.60's node.py links
# it into each session's logs, log_monitor.py tails it): a compile-only libtpu here holds no chip,
# and its compile errors (a whole HBM listing) must not turn up in some local Ray job's log.
LIBTPU_LOG_DIR = Path("~/.cache/rayslice/tpu_logs")
# What libtpu writes to the terminal while fit runs goes to this file there (`_stderr_to_log`).
STDERR_LOG = "rayslice-fit-stderr.log"


def _require_libtpu() -> None:
    try:
        import libtpu  # noqa: F401 - only whether it is there
    except ImportError:
        raise InvalidInput(
            f"rayslice fit compiles for TPUs with libtpu, which is not installed: pip install '{EXTRA}'"
        ) from None


@dataclass(frozen=True)
class Target:
    """Which chips to compile for: `slices` slices of one topology of one generation."""

    generation: str  # the catalog's name
    topology: str  # "2x2", "4x4x4"
    chips_per_host: int
    slices: int = 1

    @classmethod
    def of(cls, tpu: TpuType, slices: int = 1) -> Target:
        """A stack's slices (a validated spec's `tpu` and `slices`)."""
        return cls(tpu.generation, tpu.topology, tpu.chips_per_host, slices)

    @classmethod
    def parse(cls, text: str, slices: int = 1) -> Target:
        """``GEN:TOPOLOGY`` as libtpu writes it (``v5e:1x1``, ``v6e:4x4``), or as the catalog names a
        generation (``v5litepod:2x2``); hosts of up to 4 chips (8 for a 2x4 shape, one host)."""
        prefix, _, dims = text.strip().lower().partition(":")
        gen = catalog.generation_of(f"{prefix}-{dims}") if dims else None
        if gen is None or not re.fullmatch(r"[1-9][0-9]*(x[1-9][0-9]*)+", dims):
            known = ", ".join(f"{c.topology_prefix}:..." for c in catalog.CHIPS)
            raise InvalidInput(f"unknown topology {text!r}: write GENERATION:DIMS, e.g. v5e:2x2 ({known})")
        chips = math.prod(catalog.parse_topology(dims))
        per_host = 8 if dims == "2x4" else min(chips, 4)
        return cls(gen.name, dims, per_host, slices)

    @property
    def chips(self) -> int:
        return math.prod(catalog.parse_topology(self.topology)) * self.slices

    @property
    def chip(self) -> catalog.Chip:
        found = catalog.chip(self.generation)
        if found is None:
            raise InvalidInput(
                f"rayslice fit knows no HBM or peak figures for {self.generation} chips; "
                f"fit a generation the catalog describes ({', '.join(c.generation for c in catalog.CHIPS)})"
            )
        return found

    @property
    def name(self) -> str:
        """The topology as libtpu names it (``v5e:2x2``), with the slice count when more than one."""
        name = f"{self.chip.topology_prefix}:{self.topology}"
        return name if self.slices == 1 else f"{name} x {self.slices} slices"


def topology_devices(target: Target) -> list[Any]:
    """The compile-only devices of the target's slices (multislice: libtpu's `num_slices`)."""
    bounds = _HOST_BOUNDS.get(target.chips_per_host)
    if bounds is None:
        raise InvalidInput(f"rayslice fit cannot lay out {target.chips_per_host}-chip hosts for libtpu")
    name = f"{target.chip.topology_prefix}:{target.topology}"
    _require_libtpu()
    from jax.experimental import topologies

    options: dict[str, Any] = {"chips_per_host_bounds": bounds}
    if target.slices > 1:
        options["num_slices"] = target.slices
    try:
        with _libtpu_logs_out_of_tmp():
            return list(topologies.get_topology_desc(topology_name=name, platform="tpu", **options).devices)
    except Exception as exc:  # libtpu's own error type varies: any failure means no such topology
        raise InvalidInput(f"libtpu cannot build topology {target.name}: {_first_line(exc)}") from None


@contextlib.contextmanager
def _libtpu_logs_out_of_tmp() -> Iterator[None]:
    """`TPU_LOG_DIR` at `LIBTPU_LOG_DIR` while libtpu loads (the first topology loads it, and it
    reads the variable then), unless the user set one; nothing else of this process sees it."""
    if "TPU_LOG_DIR" in os.environ:
        yield
        return
    log_dir = LIBTPU_LOG_DIR.expanduser()
    log_dir.mkdir(parents=True, exist_ok=True)
    os.environ["TPU_LOG_DIR"] = str(log_dir)
    try:
        yield
    finally:
        del os.environ["TPU_LOG_DIR"]


@contextlib.contextmanager
def _as_on_a_tpu_host() -> Iterator[None]:
    """LIBTPU_INIT_ARGS as JAX sets it on a machine with TPU chips, for the block: libtpu reads it
    when it loads, and JAX's cache key hashes it, so a step compiled here gets a host's key."""
    saved = os.environ.get("LIBTPU_INIT_ARGS")
    args = (saved or "").split()
    given = {a.split("=")[0] for a in args}
    extra = [a for a in compilation_cache.TPU_HOST_LIBTPU_ARGS if a.split("=")[0] not in given]
    os.environ["LIBTPU_INIT_ARGS"] = " ".join(args + extra)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["LIBTPU_INIT_ARGS"]
        else:
            os.environ["LIBTPU_INIT_ARGS"] = saved


@contextlib.contextmanager
def _stderr_to_log(verbose: bool) -> Iterator[None]:
    """libtpu's own start-up and compile lines (written to file descriptor 2 by C++, warnings about
    the TPU environment a compile-only libtpu has no use for) into `STDERR_LOG` under libtpu's log
    folder, not the terminal; with `verbose`, left where they are. Python's own errors are raised
    past this block and printed by the command once it is over."""
    if verbose:
        yield
        return
    log_dir = Path(os.environ.get("TPU_LOG_DIR") or LIBTPU_LOG_DIR).expanduser()
    log_dir.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(log_dir / STDERR_LOG, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


FitEntry = Callable[[Sequence[Any], Sequence[str]], tuple[Any, tuple[Any, ...]]]


def load_entry(job: str) -> FitEntry:
    """The entry point of `job`: a bundled job's name (``jax_train``), a file (``train.py``) or a
    module (``my_pkg.train``), each optionally followed by ``:function`` (default `ENTRY_POINT`)."""
    target, _, function = job.partition(":")
    function = function or ENTRY_POINT
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise InvalidInput(f"no file {target}: give a bundled job's name, FILE.py or a module")
        spec = importlib.util.spec_from_file_location(f"rayslice_fit_{path.stem}", path)
        assert spec is not None and spec.loader is not None  # a .py file always has both
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses and pickling look modules up by name
        spec.loader.exec_module(module)
    else:
        name = target if "." in target else f"{workloads.__name__}.{target}"
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise  # the job's own import failed: its traceback says which
            raise InvalidInput(
                f"no job {target!r}: name a bundled job (jax_train), a FILE.py or an importable module"
            ) from None
    entry = getattr(module, function, None)
    if not callable(entry):
        raise InvalidInput(
            f"{target} has no function {function}(devices, argv) returning (step, abstract args); "
            "see docs/fit.md"
        )
    return entry


@dataclass(frozen=True)
class ArrayLayout:
    """One argument or output leaf: its global shape and how it lies over the mesh."""

    role: str  # "in" or "out"
    path: str  # where it sits in the arguments (jax.tree_util.keystr)
    shape: tuple[int, ...]
    dtype: str
    spec: str  # the PartitionSpec, or the sharding's repr for other shardings
    shard_shape: tuple[int, ...]
    bytes_per_device: int


@dataclass(frozen=True)
class Fit:
    """What XLA planned for one job's step on one topology."""

    topology: str  # libtpu's name, with the slices
    chips: int  # over every slice
    devices: int
    device_kind: str
    chip: catalog.Chip
    memory: dict[str, int]  # memory_analysis' sizes per device, in bytes
    flops_per_device: float
    bytes_accessed_per_device: float
    arrays: tuple[ArrayLayout, ...]
    # With a cache location (`fit(cache=...)`): the entries this compile added there (none when the
    # cache held the step already); None without one.
    cache_added: tuple[str, ...] | None = None
    cache_present: tuple[str, ...] = ()  # entries of the same names the cache held already

    @property
    def devices_per_chip(self) -> int:
        return self.devices // self.chips

    @property
    def hbm_needed(self) -> int:
        """Bytes one chip needs: XLA's peak of the step per device (its buffer assignment) times
        the devices sharing a chip."""
        return self.memory["peak"] * self.devices_per_chip

    @property
    def fits(self) -> bool:
        return self.hbm_needed <= self.chip.hbm_bytes

    @property
    def flops_per_chip(self) -> float:
        return self.flops_per_device * self.devices_per_chip

    @property
    def seconds_at_peak(self) -> float:
        """The step's time if the chip ran its matrix units at peak the whole step."""
        return self.flops_per_chip / self.chip.bf16_flops

    @property
    def seconds_at_bandwidth(self) -> float:
        """The step's time if every byte XLA counts moved at the chip's HBM bandwidth."""
        return self.bytes_accessed_per_device * self.devices_per_chip / self.chip.hbm_bytes_per_s

    def lines(self) -> list[str]:
        """The report `rayslice fit` prints."""
        gib = 2**30
        verdict = "fits" if self.fits else "DOES NOT FIT"
        memory = ", ".join(f"{k} {v / gib:.2f}" for k, v in self.memory.items())
        bound = "matrix units" if self.seconds_at_peak >= self.seconds_at_bandwidth else "HBM bandwidth"
        lines = [
            f"topology {self.topology}: {self.chips} chips, {self.devices} "
            f"devices ({self.device_kind}, {self.devices_per_chip} per chip)",
            f"HBM per chip: {self.hbm_needed / gib:.2f} GiB needed of {self.chip.hbm_bytes / gib:.0f} GiB "
            f"({self.hbm_needed / self.chip.hbm_bytes:.0%}): {verdict}",
            f"  per device, GiB: {memory}",
            f"FLOPs per step per chip: {self.flops_per_chip:.4g}; at the bf16 peak "
            f"({self.chip.bf16_flops / 1e12:.0f} TFLOP/s) {self.seconds_at_peak * 1e3:.2f} ms; "
            f"its bytes at HBM bandwidth ({self.chip.hbm_bytes_per_s / 1e9:.0f} GB/s) "
            f"{self.seconds_at_bandwidth * 1e3:.2f} ms: bound by the {bound}",
            "arrays (global shape, dtype, partition spec -> per-device shard):",
        ]
        width = max((len(a.path) for a in self.arrays), default=0)
        for a in self.arrays:
            lines.append(
                f"  {a.role:<3} {a.path:<{width}}  {_dims(a.shape):<14} {a.dtype:<9} {a.spec:<18} -> "
                f"{_dims(a.shard_shape)} ({a.bytes_per_device / 2**20:.1f} MiB)"
            )
        if self.cache_added is not None:
            held = (
                f", {len(self.cache_present)} there already (left as they were)" if self.cache_present else ""
            )
            lines.append(f"compilation cache: {len(self.cache_added)} entries added{held}")
        return lines


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _spec(sharding: Any) -> str:
    spec = getattr(sharding, "spec", None)
    return str(spec) if spec is not None else type(sharding).__name__


def _layouts(role: str, tree: Any, shardings: Any) -> list[ArrayLayout]:
    """One row per leaf of `tree` (abstract arrays) with the matching leaf of `shardings`."""
    import jax
    import numpy as np

    leaves = jax.tree_util.tree_leaves_with_path(tree)
    flat_shardings = jax.tree_util.tree_leaves(shardings)
    rows = []
    for (path, leaf), sharding in zip(leaves, flat_shardings, strict=True):
        shard = tuple(sharding.shard_shape(tuple(leaf.shape)))
        rows.append(
            ArrayLayout(
                role=role,
                path=jax.tree_util.keystr(path) or "[]",
                shape=tuple(leaf.shape),
                dtype=str(leaf.dtype),
                spec=_spec(sharding),
                shard_shape=shard,
                bytes_per_device=math.prod(shard) * np.dtype(leaf.dtype).itemsize,
            )
        )
    return rows


def _describe_args(args: Sequence[Any]) -> str:
    """The arguments' shapes, for an error that says what failed to compile."""
    import jax

    leaves = jax.tree_util.tree_leaves(args)
    shown = ", ".join(f"{getattr(a, 'dtype', '?')}{list(getattr(a, 'shape', ()))}" for a in leaves[:8])
    return shown + (f", ... ({len(leaves)} arrays)" if len(leaves) > 8 else "")


def memory_of(compiled: Any) -> dict[str, int] | None:
    """A compiled step's memory analysis per device, in bytes, by the names `Fit` shows."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return {
        "arguments": analysis.argument_size_in_bytes,
        "outputs": analysis.output_size_in_bytes,
        "aliased": analysis.alias_size_in_bytes,
        "temporaries": analysis.temp_size_in_bytes,
        "code": analysis.generated_code_size_in_bytes,
        "peak": analysis.peak_memory_in_bytes,
    }


def fit(
    job: str, argv: Sequence[str], target: Target, cache: str | None = None, verbose: bool = False
) -> Fit:
    """Compile `job`'s step for the target's chips and read the plan; raises `InvalidInput` when
    the entry point, the topology or the compile fails. With `cache` (a folder or gs:// URL, the
    cluster's compilation cache), the compile goes through `compilation_cache.fill`, so the hosts
    that compile the same step for the same chips find it there and skip compiling. libtpu's own
    lines go to its log folder unless `verbose`."""
    entry = load_entry(job)
    with _as_on_a_tpu_host():
        with _stderr_to_log(verbose):
            devices = topology_devices(target)
        return _compile(job, entry, devices, argv, target, cache, verbose)


def _compile(
    job: str,
    entry: FitEntry,
    devices: list[Any],
    argv: Sequence[str],
    target: Target,
    cache: str | None,
    verbose: bool,
) -> Fit:
    import jax

    from rayslice.compilation_cache.fill import as_on_the_hosts, fill

    try:
        step, args = entry(devices, list(argv))
    except SystemExit:
        raise  # the job's own argument parser refused its arguments, and said why
    except InvalidInput:
        raise  # the job's own one-line refusal (jax_lm's sizes that do not divide the mesh)
    except Exception as exc:  # the job's code: any failure means it cannot lay out this topology
        raise InvalidInput(f"{job}'s {ENTRY_POINT} failed for {target.name}: {_first_line(exc)}") from None
    jitted = step if hasattr(step, "lower") else jax.jit(step)
    name = target.name
    added: tuple[str, ...] | None = None
    present: tuple[str, ...] = ()
    try:
        with as_on_the_hosts():
            lowered = jitted.lower(*args)
        with _stderr_to_log(verbose):
            if cache is None:
                compiled = lowered.compile()
            else:
                filled = fill(lowered, cache)
                compiled, added, present = filled.compiled, filled.added, filled.present
    except Exception as exc:  # XLA's errors come as several types; each is the job's failure here
        # XLA:TPU refuses at compile time a step whose buffers exceed the chip's HBM.
        verdict = "does not fit" if "RESOURCE_EXHAUSTED" in str(exc) else "does not compile for"
        raise InvalidInput(
            f"{job} {verdict} {name}: {_first_line(exc)} (arguments: {_describe_args(args)})"
        ) from None
    memory = memory_of(compiled)
    if memory is None:  # the TPU compiler always gives one; a plugin that does not is no TPU
        raise InvalidInput(f"XLA gave no memory analysis for {job} on {name}")
    costs = compiled.cost_analysis() or {}
    out_tree = jax.eval_shape(jitted, *args)
    arrays = _layouts("in", args, compiled.input_shardings[0]) + _layouts(
        "out", out_tree, compiled.output_shardings
    )
    return Fit(
        topology=target.name,
        chips=target.chips,
        devices=len(devices),
        device_kind=devices[0].device_kind,
        chip=target.chip,
        memory=memory,
        flops_per_device=float(costs.get("flops", 0.0)),
        bytes_accessed_per_device=float(costs.get("bytes accessed", 0.0)),
        arrays=tuple(arrays),
        cache_added=added,
        cache_present=present,
    )


def check(
    job: str, argv: Sequence[str], target: Target, cache: str | None = None, verbose: bool = False
) -> Fit:
    """`fit`, refusing a step that does not fit a chip's HBM (`InvalidInput`, one line)."""
    result = fit(job, argv, target, cache, verbose)
    if not result.fits:
        gib = 2**30
        raise InvalidInput(
            f"{job} does not fit {result.topology}: a chip needs "
            f"{result.hbm_needed / gib:.2f} GiB of HBM, a {target.generation} chip has "
            f"{result.chip.hbm_bytes / gib:.0f} GiB; shard it over more chips, shrink it, or pick a "
            "larger slice"
        )
    return result
