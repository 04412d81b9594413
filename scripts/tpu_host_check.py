"""On a real TPU host, in one go: what rayslice predicts and runs there, against the chips.

1. devices: how the host shows its chips (/dev/accel* or VFIO groups) against the catalog's
   `chip_devices`, the fact the simulated TPU runtime copies;
2. fit: `rayslice fit`'s compile of jax_train's step for this host's topology, done in a child
   process on the CPU (libtpu's compile-only devices, as on a deployer's machine), against the
   same step compiled on the chips, and the chips' measured `peak_bytes_in_use` after training;
3. train: jax_train at the sizes it picks for the chip (and any `--also` sizes): MFU against the
   catalog's peak and the loss; then a checkpoint and a resume at small sizes;
4. slice_check's table for the host's chips (matmul and HBM against the catalog's peaks).

It needs JAX with libtpu, optax and orbax-checkpoint, not Ray: the workloads' modules import
Ray's wrappers, so where Ray is absent an inert stand-in for the `ray` module lets them load
(nothing calls it; the report says when it was used). From the repository root on the host:

    python3 scripts/tpu_host_check.py [--steps 30] [--also 8192x4x16384 ...] [--out report.json]

Exits 1 unless every check holds: the devices as the catalog says, fit's memory analysis equal
to the chips' own, the measured peak under it, jax_train at >= 50 % of peak with a falling loss,
the resume going on from the saved step, slice_check flagging nothing and its matmul >= 90 % of
peak. Results on hardware are recorded in docs/benchmarks.md and docs/fit.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rayslice import catalog  # noqa: E402 - after the checkout is on the path

RUNTIME = REPO / "rayslice/local/host/tpu_runtime/site/rayslice_simulated_tpu.py"
MIN_TRAIN_OF_PEAK = 0.5
MIN_MATMUL_OF_PEAK = 0.9
MEMORY_FIELDS = ("arguments", "outputs", "aliased", "temporaries", "peak")


def _stand_in_for_ray() -> bool:
    """Install an inert `ray` (decorators return the function) when Ray is absent; True if so."""
    if importlib.util.find_spec("ray") is not None:
        return False
    modules = {name: types.ModuleType(name) for name in ("ray", "ray.util", "ray.util.queue", "ray.util.tpu")}
    modules["ray.util.scheduling_strategies"] = types.ModuleType("ray.util.scheduling_strategies")
    modules["ray"].remote = lambda *args, **kwargs: args[0] if args and callable(args[0]) else (lambda f: f)  # type: ignore[attr-defined]
    modules["ray"].util = modules["ray.util"]  # type: ignore[attr-defined]
    modules["ray.util"].tpu = modules["ray.util.tpu"]  # type: ignore[attr-defined]
    modules["ray.util.queue"].Queue = object  # type: ignore[attr-defined]
    modules["ray.util.scheduling_strategies"].NodeAffinitySchedulingStrategy = object  # type: ignore[attr-defined]
    sys.modules.update(modules)
    return True


# ---- 1. devices ---------------------------------------------------------------------------------


def _runtime() -> Any:
    spec = importlib.util.spec_from_file_location("rayslice_simulated_tpu", RUNTIME)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def devices_check(generation: catalog.Generation) -> dict[str, Any]:
    """The host's /dev/accel* files and VFIO groups (with each group's PCI vendor and device)
    against what the catalog says this generation's hosts show."""
    try:
        vfio = sorted(os.listdir("/dev/vfio"))
    except OSError:
        vfio = []
    groups = {}
    for group in (e for e in vfio if e.isdigit()):
        folder = Path("/sys/kernel/iommu_groups") / group / "devices"
        functions = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        groups[group] = {f: {k: _read(folder / f / k) for k in ("vendor", "device")} for f in functions}
    accel = sorted(p for p in glob.glob("/dev/accel*") if not os.path.isdir(p))
    runtime = _runtime()
    google = [g for g in groups if runtime._google_group(f"/sys/kernel/iommu_groups/{g}/devices")]
    shows = "accel" if accel else "vfio" if google else "none"
    os.environ.setdefault(runtime.DEVICES_PER_CHIP_VAR, str(generation.devices_per_chip))
    return {
        "observed": {"accel": accel, "vfio": vfio, "groups": groups},
        "shows": shows,
        "catalog_says": generation.chip_devices,
        "runtime_counts_chips": runtime.host_chips(),
        "ok": shows == generation.chip_devices,
    }


# ---- 2. fit ---------------------------------------------------------------------------------------


def fit_in_child(topology: str, job_args: list[str]) -> dict[str, Any]:
    """`rayslice fit`'s figures, computed in a child process kept off the chips (JAX on its CPU,
    the TPU only as libtpu's compile-only devices), as on a deployer's machine."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    child = [sys.executable, __file__, "--fit-only", topology, "--", *job_args]
    done = subprocess.run(child, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"fit failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def fit_only(topology: str, job_args: list[str]) -> None:
    from rayslice.fit import plan

    found = plan.fit("jax_train", job_args, plan.Target.parse(topology))
    print("\n".join(found.lines()[:4]), file=sys.stderr)
    print(json.dumps({"memory": found.memory, "flops_per_device": found.flops_per_device}))


def chip_compile(job_args: list[str]) -> dict[str, int]:
    """The same step compiled on the attached chips, through the same entry point."""
    import jax

    from rayslice.fit.plan import memory_of
    from rayslice.workloads import jax_train

    step, args = jax_train.fit_step(jax.devices(), job_args)
    memory = memory_of(step.lower(*args).compile())
    assert memory is not None  # XLA:TPU always analyses a step's memory
    return memory


# ---- 3. train -------------------------------------------------------------------------------------


def train_figures(report: Any) -> dict[str, Any]:
    peak = report.peak_flops
    return {
        "sizes": dataclasses.asdict(report.sizes),
        "learning_rate": report.sizes.learning_rate,
        "steps_per_s": round(report.steps_per_s, 3),
        "tflops": round(report.flops_per_s / 1e12, 2),
        "of_peak": None if peak is None else round(report.flops_per_s / peak, 4),
        "loss_first": report.losses[0],
        "loss_last": report.losses[-1],
        "loss_min": min(report.losses),
    }


def resume_check(steps: int) -> dict[str, Any]:
    """jax_train's checkpoint and resume (orbax), at small sizes."""
    from rayslice.workloads.jax_train import train

    half = steps // 2
    small = functools.partial(
        train, batch_per_device=32, hidden=256, layers=1, checkpoint_every=half, progress=lambda line: None
    )
    with tempfile.TemporaryDirectory() as checkpoints:
        first = small(steps=half, checkpoint_dir=checkpoints)
        resumed = small(steps=steps, checkpoint_dir=checkpoints)
    return {
        "resumed_from": resumed.first_step,
        "loss_first": first.losses[0],
        "loss_last": resumed.losses[-1],
        "ok": resumed.first_step == half and resumed.losses[-1] < first.losses[0],
    }


def default_topology() -> str | None:
    """``v5e:2x2`` for TPU_ACCELERATOR_TYPE=v5litepod-4 (set on TPU VMs and GKE TPU nodes)."""
    accelerator = os.environ.get("TPU_ACCELERATOR_TYPE")
    if not accelerator:
        return None
    tpu = catalog.lookup(accelerator)
    chip = catalog.chip(tpu.generation)
    return None if chip is None else f"{chip.topology_prefix}:{tpu.topology}"


def plan_target(topology: str) -> Any:
    from rayslice.fit import plan

    return plan.Target.parse(topology)


def _sizes(text: str) -> tuple[int, int, int, float | None]:
    """``HIDDENxLAYERSxBATCH`` with an optional ``@LEARNING_RATE``."""
    shape, _, lr = text.partition("@")
    hidden, layers, batch = (int(x) for x in shape.split("x"))
    return hidden, layers, batch, float(lr) if lr else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--also",
        type=_sizes,
        action="append",
        default=[],
        metavar="HIDDENxLAYERSxBATCH[@LR]",
        help="also train at these sizes (repeatable), e.g. 8192x4x16384 or 8192x4x8192@1e-5",
    )
    parser.add_argument(
        "--topology",
        default=default_topology(),
        help="this host's topology as libtpu names it (default: from TPU_ACCELERATOR_TYPE)",
    )
    parser.add_argument("--out", type=Path, help="write the report here as JSON too")
    parser.add_argument("--fit-only", metavar="TOPOLOGY", help=argparse.SUPPRESS)
    parser.add_argument("job_args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    stand_in = _stand_in_for_ray()
    if args.fit_only:
        fit_only(args.fit_only, args.job_args)
        return 0
    if args.topology is None:
        parser.error("no TPU_ACCELERATOR_TYPE on this host: pass --topology (v5e:1x1 for one v5e chip)")

    # Before this process opens the chips: the child compiles on the CPU with libtpu alone.
    import jax

    from rayslice.workloads import slice_check
    from rayslice.workloads.jax_train import train

    report: dict[str, Any] = {"ray": "stand-in (not installed)" if stand_in else "installed"}
    target = plan_target(args.topology)
    report["devices"] = devices_check(catalog.generation(target.generation))
    # Before this process opens the chips (one process at a time may hold them).
    try:
        report["fit"] = fit_in_child(args.topology, [])
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
        report["fit"] = {"child_error": str(exc)[-1500:]}
    report["fit"]["topology"] = args.topology

    report["jax"] = jax.__version__
    report["device_kind"] = jax.devices()[0].device_kind
    report["device_count"] = jax.device_count()
    report["chip_compile"] = chip_compile([])
    if "memory" not in report["fit"]:  # the child could not: compile-only beside the open chips
        from rayslice.fit import plan

        report["fit"]["memory"] = plan.fit("jax_train", [], target).memory
        report["fit"]["where"] = "in the process holding the chips"
    same = {f: report["fit"]["memory"][f] == report["chip_compile"][f] for f in MEMORY_FIELDS}
    report["fit_equals_chip_compile"] = same

    trained = train(args.steps)
    stats = jax.devices()[0].memory_stats() or {}
    report["train"] = train_figures(trained)
    report["peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
    report["bytes_limit"] = stats.get("bytes_limit")
    report["also"] = [
        train_figures(
            train(args.steps, batch, hidden, layers=layers, learning_rate=lr, progress=lambda line: None)
        )
        for hidden, layers, batch, lr in args.also
    ]
    report["resume"] = resume_check(args.steps)

    measured = slice_check.measure_host(1, os.uname().nodename)
    verdict = slice_check.judge([measured])
    table = slice_check.tables([measured], verdict)
    print("\n".join(table))
    matmul_of_peak = [c.flops / c.peak_flops for c in measured.chips if c.peak_flops]
    hbm_of_peak = [c.hbm / c.peak_hbm for c in measured.chips if c.peak_hbm]
    report["slice_check"] = {
        "table": table,
        "matmul_of_peak": [round(x, 4) for x in matmul_of_peak],
        "hbm_of_peak": [round(x, 4) for x in hbm_of_peak],
        "flags": len(verdict.flags),
    }
    train_of_peak = report["train"]["of_peak"] or 0.0
    report["checks"] = {
        "devices": report["devices"]["ok"],
        "fit_equals_chip_compile": all(same.values()),
        "measured_peak_under_fit": 0 < (report["peak_bytes_in_use"] or 0) <= report["fit"]["memory"]["peak"],
        "train_of_peak_at_least_50pct": train_of_peak >= MIN_TRAIN_OF_PEAK,
        "train_loss_falls": report["train"]["loss_last"] < report["train"]["loss_first"],
        "resume": report["resume"]["ok"],
        "slice_check_no_flags": verdict.flags == [],
        "matmul_at_least_90pct": bool(matmul_of_peak) and min(matmul_of_peak) >= MIN_MATMUL_OF_PEAK,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
