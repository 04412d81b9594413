"""`rayslice validate` on the inputs the open issues name: exit 2, and a message that says what to do."""

from __future__ import annotations

import pytest

from rayslice import cli
from tests.rayslice.test_spec import ALIAS_BOMB


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        # Compute Engine does not offer v5e: name the platforms that do.
        (
            ["platform=compute", "acceleratorType=v5litepod-16", "zone=us-south1-a"],
            ["v5litepod is not available on compute", "offered on: tpu-vm, gke"],
        ),
        # Credentials in the index URL: say which key carries them instead.
        (
            ["packageIndex=https://user:pw@example.com/simple", "zone=us-east5-a"],
            ["credentials in its URL", "packageIndexCredentialsSecret"],
        ),
        # Plain http: say how to opt in.
        (["packageIndex=http://example.com/simple", "zone=us-east5-a"], ["allowInsecurePackageIndex=true"]),
        # Two halves of the address space are the whole internet.
        (
            ['dashboardSourceRanges=["0.0.0.0/1", "128.0.0.0/1"]', "zone=us-east5-a"],
            ["whole address space"],
        ),
        # The Jobs API without auth on a public range is remote code execution.
        (
            ['dashboardSourceRanges=["34.1.2.0/24"]', "rayAuth=none", "zone=us-east5-a"],
            ["remote code execution", "rayAuth=token"],
        ),
        # A head VM of a family the zone lacks.
        (
            ["slices=2", "headMachineType=n1-standard-16", "zone=us-east5-a"],
            ["not offered in zone us-east5-a", "n2"],
        ),
        # Spot with the head on a slice and recovery on.
        (["capacity=spot", "head=slice", "zone=us-east5-a"], ["use head=vm", "recovery=false"]),
        # Hostile values (issue 20): named, no traceback.
        (["name=ray\n", "zone=us-east5-a"], ["name must be printable text", "U+000A"]),
        (["slices=\u0662", "zone=us-east5-a"], ["slices must be a whole number written in ASCII digits"]),
        (['requirements=["optax; python_version < \\"3.1\\n2\\""]', "zone=us-east5-a"], ["requirements"]),
        (["packageIndex=https://idx.example/simple?token=t", "zone=us-east5-a"], ["query or fragment"]),
        # Public ranges wider than a team's networks, together: say how to force them.
        (
            ['dashboardSourceRanges=["34.0.0.0/8", "35.0.0.0/8"]', "zone=us-east5-a"],
            ["more than a /8", "allowWideDashboardRanges=true"],
        ),
    ],
)
def test_validate_refuses_with_the_fix(capsys, overrides, fragments):
    args = ["validate"]
    for pair in overrides:
        args += ["--set", pair]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err, err
    assert "Traceback" not in err


def test_wide_dashboard_ranges_pass_when_forced(capsys):
    ranges = 'dashboardSourceRanges=["34.0.0.0/8", "35.0.0.0/8"]'
    args = ["validate", "--set", ranges, "--set", "zone=us-east5-a", "--set", "allowWideDashboardRanges=true"]
    assert cli.main(args) == 0, capsys.readouterr().err


def test_validate_refuses_a_stack_file_alias_bomb(tmp_path, capsys):
    path = tmp_path / "Pulumi.bomb.yaml"
    path.write_text(ALIAS_BOMB + "\n")
    assert cli.main(["validate", "--stack-file", str(path), "--set", "zone=us-east5-a"]) == 2
    err = capsys.readouterr().err
    assert "aliases (*name) expand it to more than" in err and "Traceback" not in err


def test_validate_accepts_the_compute_default(capsys):
    assert cli.main(["validate", "--set", "acceleratorType=v6e-16", "--set", "zone=us-east5-a"]) == 0
    assert "on compute in us-east5-a" in capsys.readouterr().out
