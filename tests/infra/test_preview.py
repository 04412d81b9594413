"""`rayslice preview`: the offline tree of what `pulumi up` would create."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pulumi_gcp as gcp
import pytest
import yaml

from rayslice import cli
from rayslice.infra import preview
from rayslice.infra.gke import kuberay
from rayslice.infra.mocks import run_offline
from rayslice.infra.program import main

STACKS = Path(__file__).resolve().parents[2] / "infra"  # the project\'s example stacks

# (example, V2Vm count, accelerator config as printed, runtime, head VM machine type or None)
EXAMPLES = [
    ("Pulumi.example-v6e-4.yaml", 1, '{"topology": "2x2", "type": "V6E"}', "v2-alpha-tpuv6e", None),
    (
        "Pulumi.example-v6e-16.yaml",
        1,
        '{"topology": "4x4", "type": "V6E"}',
        "v2-alpha-tpuv6e",
        "n2-standard-16",
    ),
    ("Pulumi.example-v5p-16-xla.yaml", 1, '{"topology": "2x2x2", "type": "V5P"}', "v2-alpha-tpuv5", None),
    (
        "Pulumi.example-multislice.yaml",
        2,
        '{"topology": "4x4", "type": "V6E"}',
        "v2-alpha-tpuv6e",
        "n2-standard-16",
    ),
]


def _resource_lines(text: str, display_type: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(rf"(^|── ){re.escape(display_type)}  ", line)]


@pytest.mark.parametrize("name, slices, accelerator, runtime, head_machine", EXAMPLES)
def test_preview_of_each_example(capsys, name, slices, accelerator, runtime, head_machine):
    assert cli.main(["preview", "--stack-file", str(STACKS / name)]) == 0
    out = capsys.readouterr().out
    assert len(_resource_lines(out, "gcp.tpu.V2Vm")) == slices
    assert out.count(f"acceleratorConfig: {accelerator}") == slices
    assert out.count(f'runtimeVersion: "{runtime}"') == slices
    for kind in (
        "gcp.compute.Network",
        "gcp.compute.Subnetwork",
        "gcp.compute.RouterNat",
        "gcp.secretmanager.Secret",
    ):
        assert len(_resource_lines(out, kind)) == 1, kind
    # The hosts' account, and the recovery controller's own (these clusters run one, on its VM).
    assert len(_resource_lines(out, "gcp.serviceaccount.Account")) == (2 if head_machine else 1)
    assert len(_resource_lines(out, "gcp.compute.Firewall")) >= 2
    assert len(_resource_lines(out, "gcp.compute.Instance")) == (2 if head_machine else 0)
    if head_machine:
        assert f'machineType: "{head_machine}"' in out
    assert 'secretData: "[secret]"' in out
    assert 'startup-script": "<' in out  # the script is summarised, not dumped
    # A config change replaces the slices instead of patching metadata running hosts ignore.
    assert out.count("(replaced, not updated, when any of these inputs change: metadata)") == slices + (
        2 if head_machine else 0  # the head VM and the controller VM
    )
    assert out.count("(timeouts: create 60m, delete 30m)") == slices


def _tree_resources(text: str) -> list[tuple[str, dict]]:
    """(display type, inputs) of every resource in a printed tree, in order."""
    found: list[tuple[str, dict]] = []
    for line in text.splitlines():
        if " cloud resources in " in line:
            break  # the tree's summary: costs and the capacity cell follow
        if resource := re.search(r"(?:^|── )(\S+)  \S+$", line):
            found.append((resource[1], {}))
        elif (value := re.match(r"^[│ ]*(\w+): (.*)$", line)) and found:
            found[-1][1][value[1]] = json.loads(value[2])
    return found


def test_preview_of_the_gke_example(capsys):
    assert cli.main(["preview", "--stack-file", str(STACKS / "Pulumi.example-gke-v6e-16.yaml")]) == 0
    resources = _tree_resources(capsys.readouterr().out)
    kinds = Counter(kind for kind, _ in resources)
    for kind in ("gcp.container.Cluster", "kubernetes.helm.sh/v3.Release", "kubernetes.ray.io/v1.RayCluster"):
        assert kinds[kind] == 1, kind
    pools = [inputs for kind, inputs in resources if kind == "gcp.container.NodePool"]
    tpu_pools = [p for p in pools if p["nodeConfig"]["machineType"].startswith("ct")]
    assert [(p["nodeConfig"]["machineType"], p["nodeCount"], p["placementPolicy"]) for p in tpu_pools] == [
        ("ct6e-standard-4t", 4, {"type": "COMPACT", "tpuTopology": "4x4"})
    ]
    [release] = [inputs for kind, inputs in resources if kind == "kubernetes.helm.sh/v3.Release"]
    assert (release["chart"], release["version"]) == ("kuberay-operator", kuberay.KUBERAY_VERSION)


# (example, TPU hosts in all slices, worker groups' (replicas, numOfHosts)), written out by hand.
GKE_EXAMPLES = [
    ("Pulumi.example-gke-v6e-16.yaml", 4, [(1, 4)]),
    ("Pulumi.example-gke-multislice.yaml", 8, [(2, 4)]),
]


@pytest.mark.parametrize("name, hosts, groups", GKE_EXAMPLES)
def test_yaml_output_is_what_kubectl_applies(capsys, name, hosts, groups, crd_validator):
    path = str(STACKS / name)
    assert cli.main(["preview", "--stack-file", path, "--output", "yaml"]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = Counter(d["kind"] for d in documents)
    assert (kinds["ConfigMap"], kinds["Service"], kinds["RayCluster"]) == (1, hosts, 1)
    # apply order: the namespace first, then what the pods use, the RayCluster last
    assert [d["kind"] for d in documents[:3]] == ["Namespace", "ServiceAccount", "ConfigMap"]
    assert documents[-1]["kind"] == "RayCluster"
    assert not [d for d in documents if "chart" in d]  # no Helm release
    ray_cluster = documents[-1]
    worker_groups = ray_cluster["spec"]["workerGroupSpecs"]
    assert sorted((g["replicas"], g["numOfHosts"]) for g in worker_groups) == groups
    errors = sorted(crd_validator.iter_errors(ray_cluster), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    [volume] = ray_cluster["spec"]["headGroupSpec"]["template"]["spec"]["volumes"]
    assert type(volume["configMap"]["defaultMode"]) is int  # not the engine's float
    assert type(ray_cluster["spec"]["workerGroupSpecs"][0]["numOfHosts"]) is int


def test_yaml_output_on_tpu_vm_is_an_error(capsys):
    code = cli.main(
        ["preview", "--stack-file", str(STACKS / "Pulumi.example-v6e-4.yaml"), "--output", "yaml"]
    )
    captured = capsys.readouterr()
    assert code == cli.EXIT_INVALID
    assert "platform=gke" in captured.err and "--output tree" in captured.err
    assert captured.out == ""


def test_multislice_tree_nests_resources_under_components(capsys):
    cli.main(["preview", "--stack-file", str(STACKS / "Pulumi.example-multislice.yaml")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "rayslice.infra.TpuRayCluster  jax-multislice"
    assert "└── rayslice.infra.TpuVmCluster  jax-multislice-tpu-vm" in lines
    head = lines.index("    ├── rayslice.infra.HeadVm  jax-multislice-tpu-vm-head")
    assert lines[head + 1] == "    │   └── gcp.compute.Instance  jax-multislice-tpu-vm-head-instance"


def test_set_overrides_the_stack_file(capsys):
    cli.main(
        [
            "preview",
            "--stack-file",
            str(STACKS / "Pulumi.example-v6e-4.yaml"),
            "--set",
            "capacity=spot",
            "--set",
            "rayslice:acceleratorType=v6e-8",
        ]
    )
    out = capsys.readouterr().out
    assert 'schedulingConfig: {"spot": true}' in out
    assert 'acceleratorConfig: {"topology": "2x4", "type": "V6E"}' in out


def test_invalid_config_fails_with_the_spec_message(capsys):
    code = cli.main(["preview", "--set", "acceleratorType=v6e-3", "--set", "zone=us-east5-b"])
    captured = capsys.readouterr()
    assert code == cli.EXIT_INVALID
    assert "unknown accelerator type 'v6e-3'" in captured.err and "closest valid types" in captured.err
    assert captured.out == ""


def test_json_output_masks_the_token(capsys):
    cli.main(["preview", "--stack-file", str(STACKS / "Pulumi.example-v6e-4.yaml"), "--output", "json"])
    resources = json.loads(capsys.readouterr().out)
    (version,) = [r for r in resources if r["type"] == "gcp:secretmanager/secretVersion:SecretVersion"]
    assert version["inputs"]["secretData"] == preview.SECRET_SHOWN


def test_rendered_tree_never_shows_the_token():
    run = run_offline(main, preview.stack_config(str(STACKS / "Pulumi.example-v6e-16.yaml"), []))
    assert run.fake.token not in preview.render_tree(run.registrations)
    assert run.fake.token not in preview.render_json(run.registrations)


def test_stack_config_stringifies_like_pulumi(tmp_path):
    stack = tmp_path / "Pulumi.t.yaml"
    stack.write_text(
        "config:\n  gcp:zone: us-east5-b\n  rayslice:externalIps: true\n"
        "  rayslice:slices: 2\n  rayslice:labels: {team: ml}\n"
    )
    assert preview.stack_config(str(stack), ['requirements=["optax"]']) == {
        "rayslice:zone": "us-east5-b",
        "rayslice:externalIps": "true",
        "rayslice:slices": "2",
        "rayslice:labels": '{"team": "ml"}',
        "rayslice:requirements": '["optax"]',
    }


@pytest.mark.parametrize(
    "token, shown",
    [
        ("gcp:tpu/v2Vm:V2Vm", "gcp.tpu.V2Vm"),
        ("gcp:compute/routerNat:RouterNat", "gcp.compute.RouterNat"),
        ("random:index/randomPassword:RandomPassword", "random.RandomPassword"),
        ("rayslice:infra:TpuVmSlice", "rayslice.infra.TpuVmSlice"),
        ("gcp:compute/instanceGroupManager:InstanceGroupManager", "gcp.compute.InstanceGroupManager"),
        ("kubernetes:ray.io/v1:RayCluster", "kubernetes.ray.io/v1.RayCluster"),
    ],
)
def test_display_type(token, shown):
    assert preview.display_type(token) == shown


def _bulk_spot_program(_locks: object = None) -> None:
    """A hand-written bad stack, as a user's own Pulumi program would declare it: a v6e-16 MIG in
    bulk mode whose template is Spot (issue 19, defect 2). It stands in for `program.main`, so it
    takes (and ignores) the stack's lock source as main does."""
    policy = gcp.compute.ResourcePolicy(
        "s-0-policy",
        name="s-0-policy",
        region="us-east5",
        workload_policy=gcp.compute.ResourcePolicyWorkloadPolicyArgs(
            type="HIGH_THROUGHPUT", accelerator_topology="4x4"
        ),
    )
    template = gcp.compute.InstanceTemplate(
        "s-0-template",
        name_prefix="s-0-",
        machine_type="ct6e-standard-4t",
        disks=[gcp.compute.InstanceTemplateDiskArgs(boot=True, disk_type="hyperdisk-balanced")],
        scheduling=gcp.compute.InstanceTemplateSchedulingArgs(
            provisioning_model="SPOT", instance_termination_action="STOP"
        ),
    )
    gcp.compute.InstanceGroupManager(
        "s-0-mig",
        name="s-0",
        zone="us-east5-b",
        base_instance_name="s-0",
        target_size=4,
        versions=[gcp.compute.InstanceGroupManagerVersionArgs(instance_template=template.self_link_unique)],
        target_size_policies=[gcp.compute.InstanceGroupManagerTargetSizePolicyArgs(mode="BULK")],
        instance_lifecycle_policy=gcp.compute.InstanceGroupManagerInstanceLifecyclePolicyArgs(
            default_action_on_failure="DO_NOTHING"
        ),
        resource_policies=gcp.compute.InstanceGroupManagerResourcePoliciesArgs(
            workload_policy=policy.self_link
        ),
    )


def test_a_hand_written_bulk_spot_stack_shows_its_violations(capsys, monkeypatch):
    """Issue 19: BULK with a SPOT template. The twin refuses the MIG's insert, and the command
    prints that refusal beside the MIG and on stderr, with its rule and source."""
    monkeypatch.setattr(preview, "main", _bulk_spot_program)
    args = ["preview", "--set", "acceleratorType=v6e-16", "--set", "zone=us-east5-b", "--output", "json"]
    assert cli.main(args) == 2  # EXIT_INVALID: Google would refuse it, nothing was created
    captured = capsys.readouterr()
    resources = json.loads(captured.out)
    (mig,) = [r for r in resources if r["name"] == "s-0-mig"]
    assert [v["rule"] for v in mig["violations"]] == ["bulk-provisioning-model"]
    assert all("https://" in v["source"] for v in mig["violations"])
    assert all(not r["violations"] for r in resources if r["name"] != "s-0-mig")
    assert (
        "s-0-mig: target-size policy BULK with template s-0-template of provisioning model SPOT"
        in captured.err
    )
    assert "rule bulk-provisioning-model; source: Compute Engine, 'Create a MIG that uses the bulk mode'" in (
        captured.err
    )
    assert "1 violation(s) of Google's documented rules" in captured.err


def test_the_exit_2_report_is_the_twins_refusals_and_audit(capsys, monkeypatch):
    """One runner: what `rayslice preview` prints is what the cloud twin refused and found at the
    end, not a second check of its own (a twin that refuses nothing passes)."""
    monkeypatch.setattr(preview.CloudTwin, "violations", lambda self: [])
    monkeypatch.setattr(preview, "main", _bulk_spot_program)
    args = ["preview", "--set", "acceleratorType=v6e-16", "--set", "zone=us-east5-b", "--output", "json"]
    assert cli.main(args) == 0
    assert all(not r["violations"] for r in json.loads(capsys.readouterr().out))


def test_every_example_passes_every_rule(capsys):
    names = sorted(p.name for p in STACKS.glob("Pulumi.example-*.yaml"))
    assert {e[0] for e in EXAMPLES} | {"Pulumi.example-compute-v6e-16.yaml"} <= set(names)
    for name in names:
        assert cli.main(["preview", "--stack-file", str(STACKS / name), "--output", "json"]) == 0, name
        assert all(not r["violations"] for r in json.loads(capsys.readouterr().out)), name


def test_preview_ends_with_the_stacks_capacity_cell(capsys):
    """The tree's last lines: the stack's cell of the capacity table (how its slices are made,
    who repairs them, what the controller does), as `validate` prints it."""
    stack = str(Path(__file__).resolve().parents[2] / "infra" / "Pulumi.example-v6e-16.yaml")
    assert cli.main(["preview", "--stack-file", stack]) == 0
    out = capsys.readouterr().out
    tail = out[out.index("capacity tpu-vm/spot:") :]
    assert "slices made by: nodes.create" in tail
    assert "repaired: not by Google: rayslice's recovery controller recreates the slice whole" in tail
    assert "on spot-preemption, host-maintenance, host-error, slice-gone: the controller recreates" in tail


def test_preview_names_every_grant_on_a_bucket_or_secret_the_stack_does_not_declare(capsys):
    """A stack that names someone else's bucket or secret extends every job's account to it:
    the preview says so, grant by grant, with its condition; the stack's own bucket is not listed."""
    base = ["preview", "--set", "acceleratorType=v6e-4", "--set", "zone=us-east5-b"]
    assert cli.main(base) == 0
    assert "does not declare" not in capsys.readouterr().out  # its own record bucket only
    foreign = ["--set", "recordBucket=acme-terraform-state", "--set", "allowForeignRecordBucket=true"]
    foreign += [
        "--set",
        "packageIndexCredentialsSecret=corp-pypi",
        "--set",
        "allowForeignPackageIndexSecret=true",
    ]
    assert cli.main([*base, *foreign, "--set", "packageIndex=https://pypi.corp.example/simple"]) == 0
    out = capsys.readouterr().out
    section = out.split("grants on resources this stack does not declare", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip() for line in section.strip().splitlines()[1:]]
    assert len(lines) == 2
    assert lines[0].startswith("roles/secretmanager.secretAccessor on gcp.secretmanager.Secret corp-pypi to ")
    assert lines[1].startswith("roles/storage.objectCreator on gcp.storage.Bucket acme-terraform-state to ")
    assert (
        'if resource.name.startsWith("projects/_/buckets/acme-terraform-state/objects/clusters/' in lines[1]
    )
