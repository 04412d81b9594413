"""jax_lm, the transformer language model, on this machine's CPU: its shapes and sharding on a
mesh of several CPU devices, its loss on the standard library's text, checkpoint and resume, the
sizes it refuses, MaxText's FLOP count and `rayslice fit jax_lm`. Real JAX throughout; its runs
on simulated slices are in tests/integration/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rayslice import cli
from rayslice.errors import EXIT_INVALID, EXIT_OK, InvalidInput
from rayslice.workloads import _lm_data, jax_lm
from tests.workloads.test_workloads import slices_of, v6e_16

REPO = Path(__file__).resolve().parents[2]
# Small enough that a CPU compiles and runs a step in seconds.
TINY = {"d_model": 64, "layers": 1, "heads": 4, "kv_heads": 2, "head_dim": 16, "mlp": 128, "seq": 64}
TINY_ARGS = ["--d-model", "64", "--layers", "1", "--heads", "4", "--kv-heads", "2", "--head-dim", "16"]
TINY_ARGS += ["--mlp", "128", "--seq", "64"]

ON_FOUR_DEVICES = """
import json
import jax
from rayslice.workloads import jax_lm
sizes = jax_lm.sizes_for("cpu", **{tiny})
model = jax_lm.build(jax.devices(), sizes, tensor=2)
params, state = jax_lm.initial_state(model)
report = jax_lm.train(10, tensor=2, progress=lambda line: None, **{tiny})
def laid(a):
    return [str(a.sharding.spec), list(a.addressable_shards[0].data.shape)]
print(json.dumps({{
    "mesh": dict(model.mesh.shape),
    "wq": laid(params["layers"]["wq"]),
    "w_down": laid(params["layers"]["w_down"]),
    "mu_wq": str(state[1][0].mu["layers"]["wq"].sharding.spec),
    "batch": model.global_batch,
    "losses": report.losses,
}}))
"""


def test_the_model_shards_over_fsdp_and_tensor_axes_and_trains_there():
    """Four CPU devices, tensor parallel 2: heads and MLP width split over `tensor`, the model
    dimension over `fsdp`, Adam's moments laid out as their parameters; the loss falls."""
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
    }
    script = ON_FOUR_DEVICES.format(tiny=TINY)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["mesh"] == {"data": 1, "fsdp": 2, "tensor": 2}
    # (layers, d_model, heads, head_dim) = (1, 64, 4, 16), split 2 ways on d_model and on heads.
    assert found["wq"] == ["P(None, 'fsdp', 'tensor', None)", [1, 32, 2, 16]]
    assert found["w_down"] == ["P(None, 'tensor', 'fsdp')", [1, 64, 32]]
    assert found["mu_wq"] == "P(None, 'fsdp', 'tensor', None)"
    assert found["batch"] == 8 * 2  # 8 sequences per data-parallel device, 2 of them (fsdp)
    losses = found["losses"]
    assert sum(losses[-3:]) / 3 < losses[0] - 0.5, losses


def test_the_loss_falls_on_the_standard_librarys_text_and_resumes_from_a_checkpoint(tmp_path):
    lines: list[str] = []
    first = jax_lm.train(4, checkpoint_dir=str(tmp_path), checkpoint_every=2, progress=lines.append, **TINY)
    assert first.first_step == 0 and len(first.losses) == 4
    assert lines[0].startswith("step   0  loss ") and "(compiling)" in lines[0]
    assert "tokens/s" in lines[1]
    resumed = jax_lm.train(8, checkpoint_dir=str(tmp_path), progress=lines.append, **TINY)
    assert "resumed from step 4" in lines
    assert resumed.first_step == 4 and len(resumed.losses) == 4
    # The curve goes on from where it stopped, rather than from a fresh model's loss.
    assert resumed.losses[0] < first.losses[0] - 0.3
    assert resumed.losses[-1] < first.losses[0] - 0.5
    assert "tokens/s" in resumed.summary() and "loss" in resumed.summary()


def test_the_text_is_the_standard_librarys_and_batches_depend_on_seed_and_step_only():
    text = _lm_data.corpus()
    assert 2**20 < len(text) <= _lm_data.CORPUS_BYTES
    assert b"def " in text[:200_000].tobytes()  # Python source, as bytes
    a = _lm_data.batch(text, 0, 5, rows=3, length=16)
    assert a.shape == (3, 17) and a.dtype == np.int32 and a.max() < _lm_data.VOCAB
    assert (a == _lm_data.batch(text, 0, 5, rows=3, length=16)).all()
    assert not (a == _lm_data.batch(text, 0, 6, rows=3, length=16)).all()


def test_maxtexts_flop_count_by_hand():
    sizes = jax_lm.sizes_for(
        "cpu", d_model=8, layers=2, heads=2, kv_heads=1, head_dim=4, mlp=16, seq=10, batch_per_device=1
    )
    batch, tokens = 3, 30
    qkv = 2 * tokens * 8 * (2 + 2 * 1) * 4  # q: 2 heads, k and v: 1 head each, of 4
    out = 2 * tokens * 8 * 2 * 4
    mlp = 2 * tokens * 8 * 16 * 3
    unembed = 2 * tokens * 8 * 256
    attention = 4 * batch * 10**2 * 2 * 4 / 2  # causal: half of QK^T and AV
    expected = 3 * ((qkv + out + mlp) * 2 + unembed) + 3 * attention * 2
    assert jax_lm.flops_per_step(sizes, batch) == expected
    # 6 x weights x tokens is the same count without attention (and without the input embedding,
    # a lookup): the weights of the matrices that multiply.
    matmul_weights = 2 * sizes.weights_per_layer + 8 * 256
    assert expected - 3 * attention * 2 == 6 * matmul_weights * tokens


@pytest.mark.parametrize(
    ("sizes", "layout", "batch", "message"),
    [
        (
            {"heads": 6, "kv_heads": 6},
            (1, 1, 4),
            8,
            "6 heads do not divide over the tensor-parallel degree 4",
        ),
        (
            {"heads": 8, "kv_heads": 2},
            (1, 1, 4),
            8,
            "2 kv heads do not divide over the tensor-parallel degree 4",
        ),
        ({}, (2, 4, 1), 12, "batch 12 does not divide over the data-parallel degree 8"),
        ({"heads": 6, "kv_heads": 4}, (1, 1, 1), 8, "6 heads do not divide into groups of 4 kv heads"),
    ],
)
def test_sizes_that_do_not_divide_the_mesh_are_named_with_both_numbers(sizes, layout, batch, message):
    with pytest.raises(InvalidInput, match=message):
        jax_lm.check_sizes(jax_lm.sizes_for("cpu", **sizes), jax_lm.Layout(*layout), batch)


def test_the_driver_refuses_what_does_not_divide_before_any_host_starts():
    slices = slices_of(v6e_16("a"))  # 16 chips
    args = jax_lm.build_parser().parse_args(["--tensor-parallel", "4", "--heads", "6"])
    with pytest.raises(InvalidInput, match="6 heads do not divide over the tensor-parallel degree 4"):
        jax_lm.check_on_slices(args, slices)
    args = jax_lm.build_parser().parse_args(["--tensor-parallel", "3"])
    with pytest.raises(InvalidInput, match="--tensor-parallel 3 does not divide a slice's 16 devices"):
        jax_lm.check_on_slices(args, slices)
    args = jax_lm.build_parser().parse_args(["--tensor-parallel", "2", "--batch", "12"])
    with pytest.raises(InvalidInput, match="batch 12 does not divide over the data-parallel degree 8"):
        jax_lm.check_on_slices(args, slices)


def test_a_tpu_chip_gets_the_large_size_and_a_cpu_the_small_one():
    chip = jax_lm.sizes_for("TPU v5 lite")
    assert (chip.d_model, chip.layers, chip.seq, chip.remat) == (2048, 8, 2048, "dots")
    assert 0.3e9 < chip.parameters < 0.4e9
    assert jax_lm.sizes_for("cpu") == jax_lm.SMALL
    assert jax_lm.sizes_for("TPU v5 lite", layers=4).layers == 4


def test_fit_compiles_jax_lm_with_splash_attention_for_a_v5e_slice(capsys):
    """`rayslice fit jax_lm`: the step as a 2x2 v5e slice compiles it (Pallas' splash attention
    included), sharded over fsdp, before any slice exists; and a size that does not divide is one
    line and exit 2."""
    argv = ["fit", "jax_lm", "--topology", "v5e:2x2", "--", *TINY_ARGS, "--seq", "512", "--head-dim", "128"]
    assert cli.main(argv) == EXIT_OK
    out = capsys.readouterr().out
    assert "topology v5e:2x2: 4 chips, 4 devices" in out and ": fits" in out
    assert "P(None, 'fsdp', 'tensor', None)" in out  # wq, over the 4 chips' fsdp axis
    bad = [
        "fit",
        "jax_lm",
        "--topology",
        "v5e:2x2",
        "--",
        *TINY_ARGS,
        "--tensor-parallel",
        "4",
        "--heads",
        "6",
    ]
    assert cli.main(bad) == EXIT_INVALID
    err = capsys.readouterr().err.strip().splitlines()
    refusal = (
        "6 heads do not divide over the tensor-parallel degree 4: pick a --tensor-parallel that divides 6"
    )
    assert err == [f"rayslice: {refusal}"]


def test_a_hosts_refusal_reaches_the_user_as_one_line(monkeypatch, capsys):
    """A size that passes the driver's checks but not a host's (its HBM, found when the step
    compiles there) comes back through Ray wrapped in the task's traceback: the job prints the
    host's one line and exits 2, as `rayslice fit` would have."""
    import ray.exceptions

    from rayslice.errors import EXIT_INVALID
    from rayslice.workloads import _cluster, _jax_hosts

    refusal = InvalidInput("jax_lm at 9000M parameters does not fit a TPU v5 lite's HBM: shrink it")
    wrapped = ray.exceptions.RayTaskError("_host_task", "Traceback (most recent call last):\n  ...", refusal)
    monkeypatch.setattr(_cluster, "connect", lambda: None)
    monkeypatch.setattr(_cluster, "choose_slices", lambda *a, **k: slices_of(v6e_16("a")))
    monkeypatch.setattr(_cluster, "Progress", lambda: None)

    def fail(*args, **kwargs):
        raise wrapped.as_instanceof_cause()

    monkeypatch.setattr(_jax_hosts, "run_on_hosts", fail)
    assert jax_lm.main(["--steps", "3"]) == EXIT_INVALID
    assert capsys.readouterr().err.splitlines() == [f"error: {refusal}"]
