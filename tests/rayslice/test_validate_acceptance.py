"""`rayslice validate` on the inputs the open issues name: exit 2, and a message that says what to do."""

from __future__ import annotations

import pytest

from rayslice import cli


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


def test_validate_accepts_the_compute_default(capsys):
    assert cli.main(["validate", "--set", "acceleratorType=v6e-16", "--set", "zone=us-east5-a"]) == 0
    assert "on compute in us-east5-a" in capsys.readouterr().out
