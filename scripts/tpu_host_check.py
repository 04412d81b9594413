"""On a real TPU host, in one go: what rayslice predicts and runs there, against the chips.

1. devices: how the host shows its chips (/dev/accel* or VFIO groups) against the catalog's
   `chip_devices`, the fact the simulated TPU runtime copies;
2. fit: `rayslice fit`'s compile of jax_train's and jax_lm's steps for this host's topology,
   done in a child process on the CPU (libtpu's compile-only devices, as on a deployer's
   machine), against the same steps compiled on the chips, and the chips' measured
   `peak_bytes_in_use` after training;
3. cache: `rayslice fit jax_lm --fill-cache` in a child process, and from folders filled on other
   machines (`--cache-from`, e.g. a deployer's without a TPU), then the chip's own compile of the
   same step with the cache there, which must be a hit; each part of JAX's cache key
   (jax/_src/cache_key.py) is recorded on both sides, so a miss names the parts that differ;
4. train: jax_lm (the transformer) and jax_train at the sizes they pick for the chip (and any
   `--lm-also`/`--also` sizes): MFU against the catalog's peak and the loss; then a checkpoint
   and a resume of each at small sizes;
5. slice_check's table for the host's chips (matmul and HBM against the catalog's peaks).

It needs JAX with libtpu, optax and orbax-checkpoint, not Ray: the workloads' modules import
Ray's wrappers, so where Ray is absent an inert stand-in for the `ray` module lets them load
(nothing calls it; the report says when it was used). From the repository root on the host:

    python3 scripts/tpu_host_check.py [--steps 30] [--cache-from DIR ...] [--out report.json]

A deployer's folder for `--cache-from` (this script on a machine without a TPU, recording the
key's parts beside the entry):

    python3 scripts/tpu_host_check.py --topology v5e:1x1 --fill-only DIR -- ARGS > out
    tail -1 out > DIR/fill.json

Exits 1 unless every check holds: the devices as the catalog says, fit's memory analysis equal
to the chips' own, the measured peak under it, jax_lm and jax_train at >= 50 % of peak with a
falling loss, the resumes going on from the saved step, the entries filled elsewhere hitting
on the chip, slice_check flagging nothing and its matmul >= 90 % of peak. Results on hardware
are recorded in docs/benchmarks.md and docs/fit.md.
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


def fit_only(topology: str, job_args: list[str], job: str = "jax_train") -> None:
    from rayslice.fit import plan

    found = plan.fit(job, job_args, plan.Target.parse(topology))
    print("\n".join(found.lines()[:4]), file=sys.stderr)
    print(json.dumps({"memory": found.memory, "flops_per_device": found.flops_per_device}))


def chip_compile(job_args: list[str], job: str = "jax_train") -> dict[str, int]:
    """The same step compiled on the attached chips, through the same entry point."""
    import jax

    from rayslice.fit.plan import load_entry, memory_of

    step, args = load_entry(job)(jax.devices(), job_args)
    memory = memory_of(step.lower(*args).compile())
    assert memory is not None  # XLA:TPU always analyses a step's memory
    return memory


# ---- jax_lm: the language model --------------------------------------------------------------------

# The cache-key check compiles jax_lm at this size (splash attention included): a few seconds.
KEY_CHECK_ARGS = ["--d-model", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--mlp", "768",
                  "--seq", "512", "--batch-per-device", "4"]  # fmt: skip
# What JAX puts in a persistent cache key, each by the function of jax/_src/cache_key.py that
# hashes it (jax 0.10.2).
KEY_PARTS = {
    "computation": "_hash_computation",
    "backend version": "_hash_platform",
    "XLA flags": "_hash_xla_flags",
    "compile options": "_hash_serialized_compile_options",
    "accelerator config": "_hash_accelerator_config",
}


def recording_key_parts() -> dict[str, Any]:
    """Record, for every cache key JAX computes from now on, the bytes each part hashes and the
    key itself; and JAX's own hit/miss lines. Returns the (growing) record."""
    import logging

    from jax._src import cache_key

    record: dict[str, Any] = {"parts": {}, "keys": [], "log": []}

    class Tee:
        def __init__(self, real: Any, name: str) -> None:
            self.real, self.name = real, name

        def update(self, data: bytes) -> None:
            self.real.update(data)
            record["parts"].setdefault(self.name, b"")
            record["parts"][self.name] += bytes(data)

    for part, function in KEY_PARTS.items():
        original = getattr(cache_key, function)

        def recorded(
            hash_obj: Any, *args: Any, _original: Any = original, _part: str = part, **kwargs: Any
        ) -> Any:
            return _original(Tee(hash_obj, _part), *args, **kwargs)

        setattr(cache_key, function, recorded)
    original_get = cache_key.get

    def get(*args: Any, **kwargs: Any) -> str:
        record["parts"].clear()
        key = original_get(*args, **kwargs)
        record["keys"].append(key)
        return key

    cache_key.get = get

    class Lines(logging.Handler):
        def emit(self, entry: logging.LogRecord) -> None:
            text = entry.getMessage()
            if "PERSISTENT COMPILATION CACHE" in text.upper() or "cache hit" in text.lower():
                record["log"].append(text[:300])

    for name in ("jax._src.compiler", "jax._src.compilation_cache"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False  # the lines go to the record, not to whatever root prints
        logger.addHandler(Lines())
    return record


def key_summary(record: dict[str, Any]) -> dict[str, Any]:
    """The record as JSON: the last key, each part's sha256 and length, and short texts."""
    import hashlib

    parts = {
        name: {"sha256": hashlib.sha256(data).hexdigest()[:16], "bytes": len(data)}
        for name, data in record["parts"].items()
    }
    platform = record["parts"].get("backend version", b"")
    return {
        "key": record["keys"][-1] if record["keys"] else None,
        "parts": parts,
        "backend_version": platform.decode("utf-8", "replace")[:300],
        "xla_flags": record["parts"].get("XLA flags", b"").decode("utf-8", "replace")[:500],
        "compile_options_hex": record["parts"].get("compile options", b"").hex(),
        "log": record["log"][-6:],
    }


def fill_in_child(topology: str, location: str, env: dict[str, str]) -> dict[str, Any]:
    """`rayslice fit jax_lm --fill-cache LOCATION` (at `KEY_CHECK_ARGS`) in a child with `env`."""
    child = [sys.executable, __file__, "--topology", topology, "--fill-only", location, "--", *KEY_CHECK_ARGS]
    child += ["--attention", "reference"]
    done = subprocess.run(child, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"fill failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def fill_only(location: str, topology: str, job_args: list[str]) -> None:
    from rayslice.fit import plan

    record = recording_key_parts()
    found = plan.fit("jax_lm", job_args, plan.Target.parse(topology), cache=location)
    summary = {"added": found.cache_added, "args": job_args}
    print(json.dumps({**summary, **key_summary(record)}))


def deployer_env() -> dict[str, str]:
    """This environment as a deployer's machine has it: no TPU, no TPU_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "MEGASCALE_", "LIBTPU"))}
    return dict(env, JAX_PLATFORMS="cpu")


def cache_hit_check(topology: str, locations: dict[str, str]) -> dict[str, Any]:
    """Each location's entry (filled elsewhere), then the chip's own compile of the same step
    with the cache there: hit or miss, and which key parts differ."""
    import jax

    from rayslice.compilation_cache.fill import entries, hosts_cache_at
    from rayslice.workloads import jax_lm

    results: dict[str, Any] = {}
    record = recording_key_parts()
    for label, location in locations.items():
        filled = (
            json.loads(Path(location, "fill.json").read_text())
            if Path(location, "fill.json").exists()
            else None
        )
        step, args = jax_lm.fit_step(jax.devices(), filled["args"] if filled else KEY_CHECK_ARGS)
        record["log"].clear()
        before = entries(location)
        jax.clear_caches()
        with hosts_cache_at(location):
            step.lower(*args).compile()
        chip_added = sorted(entries(location) - before)
        summary = key_summary(record)
        differs = (
            sorted(p for p in summary["parts"] if summary["parts"][p] != filled["parts"].get(p))
            if filled
            else None
        )
        results[label] = {
            "filled_key": filled and filled["key"],
            "chip_key": summary["key"],
            "hit": filled is not None and not chip_added and summary["key"] == filled["key"],
            "chip_added": chip_added,
            "parts_that_differ": differs,
            "filled": filled,
            "chip": summary,
        }
        print(json.dumps({label: {k: v for k, v in results[label].items() if k not in ("filled", "chip")}}))
    return results


def lm_fit_in_child(topology: str, job_args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    child = [sys.executable, __file__, "--fit-only", topology, "--job", "jax_lm", "--", *job_args]
    done = subprocess.run(child, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"fit failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def lm_figures(report: Any) -> dict[str, Any]:
    return {
        "sizes": dataclasses.asdict(report.sizes),
        "parameters": report.sizes.parameters,
        "global_batch": report.global_batch,
        "ms_per_step": round(report.step_seconds * 1e3, 2),
        "tokens_per_s": round(report.tokens_per_s),
        "mfu": None if report.mfu is None else round(report.mfu, 4),
        "maxtext_tflop_per_step": round(report.flops_per_step / 1e12, 3),
        "losses": [round(x, 4) for x in report.losses],
    }


def _lm_sizes(text: str) -> dict[str, Any]:
    """``name=value,...`` of jax_lm's `Sizes` fields, batch and attention (remat=full,batch=16)."""
    given: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        given[name] = (
            value if name in ("remat", "attention") else float(value) if name == "lr" else int(value)
        )
    return given


def lm_resume_check(steps: int) -> dict[str, Any]:
    """jax_lm's checkpoint and resume (orbax) at small sizes."""
    from rayslice.workloads import jax_lm

    half = steps // 2
    small = functools.partial(
        jax_lm.train, d_model=256, layers=2, heads=4, kv_heads=2, mlp=768, seq=512,
        checkpoint_every=half, progress=lambda line: None,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as checkpoints:
        first = small(half, checkpoint_dir=checkpoints)
        resumed = small(steps, checkpoint_dir=checkpoints)
    return {
        "resumed_from": resumed.first_step,
        "loss_first": first.losses[0],
        "loss_last": resumed.losses[-1],
        "ok": resumed.first_step == half and resumed.losses[-1] < first.losses[0],
    }


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
        help="also train jax_train at these sizes (repeatable), e.g. 8192x4x16384 or 8192x4x8192@1e-5",
    )
    parser.add_argument(
        "--lm-also",
        type=_lm_sizes,
        action="append",
        default=[],
        metavar="FIELD=VALUE,...",
        help="also train jax_lm at these sizes (repeatable), e.g. remat=full,batch_per_device=16",
    )
    parser.add_argument("--skip-jax-train", action="store_true", help="only jax_lm and the cache checks")
    parser.add_argument("--skip-lm-fit", action="store_true", help="no fit of jax_lm at its chip size")
    parser.add_argument("--lm-fit-json", help="jax_lm's fit figures from an earlier run, instead of fitting")
    parser.add_argument("--cache-only", action="store_true", help="stop after the cache checks")
    parser.add_argument("--deployer-child", action="store_true", help="also fill from a child without TPU_*")
    parser.add_argument(
        "--cache-from",
        action="append",
        default=[],
        metavar="DIR",
        help="a cache folder `rayslice fit jax_lm --fill-cache` filled on another machine (repeatable)",
    )
    parser.add_argument(
        "--topology",
        default=default_topology(),
        help="this host's topology as libtpu names it (default: from TPU_ACCELERATOR_TYPE)",
    )
    parser.add_argument("--out", type=Path, help="write the report here as JSON too")
    parser.add_argument("--fit-only", metavar="TOPOLOGY", help=argparse.SUPPRESS)
    parser.add_argument("--fill-only", metavar="LOCATION", help=argparse.SUPPRESS)
    parser.add_argument("--job", default="jax_train", help=argparse.SUPPRESS)
    parser.add_argument("job_args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    stand_in = _stand_in_for_ray()
    if args.fit_only:
        fit_only(args.fit_only, args.job_args, args.job)
        return 0
    if args.topology is None:
        parser.error("no TPU_ACCELERATOR_TYPE on this host: pass --topology (v5e:1x1 for one v5e chip)")
    if args.fill_only:
        fill_only(args.fill_only, args.topology, args.job_args)
        return 0

    report: dict[str, Any] = {"ray": "stand-in (not installed)" if stand_in else "installed"}
    report["env"] = {
        k: v for k, v in os.environ.items() if k.startswith(("TPU", "MEGASCALE", "LIBTPU", "XLA", "JAX"))
    }
    target = plan_target(args.topology)
    report["devices"] = devices_check(catalog.generation(target.generation))
    checks: dict[str, bool] = {"devices": report["devices"]["ok"]}
    # Before this process opens the chips (one process at a time may hold them): the children
    # compile on the CPU with libtpu's compile-only devices, as a deployer's machine does.
    if not args.skip_jax_train:
        try:
            report["fit"] = fit_in_child(args.topology, [])
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            report["fit"] = {"child_error": str(exc)[-1500:]}
        report["fit"]["topology"] = args.topology
    if args.lm_fit_json:
        report["lm_fit"] = json.loads(args.lm_fit_json)
    elif not args.skip_lm_fit:
        try:
            report["lm_fit"] = lm_fit_in_child(args.topology, [])
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            report["lm_fit"] = {"child_error": str(exc)[-1500:]}
        print(json.dumps({"lm_fit": report["lm_fit"]}), flush=True)
    caches = {label: f"/tmp/rayslice-cache-{label}" for label in ("deployer_env", "host_env")}
    locations = dict(caches, **{f"carried_{i}": d for i, d in enumerate(args.cache_from)})
    report["fill"] = {}
    children = [("host_env", dict(os.environ, JAX_PLATFORMS="cpu"))]
    if args.deployer_child:  # libtpu without TPU_* variables may wait on the metadata server
        children.append(("deployer_env", deployer_env()))
    for label, env in children:
        try:
            filled = fill_in_child(args.topology, caches[label], env)
            Path(caches[label], "fill.json").write_text(json.dumps(filled))
            report["fill"][label] = {k: v for k, v in filled.items() if k != "compile_options_hex"}
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            report["fill"][label] = {"child_error": str(exc)[-1500:]}
    print(json.dumps({"fill": report["fill"]}), flush=True)

    import jax

    from rayslice.workloads import jax_lm, slice_check
    from rayslice.workloads.jax_train import train

    report["jax"] = jax.__version__
    report["device_kind"] = jax.devices()[0].device_kind
    report["device_count"] = jax.device_count()
    report["cache"] = cache_hit_check(args.topology, {k: v for k, v in locations.items() if Path(v).is_dir()})
    # An entry filled without a TPU (a deployer's machine, or a child here without TPU_*) is a hit
    # on the chip, Pallas kernels (jax_lm's splash attention) included.
    elsewhere = {k: v for k, v in report["cache"].items() if k != "host_env" and v["filled"]}
    checks["deployer_entries_are_chip_hits"] = bool(elsewhere) and all(v["hit"] for v in elsewhere.values())

    if args.cache_only:
        report["checks"] = checks
        print(json.dumps(checks, indent=1))
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
        return 0 if all(checks.values()) else 1
    if "memory" in report.get("lm_fit", {}):
        report["lm_chip_compile"] = chip_compile([], "jax_lm")
        same = {f: report["lm_fit"]["memory"][f] == report["lm_chip_compile"][f] for f in MEMORY_FIELDS}
        report["lm_fit_equals_chip_compile"] = same
        checks["lm_fit_equals_chip_compile"] = all(same.values())
    lm = jax_lm.train(args.steps)
    print(lm.summary(), flush=True)
    stats = jax.devices()[0].memory_stats() or {}
    report["lm"] = lm_figures(lm)
    report["lm_peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
    checks["lm_mfu_at_least_50pct"] = (lm.mfu or 0.0) >= MIN_TRAIN_OF_PEAK
    checks["lm_loss_falls"] = lm.losses[-1] < lm.losses[0]
    if "memory" in report.get("lm_fit", {}):
        checks["lm_measured_peak_under_fit"] = (
            0 < (report["lm_peak_bytes_in_use"] or 0) <= report["lm_fit"]["memory"]["peak"]
        )
    report["lm_also"] = []
    for given in args.lm_also:
        extra = {k: given.pop(k) for k in ("batch", "attention") if k in given}
        try:
            done = jax_lm.train(args.steps, progress=lambda line: None, **extra, **given)
            report["lm_also"].append({"asked": {**given, **extra}, **lm_figures(done)})
        except Exception as exc:  # a size that does not fit is a result here, not the end
            report["lm_also"].append({"asked": {**given, **extra}, "error": str(exc).splitlines()[0][:300]})
        print(json.dumps(report["lm_also"][-1]), flush=True)
    report["lm_resume"] = lm_resume_check(12)
    checks["lm_resume"] = report["lm_resume"]["ok"]

    if not args.skip_jax_train:
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
        checks.update(
            {
                "fit_equals_chip_compile": all(same.values()),
                "measured_peak_under_fit": 0
                < (report["peak_bytes_in_use"] or 0)
                <= report["fit"]["memory"]["peak"],
                "train_of_peak_at_least_50pct": train_of_peak >= MIN_TRAIN_OF_PEAK,
                "train_loss_falls": report["train"]["loss_last"] < report["train"]["loss_first"],
                "resume": report["resume"]["ok"],
                "slice_check_no_flags": verdict.flags == [],
                "matmul_at_least_90pct": bool(matmul_of_peak) and min(matmul_of_peak) >= MIN_MATMUL_OF_PEAK,
            }
        )
    report["checks"] = checks
    text = json.dumps(report, indent=1)
    print(json.dumps(checks, indent=1))
    if args.out:
        args.out.write_text(text)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
