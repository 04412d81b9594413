"""`rayslice preview` as click wires it: options, help, formats and exit codes."""

from __future__ import annotations

from pathlib import Path

from rayslice import catalog, cli
from rayslice.errors import EXIT_INVALID

STACKS = Path(__file__).resolve().parents[2] / "infra"  # the project\'s example stacks


def test_help_lists_the_options_and_formats(capsys):
    assert cli.main(["preview", "--help"]) == 0
    out = capsys.readouterr().out
    for text in ("--stack-file", "--set", "--output", "json", "tree", "yaml", "replace"):
        assert text in out, text


def test_unknown_output_format_is_refused(capsys):
    code = cli.main(["preview", "--stack-file", str(STACKS / "Pulumi.example-v6e-4.yaml"), "--output", "xml"])
    assert code == EXIT_INVALID
    assert "xml" in capsys.readouterr().err


def test_yaml_output_on_compute_names_the_alternatives(capsys):
    code = cli.main(
        ["preview", "--stack-file", str(STACKS / "Pulumi.example-compute-v6e-16.yaml"), "--output", "yaml"]
    )
    captured = capsys.readouterr()
    assert code == EXIT_INVALID
    assert "--output tree or json" in captured.err and captured.out == ""


def test_every_problem_is_reported_before_the_program_runs(capsys):
    code = cli.main(["preview", "--set", "acceleratorType=v6e-3", "--set", "slices=0"])
    captured = capsys.readouterr()
    assert code == EXIT_INVALID
    assert "v6e-3" in captured.err and "slices" in captured.err
    assert captured.out == ""


def test_preview_of_the_queued_example_shows_the_request_and_its_price(capsys):
    """Issue 21's acceptance for tpu-vm: the queued example's request (a Spot queued resource with
    its deadline) and the slice's price per hour: 16 v6e chips at us-east5's Spot rate."""
    stack = str(STACKS / "Pulumi.example-tpu-vm-queued-v6e-16.yaml")
    assert cli.main(["preview", "--stack-file", stack]) == 0
    out = capsys.readouterr().out
    assert "dynamic.tpu.QueuedResource  jax-queued-v6e-16-tpu-vm-slice-0-request" in out
    assert 'queueingPolicy: {"validUntilDuration": "86400s"}' in out and "spot: {}" in out
    assert "gcp.tpu.V2Vm" not in out and "replaced, not updated, when any input changes" in out
    [line] = [line for line in out.splitlines() if "slice jax-queued-v6e-16-slice-0" in line]
    per_chip = catalog.chip_hour_price("v6e", "us-east5", "spot")
    assert per_chip is not None and "spot (queued)" in line
    assert f"${16 * per_chip:,.2f}/h" in line


def test_flex_start_with_the_head_on_the_slice_exits_2_before_anything_is_declared(capsys):
    stack = str(STACKS / "Pulumi.example-compute-flex-v6e-16.yaml")
    code = cli.main(["preview", "--stack-file", stack, "--set", "head=slice"])
    captured = capsys.readouterr()
    assert code == EXIT_INVALID
    assert "head=slice with capacity=flex-start" in captured.err and "use head=vm" in captured.err
    assert "gcp.compute.ResizeRequest" not in captured.out
