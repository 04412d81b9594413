"""`rayslice preview`: the offline tree of what `pulumi up` would create."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rayslice import cli, preview
from rayslice.infra.mocks import run_offline
from rayslice.infra.program import main

ROOT = Path(__file__).resolve().parents[1]

# (example, V2Vm count, accelerator type, runtime, head VM machine type or None)
EXAMPLES = [
    ("Pulumi.example-v6e-4.yaml", 1, "v6e-4", "v2-alpha-tpuv6e", None),
    ("Pulumi.example-v6e-16.yaml", 1, "v6e-16", "v2-alpha-tpuv6e", None),
    ("Pulumi.example-v5p-16-xla.yaml", 1, "v5p-16", "v2-alpha-tpuv5", None),
    ("Pulumi.example-multislice.yaml", 2, "v6e-16", "v2-alpha-tpuv6e", "n1-standard-16"),
]


def _resource_lines(text: str, display_type: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(rf"(^|── ){re.escape(display_type)}  ", line)]


@pytest.mark.parametrize("name, slices, accelerator, runtime, head_machine", EXAMPLES)
def test_preview_of_each_example(capsys, name, slices, accelerator, runtime, head_machine):
    assert cli.main(["preview", "--stack-file", str(ROOT / name)]) == 0
    out = capsys.readouterr().out
    assert len(_resource_lines(out, "gcp.tpu.V2Vm")) == slices
    assert out.count(f'acceleratorType: "{accelerator}"') == slices
    assert out.count(f'runtimeVersion: "{runtime}"') == slices
    for kind in ("gcp.compute.Network", "gcp.compute.Subnetwork", "gcp.compute.RouterNat",
                 "gcp.serviceaccount.Account", "gcp.secretmanager.Secret"):
        assert len(_resource_lines(out, kind)) == 1, kind
    assert len(_resource_lines(out, "gcp.compute.Firewall")) >= 2
    assert len(_resource_lines(out, "gcp.compute.Instance")) == (1 if head_machine else 0)
    if head_machine:
        assert f'machineType: "{head_machine}"' in out
    assert 'secretData: "[secret]"' in out
    assert "startup-script\": \"<" in out  # the script is summarised, not dumped


def test_multislice_tree_nests_resources_under_components(capsys):
    cli.main(["preview", "--stack-file", str(ROOT / "Pulumi.example-multislice.yaml")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "rayslice.infra.TpuRayCluster  jax-multislice"
    head = lines.index("├── rayslice.infra.HeadVm  jax-multislice-head")
    assert lines[head + 1] == "│   └── gcp.compute.Instance  jax-multislice-head-instance"


def test_set_overrides_the_stack_file(capsys):
    cli.main(["preview", "--stack-file", str(ROOT / "Pulumi.example-v6e-4.yaml"), "--set", "capacity=spot",
              "--set", "rayslice:acceleratorType=v6e-8"])
    out = capsys.readouterr().out
    assert 'schedulingConfig: {"spot": true}' in out
    assert 'acceleratorType: "v6e-8"' in out


def test_invalid_config_fails_with_the_spec_message(capsys):
    code = cli.main(["preview", "--set", "acceleratorType=v6e-3", "--set", "zone=us-east5-b"])
    captured = capsys.readouterr()
    assert code == cli.EXIT_INVALID
    assert "unknown accelerator type 'v6e-3'" in captured.err and "closest valid types" in captured.err
    assert captured.out == ""


def test_json_output_masks_the_token(capsys):
    cli.main(["preview", "--stack-file", str(ROOT / "Pulumi.example-v6e-4.yaml"), "--output", "json"])
    resources = json.loads(capsys.readouterr().out)
    (version,) = [r for r in resources if r["type"] == "gcp:secretmanager/secretVersion:SecretVersion"]
    assert version["inputs"]["secretData"] == preview.SECRET_SHOWN


def test_rendered_tree_never_shows_the_token():
    run = run_offline(main, preview.stack_config(str(ROOT / "Pulumi.example-v6e-16.yaml"), []))
    assert run.fake.token not in preview.render_tree(run.registrations)
    assert run.fake.token not in preview.render_json(run.registrations)


def test_stack_config_stringifies_like_pulumi(tmp_path):
    stack = tmp_path / "Pulumi.t.yaml"
    stack.write_text("config:\n  gcp:zone: us-east5-b\n  rayslice:externalIps: true\n"
                     "  rayslice:slices: 2\n  rayslice:labels: {team: ml}\n")
    assert preview.stack_config(str(stack), ["requirements=[\"optax\"]"]) == {
        "rayslice:zone": "us-east5-b", "rayslice:externalIps": "true", "rayslice:slices": "2",
        "rayslice:labels": '{"team": "ml"}', "rayslice:requirements": '["optax"]',
    }


@pytest.mark.parametrize("token, shown", [
    ("gcp:tpu/v2Vm:V2Vm", "gcp.tpu.V2Vm"),
    ("gcp:compute/routerNat:RouterNat", "gcp.compute.RouterNat"),
    ("random:index/randomPassword:RandomPassword", "random.RandomPassword"),
    ("rayslice:infra:TpuSlice", "rayslice.infra.TpuSlice"),
    ("kubernetes:ray.io/v1:RayCluster", "kubernetes.ray.io/v1.RayCluster"),
])
def test_display_type(token, shown):
    assert preview.display_type(token) == shown
