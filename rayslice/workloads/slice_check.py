"""Check every chip and link of TPU slices after bring-up; exits 1 when one lags the others.

Per chip: bf16 matmul throughput and HBM bandwidth, each against the catalog's figure for the
chip. Across the slices: all-reduce bandwidth within each slice (ICI) and, with more than one
slice, between slices (DCN), timed on every host. One table per host, a row per chip; then the
links. A chip or a host's link is flagged when it is below `--fraction` of the median of its
kind (default 0.8), or a chip below `--min-of-peak` of the catalog's peak (default 0.5); any flag
ends the job with exit 1, so a platform team can run it after every bring-up:

    rayslice run slice_check [-- --slices N --fraction 0.8 --min-of-peak 0.5]

Sizes come from the device kind: on a TPU chip the catalog knows, 8192^3 matmuls, 1 GiB of HBM
traffic and 256 MiB all-reduces; on other devices (the simulator's CPUs) small ones, reported
without flags: a CPU's figures are no chip's, and CPU devices sharing cores time each other.

`measure_host()` needs no Ray: scripts/tpu_host_check.py runs it in one process on a TPU host.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from rayslice import catalog, names
from rayslice.errors import JobFailed
from rayslice.workloads import _cluster, _jax_hosts

DEFAULT_FRACTION = 0.8
DEFAULT_MIN_OF_PEAK = 0.5
REPEATS = 3  # each figure is the best of this many timed runs, after one that compiles


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much work each measurement does."""

    matmul: int  # n of the n x n x n bf16 products
    matmul_chain: int  # products per timed run
    hbm_bytes: int  # the array read and written per pass
    hbm_passes: int
    allreduce_bytes: int  # per device


CHIP_SIZES = Sizes(matmul=4096, matmul_chain=80, hbm_bytes=2**30, hbm_passes=20, allreduce_bytes=2**28)
SMALL_SIZES = Sizes(matmul=256, matmul_chain=4, hbm_bytes=2**24, hbm_passes=4, allreduce_bytes=2**20)


def sizes_for(device_kind: str) -> Sizes:
    return CHIP_SIZES if catalog.chip_of_device_kind(device_kind) is not None else SMALL_SIZES


def _best_time(fn: Callable[[], Any]) -> float:
    """Seconds of the fastest of `REPEATS` runs of `fn` (which blocks), after one to compile."""
    fn()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_flops(device: Any, size: int, chain: int) -> float:
    """Achieved FLOP/s of a chain of `chain` bf16 size x size products on one device. The factor
    is random and scaled by 1/sqrt(size), so the values stay O(1) through the chain."""
    import jax
    import jax.numpy as jnp

    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.device_put(jax.random.normal(kx, (size, size), jnp.bfloat16), device)
    w = jax.device_put(jax.random.normal(kw, (size, size), jnp.bfloat16) * size**-0.5, device)
    run = jax.jit(lambda x, w: jax.lax.fori_loop(0, chain, lambda _, a: a @ w, x))
    return 2 * size**3 * chain / _best_time(lambda: run(x, w).block_until_ready())


def hbm_bytes_per_s(device: Any, nbytes: int, passes: int) -> float:
    """Achieved HBM bandwidth on one device: `passes` passes that each read and write an array
    of `nbytes` (float32, scaled and shifted so no pass can be skipped)."""
    import jax
    import jax.numpy as jnp

    x = jax.device_put(jnp.ones((nbytes // 4,), jnp.float32), device)
    run = jax.jit(lambda x: jax.lax.fori_loop(0, passes, lambda _, a: a * 0.999 + 0.001, x))
    return 2 * nbytes * passes / _best_time(lambda: run(x).block_until_ready())


def _slice_of(device: Any, hosts_per_slice: int) -> int:
    """Which slice a device is on, by the process numbering `_jax_hosts` gives every host (process
    id = slice id x hosts per slice + worker id). Not the devices' `slice_index`: CPU devices (the
    simulator's) report 0 for every device, whatever slice their host is in."""
    return int(device.process_index) // hosts_per_slice


def allreduce_bytes_per_s(axis: str, hosts_per_slice: int, nbytes: int) -> float:
    """This host's all-reduce bus bandwidth over `axis` of a (dcn, ici) mesh of every device:
    ``ici`` sums within each slice, ``dcn`` across slices. Bus bandwidth counts what each device
    sends and receives in a ring all-reduce, 2 (n - 1) / n x the array, per second."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = sorted(jax.devices(), key=lambda d: (_slice_of(d, hosts_per_slice), d.process_index, d.id))
    slices = len({_slice_of(d, hosts_per_slice) for d in devices})
    mesh = Mesh(np.array(devices).reshape(slices, -1), ("dcn", "ici"))
    n = mesh.shape[axis]
    spec = PartitionSpec("dcn", "ici", None)
    per_device = nbytes // 4
    sharding = NamedSharding(mesh, spec)
    x = jax.make_array_from_callback(
        (slices, len(devices) // slices, per_device),
        sharding,
        lambda index: np.ones((1, 1, per_device), np.float32),
    )
    run = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, axis), mesh=mesh, in_specs=spec, out_specs=spec))
    return 2 * (n - 1) / n * nbytes / _best_time(lambda: run(x).block_until_ready())


@dataclasses.dataclass(frozen=True)
class ChipRow:
    """One chip's figures and the catalog's for its kind (None: not a chip the catalog knows)."""

    device: str
    flops: float
    peak_flops: float | None
    hbm: float
    peak_hbm: float | None


@dataclasses.dataclass(frozen=True)
class HostResult:
    """What one host measured: its chips, and its view of the links (None: not measured)."""

    host: str
    device_kind: str
    chips: tuple[ChipRow, ...]
    ici: float | None
    dcn: float | None


def measure_host(hosts_per_slice: int = 1, host: str = "") -> HostResult:
    """Measure this host's chips one by one, then join the all-reduces every host runs together."""
    import jax

    kind = jax.devices()[0].device_kind
    sizes = sizes_for(kind)
    rows = []
    for device in jax.local_devices():
        coords = getattr(device, "coords", None)
        rows.append(
            ChipRow(
                device=f"{device.id}" + (f" {tuple(coords)}" if coords is not None else ""),
                flops=matmul_flops(device, sizes.matmul, sizes.matmul_chain),
                peak_flops=catalog.device_peak_flops(kind),
                hbm=hbm_bytes_per_s(device, sizes.hbm_bytes, sizes.hbm_passes),
                peak_hbm=catalog.device_hbm_bytes_per_s(kind),
            )
        )
    slices = len({_slice_of(d, hosts_per_slice) for d in jax.devices()})
    per_slice = jax.device_count() // slices
    ici = allreduce_bytes_per_s("ici", hosts_per_slice, sizes.allreduce_bytes) if per_slice > 1 else None
    dcn = allreduce_bytes_per_s("dcn", hosts_per_slice, sizes.allreduce_bytes) if slices > 1 else None
    return HostResult(host or f"process {jax.process_index()}", kind, tuple(rows), ici, dcn)


@dataclasses.dataclass(frozen=True)
class Flag:
    """One figure below its threshold, and why."""

    host: str
    what: str  # "matmul", "hbm", "ici", "dcn"
    device: str
    value: float
    reason: str


@dataclasses.dataclass
class Verdict:
    flags: list[Flag] = dataclasses.field(default_factory=list)
    judged: bool = True  # False: no figure was judged (devices the catalog does not know)


def judge(
    results: Sequence[HostResult],
    fraction: float = DEFAULT_FRACTION,
    min_of_peak: float = DEFAULT_MIN_OF_PEAK,
) -> Verdict:
    """Flag every chip figure and host link below `fraction` of its kind's median over the slices,
    and every chip figure below `min_of_peak` of the catalog's peak. Figures of devices the
    catalog does not know (CPUs) are not judged."""
    known = [r for r in results if catalog.chip_of_device_kind(r.device_kind) is not None]
    verdict = Verdict(judged=bool(known))
    figures: dict[str, list[tuple[str, str, float, float | None]]] = {}
    for r in known:
        for chip in r.chips:
            figures.setdefault("matmul", []).append((r.host, chip.device, chip.flops, chip.peak_flops))
            figures.setdefault("hbm", []).append((r.host, chip.device, chip.hbm, chip.peak_hbm))
        for what, value in (("ici", r.ici), ("dcn", r.dcn)):
            if value is not None:
                figures.setdefault(what, []).append((r.host, "-", value, None))
    for what, rows in figures.items():
        median = statistics.median(v for _, _, v, _ in rows)
        for host, device, value, peak in rows:
            if value < fraction * median:
                reason = f"{value / median:.0%} of the median {_rate(what, median)}"
                verdict.flags.append(Flag(host, what, device, value, reason))
            elif peak is not None and value < min_of_peak * peak:
                reason = f"{value / peak:.0%} of the chip's peak {_rate(what, peak)}"
                verdict.flags.append(Flag(host, what, device, value, reason))
    return verdict


def _rate(what: str, value: float) -> str:
    return f"{value / 1e12:.1f} TFLOP/s" if what == "matmul" else f"{value / 1e9:.1f} GB/s"


def _of(value: float, peak: float | None) -> str:
    return "-" if peak is None else f"{value / peak:.0%}"


def tables(results: Sequence[HostResult], verdict: Verdict) -> list[str]:
    """One table per host (a row per chip), then the links, then the flags."""
    flagged = {(f.host, f.what, f.device) for f in verdict.flags}
    lines = []
    for r in results:
        lines.append(f"host {r.host} ({len(r.chips)} x {r.device_kind})")
        lines.append(
            f"  {'device':<16} {'matmul TFLOP/s':>14} {'of peak':>7} {'HBM GB/s':>9} {'of peak':>7}  flag"
        )
        for c in r.chips:
            marks = [w for w in ("matmul", "hbm") if (r.host, w, c.device) in flagged]
            lines.append(
                f"  {c.device:<16} {c.flops / 1e12:>14.2f} {_of(c.flops, c.peak_flops):>7} "
                f"{c.hbm / 1e9:>9.1f} {_of(c.hbm, c.peak_hbm):>7}  {', '.join(marks) or '-'}"
            )
    lines.append("links (all-reduce bus bandwidth as each host timed it):")
    lines.append(f"  {'host':<16} {'ICI GB/s':>9} {'DCN GB/s':>9}  flag")
    for r in results:
        marks = [w for w in ("ici", "dcn") if (r.host, w, "-") in flagged]
        ici = "-" if r.ici is None else f"{r.ici / 1e9:.3f}"
        dcn = "-" if r.dcn is None else f"{r.dcn / 1e9:.3f}"
        lines.append(f"  {r.host:<16} {ici:>9} {dcn:>9}  {', '.join(marks) or '-'}")
    if not verdict.judged:
        lines.append("not judged: the catalog knows no peak for these devices (CPU figures are no chip's)")
    for f in verdict.flags:
        lines.append(f"FLAGGED {f.host} {f.what} device {f.device}: {_rate(f.what, f.value)}, {f.reason}")
    if verdict.judged and not verdict.flags:
        lines.append("every chip and link within its threshold")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slice_check", description=__doc__.splitlines()[0])
    _cluster.add_slice_args(parser)
    parser.add_argument(
        "--slices", type=int, help="number of slices (default: every complete slice of the chosen type)"
    )
    parser.add_argument(
        "--fraction",
        type=float,
        default=DEFAULT_FRACTION,
        help="flag a figure below this fraction of the median of its kind",
    )
    parser.add_argument(
        "--min-of-peak",
        type=float,
        default=DEFAULT_MIN_OF_PEAK,
        help="flag a chip below this fraction of the catalog's peak",
    )
    parser.add_argument("--coordinator-port", type=int, default=names.JAX_COORDINATOR_PORT)
    return parser


def run(args: argparse.Namespace) -> Verdict:
    slices = _cluster.choose_slices(
        args.slices, slice_name=args.slice_name, accelerator_type=args.accelerator_type
    )
    for tpu_slice in slices:
        print(f"slice {tpu_slice.describe()}", flush=True)
    measure = functools.partial(measure_host, len(slices[0].hosts))
    reports = _jax_hosts.run_on_hosts(
        measure, slices, coordinator_port=args.coordinator_port, timeout_s=args.timeout
    )
    # Each host named by its slice and TPU worker id, as `rayslice local status` shows them.
    results = [dataclasses.replace(r.result, host=f"{r.slice_name}/{r.worker_id}") for r in reports]
    verdict = judge(results, args.fraction, args.min_of_peak)
    print("\n".join(tables(results, verdict)))
    if verdict.flags:
        raise JobFailed(f"{len(verdict.flags)} figure(s) below threshold")
    return verdict


def main(argv: list[str] | None = None) -> int:
    return _cluster.run_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
