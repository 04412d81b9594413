"""On a real TPU host: the bundled JAX training job's loop (`jax_train.train`) on the host's chips,
with a checkpoint and a resume, as a Ray task runs it there; exits 1 unless it ran on TPU
devices, the loss fell, XLA reported the step's FLOPs and the resume went on from the saved step.

It needs JAX with libtpu, optax and orbax-checkpoint (the jax preset's lock pins them), not Ray:
`train` uses none of it, but its module imports the job's Ray wrappers, so where Ray is not
installed a stand-in for the `ray` module lets it load (nothing calls it; the check says when it
was used). Run from the repository root on the host:

    python3 scripts/tpu_train_check.py [--steps 30]

Results on hardware are recorded in docs/simulated-tpu-runtime.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    stand_in = _stand_in_for_ray()

    import jax

    from rayslice.workloads.jax_train import train

    with tempfile.TemporaryDirectory() as checkpoints:
        half = args.steps // 2
        first = train(steps=half, checkpoint_dir=checkpoints, checkpoint_every=half, progress=print)
        resumed = train(steps=args.steps, checkpoint_dir=checkpoints, checkpoint_every=half, progress=print)
    report = {
        "ray": "stand-in (not installed)" if stand_in else "installed",
        "jax": jax.__version__,
        "devices": first.devices,
        "device_kind": first.device_kind,
        "platform": jax.devices()[0].platform,
        "first_run": {
            "losses": [first.losses[0], first.losses[-1]],
            "steps_per_s": round(first.steps_per_s, 1),
        },
        "resumed_from": resumed.first_step,
        "last_loss": resumed.losses[-1],
        "flops_per_step": resumed.flops_per_step,
        "flops_source": resumed.flops_source,
    }
    print(json.dumps(report, indent=1))
    ok = (
        report["platform"] == "tpu"
        and first.losses[-1] < first.losses[0]
        and resumed.first_step == half
        and resumed.losses[-1] < first.losses[0]
        and resumed.flops_per_step > 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
