"""The example stacks run under Pulumi's mocks: what each would create, and that it is safe.

Expected values are written out by hand (counts, types, topologies, machine types), never
derived from the code under test.
"""

from __future__ import annotations

import functools
import ipaddress
import json
from collections import Counter
from pathlib import Path

import pytest

from rayslice import spec
from rayslice.infra import preview
from rayslice.infra.firewall import IAP_SOURCE_RANGE
from rayslice.infra.mocks import run_offline
from rayslice.infra.program import main
from rayslice.names import ATTR_HEAD_ADDRESS, ATTR_ROLE, ATTR_TOKEN_SECRET
from rayslice.startup_scripts import METADATA_VALUE_LIMIT

STACKS = Path(__file__).resolve().parents[2] / "infra"  # the project\'s example stacks

V2VM = "gcp:tpu/v2Vm:V2Vm"
INSTANCE = "gcp:compute/instance:Instance"
FIREWALL = "gcp:compute/firewall:Firewall"
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
MIG = "gcp:compute/instanceGroupManager:InstanceGroupManager"
POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"
PER_INSTANCE = "gcp:compute/perInstanceConfig:PerInstanceConfig"
ADDRESS = "gcp:compute/address:Address"
SLEEP = "time:index/sleep:Sleep"
RESIZE_REQUEST = "gcp:compute/resizeRequest:ResizeRequest"

# Written out by hand (not derived from the code under test): what each example must create.
COMMON = {
    "gcp:compute/network:Network": 1,
    "gcp:compute/subnetwork:Subnetwork": 1,
    "gcp:compute/router:Router": 1,
    "gcp:compute/routerNat:RouterNat": 1,
    "gcp:serviceaccount/account:Account": 1,
    "gcp:projects/iAMMember:IAMMember": 2,
    "random:index/randomPassword:RandomPassword": 1,
    "gcp:secretmanager/secret:Secret": 1,
    "gcp:secretmanager/secretVersion:SecretVersion": 1,
    "gcp:secretmanager/secretIamMember:SecretIamMember": 1,
    SLEEP: 1,
}
# With a head VM the recovery controller runs (recovery defaults to true), on its own VM, as its
# own account: that account, acting as the hosts' account, and one custom role and binding per
# part of the controller's role (1 on tpu-vm, 2 on compute); nothing else (no log, metric or
# secret grant). The VM itself and its two deny rules (IPv4, IPv6) are counted in each example
# (INSTANCE, FIREWALL).
CUSTOM_ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"
CONTROLLER_ROLE = "controller-vm"


def _controller_identity(role_parts: int) -> dict[str, int]:
    return {
        "gcp:serviceaccount/account:Account": 2,
        "gcp:projects/iAMMember:IAMMember": 2 + role_parts,
        "gcp:serviceaccount/iAMMember:IAMMember": 1,
        "random:index/randomId:RandomId": 1,
        CUSTOM_ROLE: role_parts,
    }


def _compute(hosts: int, slices: int = 1) -> dict[str, int]:
    return {
        POLICY: slices,
        TEMPLATE: slices,
        MIG: slices,
        PER_INSTANCE: hosts * slices,
        ADDRESS: hosts * slices,
    }


EXAMPLES = {
    "Pulumi.example-v6e-4.yaml": dict(
        counts={**COMMON, V2VM: 1, FIREWALL: 2},
        accelerator={"type": "V6E", "topology": "2x2"},
        runtime="v2-alpha-tpuv6e",
        scheduling=None,
        hosts=1,
        head_vm=False,
    ),
    "Pulumi.example-v6e-16.yaml": dict(
        # Instances: the head VM and the controller VM; firewall: internal, IAP, controller deny
        # (IPv4 and IPv6).
        counts={**COMMON, **_controller_identity(1), V2VM: 1, FIREWALL: 4, INSTANCE: 2},
        accelerator={"type": "V6E", "topology": "4x4"},
        runtime="v2-alpha-tpuv6e",
        scheduling={"spot": True},
        hosts=4,
        head_vm=True,  # spot slices never hold the head
    ),
    "Pulumi.example-v5p-16-xla.yaml": dict(
        counts={**COMMON, V2VM: 1, FIREWALL: 2},
        accelerator={"type": "V5P", "topology": "2x2x2"},
        runtime="v2-alpha-tpuv5",
        scheduling=None,
        hosts=2,
        head_vm=False,
    ),
    "Pulumi.example-multislice.yaml": dict(
        counts={**COMMON, **_controller_identity(1), V2VM: 2, FIREWALL: 5, INSTANCE: 2},
        accelerator={"type": "V6E", "topology": "4x4"},
        runtime="v2-alpha-tpuv6e",
        scheduling={"reserved": True},
        hosts=4,
        head_vm=True,
    ),
    "Pulumi.example-compute-v6e-16.yaml": dict(
        counts={**COMMON, **_controller_identity(2), **_compute(4), FIREWALL: 4, INSTANCE: 2},
        machine_type="ct6e-standard-4t",
        topology="4x4",
        provisioning="SPOT",
        hosts=4,
        head_vm=True,
    ),
    "Pulumi.example-compute-elastic-v6e-16.yaml": dict(
        # Both slices' MIGs, templates, policies and addresses, and no per-instance config: the
        # controller adds and removes the hosts (docs/elastic.md). A third controller role reads
        # the head VM's guest attributes (Ray's demand).
        counts={
            **COMMON,
            **_controller_identity(3),
            **_compute(4, 2),
            PER_INSTANCE: 0,
            FIREWALL: 4,
            INSTANCE: 2,
        },
        machine_type="ct6e-standard-4t",
        topology="4x4",
        provisioning="STANDARD",
        hosts=4,
        head_vm=True,
        slices=2,
        configured_slices=0,
    ),
    "Pulumi.example-compute-flex-v6e-16.yaml": dict(
        # Flex-start: the MIG in bulk mode with every host as its target size, which waits for the
        # zone to have them all; no resize request (bulk mode takes none), no per-instance config
        # or address, since the MIG names the hosts (docs/capacity.md). The head is a VM (required).
        counts={
            **COMMON,
            **_controller_identity(2),
            **_compute(4),
            PER_INSTANCE: 0,
            ADDRESS: 0,
            FIREWALL: 4,
            INSTANCE: 2,
        },
        machine_type="ct6e-standard-4t",
        topology="4x4",
        provisioning="FLEX_START",
        hosts=4,
        head_vm=True,
        configured_slices=0,
        flex_start_hours=24,
    ),
    "Pulumi.example-compute-tpu7x-16.yaml": dict(
        counts={**COMMON, **_compute(2), FIREWALL: 2},
        machine_type="tpu7x-standard-4t",
        topology="2x2x2",
        provisioning="STANDARD",
        hosts=2,
        head_vm=False,
    ),
}

# Every jax-preset cluster on a VM platform also has its compilation cache: the bucket, its name's
# random part and the hosts' two roles on it (rayslice.infra.compilation_cache); the xla preset's
# has none.
BUCKET = "gcp:storage/bucket:Bucket"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
RANDOM_ID = "random:index/randomId:RandomId"
for _name, _expected in EXAMPLES.items():
    if not _name.endswith("-xla.yaml"):
        _counts = _expected["counts"]
        _expected["counts"] = {
            **_counts,
            BUCKET: 1,
            BUCKET_MEMBER: 2,
            RANDOM_ID: _counts.get(RANDOM_ID, 0) + 1,
        }
# Every VM cluster keeps a record (rayslice.infra.record_bucket): one more bucket, which `pulumi
# destroy` keeps, the random parts of its name and of the run id, and object creation on it for
# the hosts' account and, where it runs, the controller's.
for _expected in EXAMPLES.values():
    _counts = _expected["counts"]
    _expected["counts"] = {
        **_counts,
        BUCKET: _counts.get(BUCKET, 0) + 1,
        BUCKET_MEMBER: _counts.get(BUCKET_MEMBER, 0) + 1 + (1 if _counts.get(CUSTOM_ROLE) else 0),
        RANDOM_ID: _counts.get(RANDOM_ID, 0) + 2,
    }


TPU_VM_EXAMPLES = sorted(name for name, e in EXAMPLES.items() if "runtime" in e)
COMPUTE_EXAMPLES = sorted(name for name, e in EXAMPLES.items() if "machine_type" in e)


@functools.cache
def _example(name: str):
    path = STACKS / name
    run = run_offline(lambda: main().exports, preview.stack_config(str(path), []))
    return EXAMPLES[name], spec.load_cli(str(path), []), run


@pytest.fixture(params=sorted(EXAMPLES))
def example(request):
    return _example(request.param)


def _controller_vms(run):
    return [i for i in run.of_type(INSTANCE) if i.inputs["metadata"].get(ATTR_ROLE) == CONTROLLER_ROLE]


def _hosts(run):
    """Everything whose metadata boots a Ray host: TPU VMs, instance templates, the head VM."""
    ray = [i for i in run.of_type(INSTANCE) if i not in _controller_vms(run)]
    return run.of_type(V2VM) + run.of_type(TEMPLATE) + ray


def test_resource_types_and_counts(example):
    expected, _, run = example
    custom = Counter(r.type for r in run.registrations if r.custom)
    assert dict(custom) == {t: n for t, n in expected["counts"].items() if n}


def test_every_child_is_parented_and_prefixed(example):
    _, cluster_spec, run = example
    by_urn = {r.urn: r for r in run.registrations}
    for r in run.registrations:
        if r.type == "rayslice:infra:TpuRayCluster":
            continue
        parent = by_urn[r.parent]  # KeyError: parented to the stack, not to a component
        while parent.custom:  # resources may nest under a resource (subnet in VPC)
            parent = by_urn[parent.parent]
        assert r.name.startswith(parent.name + "-"), (r.name, parent.name)
        assert r.name.startswith(cluster_spec.name)


@pytest.mark.parametrize("name", TPU_VM_EXAMPLES)
def test_slices_accelerator_runtime_and_scheduling(name):
    expected, _, run = _example(name)
    for vm in run.of_type(V2VM):
        # The topology goes with the type: the API would otherwise pick its own for the size.
        assert vm.inputs["acceleratorConfig"] == expected["accelerator"]
        assert "acceleratorType" not in vm.inputs
        assert vm.inputs["runtimeVersion"] == expected["runtime"]
        assert vm.inputs.get("schedulingConfig") == expected["scheduling"]


@pytest.mark.parametrize("name", COMPUTE_EXAMPLES)
def test_compute_slice_shape(name):
    expected, _, run = _example(name)
    # One of each per slice, matched by the slice's name (registration order is not theirs).
    policies = sorted(run.of_type(POLICY), key=lambda r: r.inputs["name"])
    templates = sorted(run.of_type(TEMPLATE), key=lambda r: r.inputs["namePrefix"])
    migs = sorted(run.of_type(MIG), key=lambda r: r.inputs["name"])
    assert len(policies) == len(templates) == len(migs) == expected.get("slices", 1)
    hours = expected.get("flex_start_hours")
    for policy, template, mig in zip(policies, templates, migs, strict=True):
        assert policy.inputs["workloadPolicy"] == {
            "type": "HIGH_THROUGHPUT",
            "acceleratorTopology": expected["topology"],
        }
        assert template.inputs["machineType"] == expected["machine_type"]
        assert template.inputs["scheduling"]["provisioningModel"] == expected["provisioning"]
        assert template.inputs["scheduling"]["onHostMaintenance"] == "TERMINATE"
        # Target size 0 plus one per-instance config (createInstances) per host: the topology's
        # hosts; or, with flex-start, a MIG in bulk mode whose target size is all of them (D1,
        # issue 40), the run duration in its FLEX_START template.
        assert mig.inputs["targetSize"] == (expected["hosts"] if hours else 0)
        assert mig.inputs.get("targetSizePolicies") == ([{"mode": "BULK"}] if hours else None)
        if hours:
            assert template.inputs["scheduling"]["maxRunDuration"] == {"seconds": hours * 3600}
        assert mig.inputs["resourcePolicies"]["workloadPolicy"].endswith(
            f"/resourcePolicies/{policy.inputs['name']}"
        )
    # An elastic cluster's slices above minSlices have no per-instance config: the controller's.
    assert len(run.of_type(PER_INSTANCE)) == expected["hosts"] * expected.get("configured_slices", 1)
    assert not run.of_type(RESIZE_REQUEST)
    assert not run.of_type(V2VM)


def test_every_host_boots_the_same_script_and_it_fits(example):
    _, cluster_spec, run = example
    scripts = {host.inputs["metadata"]["startup-script"] for host in _hosts(run)}
    (script,) = scripts  # one script for every slice and the head VM
    assert script.startswith("#!/bin/bash")
    assert f"'{cluster_spec.accelerator_type}'" in script or f"={cluster_spec.accelerator_type}\n" in script
    assert len(script.encode()) < METADATA_VALUE_LIMIT


def test_no_external_ips(example):
    _, _, run = example
    for vm in run.of_type(V2VM):
        assert vm.inputs["networkConfig"]["enableExternalIps"] is False
    for instance in run.of_type(INSTANCE) + run.of_type(TEMPLATE):
        assert all(not nic.get("accessConfigs") for nic in instance.inputs["networkInterfaces"])


def test_firewall_sources(example):
    _, cluster_spec, run = example
    denying = [r for r in run.of_type(FIREWALL) if r.inputs.get("denies")]
    # The controller's VM: every protocol from everywhere (IPv4 and IPv6) denied, first, on its
    # own tag only. (The mocks register the two rules in either order.)
    assert sorted(
        (r.inputs["sourceRanges"], r.inputs["denies"], r.inputs["targetTags"], r.inputs["priority"])
        for r in denying
    ) == sorted(
        ([everywhere], [{"protocol": "all"}], [f"{cluster_spec.name}-controller"], 0)
        for everywhere in ("0.0.0.0/0", "::/0")
        for _ in _controller_vms(run)
    )
    rules = [r for r in run.of_type(FIREWALL) if r not in denying]
    for rule in rules:
        assert not rule.inputs.get("denies")
        ranges = rule.inputs.get("sourceRanges") or []
        # GCP reads a rule without any source as 0.0.0.0/0: every rule must name one.
        assert ranges or rule.inputs.get("sourceTags")
        assert all(ipaddress.ip_network(r).prefixlen > 0 for r in ranges), rule.name
        ports = {p for allow in rule.inputs["allows"] for p in allow.get("ports") or []}
        if "22" in ports:
            assert ranges == [IAP_SOURCE_RANGE]
        if ranges and ranges != [IAP_SOURCE_RANGE]:
            assert ranges == list(cluster_spec.dashboard_source_ranges)
            assert ports == {"8265"}
    internal = [r for r in rules if r.inputs.get("sourceTags")]
    assert len(internal) == 1 and internal[0].inputs["sourceTags"] == internal[0].inputs["targetTags"]


def test_outputs_present(example):
    expected, cluster_spec, run = example
    out = run.value
    assert out["slice_names"] == [cluster_spec.slice_name(i) for i in range(cluster_spec.slices)]
    # A flex-start slice's hosts are named and addressed when its request is fulfilled: none yet.
    hosts = 0 if expected.get("flex_start_hours") else expected["hosts"]
    assert [len(ips) for ips in out["slice_host_ips"].values()] == [hosts] * cluster_spec.slices
    assert out["jobs_api_address"] == f"http://{out['head_internal_ip']}:8265"
    assert "--tunnel-through-iap" in out["dashboard_tunnel_command"]
    # GA `gcloud compute tpus tpu-vm ssh` has no --tunnel-through-iap; alpha does (access.py).
    for command in [out["dashboard_tunnel_command"], *out["ssh_commands"].values()]:
        assert "tpus tpu-vm ssh" not in command or command.startswith("gcloud alpha compute tpus tpu-vm ssh ")
    assert f"8265:{out['head_internal_ip']}:8265" in out["dashboard_tunnel_command"]
    assert set(out["ssh_commands"]) >= set(out["slice_names"])
    assert all(
        "--tunnel-through-iap" in c and "--project=my-gcp-project" in c for c in out["ssh_commands"].values()
    )
    assert out["ray_token_command"].endswith(
        f"--secret={cluster_spec.name}-ray-token --project=my-gcp-project"
    )
    assert out["service_account_email"].endswith("@my-gcp-project.iam.gserviceaccount.com")


def test_head_address_and_roles(example):
    expected, _, run = example
    head_ip = run.value["head_internal_ip"]
    slice_metadata = [vm.inputs["metadata"] for vm in run.of_type(V2VM) + run.of_type(TEMPLATE)]
    if expected["head_vm"]:
        (instance,) = [i for i in run.of_type(INSTANCE) if i not in _controller_vms(run)]
        assert instance.inputs["metadata"][ATTR_ROLE] == "head-vm"
        assert instance.inputs["machineType"] == "n2-standard-16"
        assert all(m[ATTR_HEAD_ADDRESS] == head_ip for m in slice_metadata)
    else:
        assert head_ip == run.value["slice_host_ips"][run.value["slice_names"][0]][0]
        assert all(ATTR_ROLE not in m for m in slice_metadata)
        # A TPU node's head is its worker 0; a MIG's is the host at the address Pulumi reserved
        # for `-w0`, written into the metadata, since Google's worker-id 0 may be another host.
        assert all(t.inputs["metadata"][ATTR_HEAD_ADDRESS] == head_ip for t in run.of_type(TEMPLATE))
        assert all(ATTR_HEAD_ADDRESS not in vm.inputs["metadata"] for vm in run.of_type(V2VM))


def test_no_secret_value_in_metadata_or_outputs(example):
    _, cluster_spec, run = example
    token = run.fake.token
    for host in _hosts(run):
        assert token not in json.dumps(host.inputs["metadata"])
        assert host.inputs["metadata"][ATTR_TOKEN_SECRET] == f"{cluster_spec.name}-ray-token"
    for controller in _controller_vms(run):  # it never talks to Ray: not even the secret's name
        assert token not in json.dumps(controller.inputs["metadata"])
        assert ATTR_TOKEN_SECRET not in controller.inputs["metadata"]
    holders = [r for r in run.registrations if token in json.dumps(r.inputs)]
    assert [(r.type, sorted(r.secret_inputs)) for r in holders] == [
        ("gcp:secretmanager/secretVersion:SecretVersion", ["secretData"])
    ]
    assert token not in json.dumps(run.value)


def test_example_header_states_the_slice(example):
    expected, cluster_spec, _ = example
    path = next(STACKS / name for name, e in EXAMPLES.items() if e is expected)
    header = path.read_text().splitlines()[0]
    t = cluster_spec.tpu
    assert header.startswith("# Slice: ")
    assert f"{t.accelerator_type} = " in header
    assert f"{t.hosts} host" in header and f"x {t.chips_per_host} chips" in header
    assert f"topology {t.topology}" in path.read_text()
    assert (t.runtime_version or t.machine_type) in path.read_text()


def test_every_host_reports_its_boot_state_through_guest_attributes(example):
    """The boot script's states are guest attributes, which GCE serves only when asked for."""
    _, _, run = example
    metadata = [r.inputs["metadata"] for r in _hosts(run)]
    assert metadata and all(m["enable-guest-attributes"] == "TRUE" for m in metadata)
    assert all(m["enable-oslogin"] == "TRUE" for m in metadata)


# Resources whose creation boots a host (a MIG creates its instances; so do per-instance configs).
BOOTS_HOSTS = (V2VM, INSTANCE, MIG, PER_INSTANCE)
GRANTS = (
    "gcp:projects/iAMMember:IAMMember",
    "gcp:secretmanager/secretIamMember:SecretIamMember",
    "gcp:serviceaccount/account:Account",
)


def test_hosts_wait_for_every_grant_and_the_firewall(example):
    """A host that boots before its grants fails its first token read (issue 12 item 4)."""
    expected, _, run = example
    by_urn = {r.urn: r for r in run.registrations}
    (sleep,) = run.of_type(SLEEP)
    assert sleep.inputs["createDuration"] == "60s"
    waited = {by_urn[u].type for u in sleep.dependencies if u in by_urn}
    assert set(GRANTS) <= waited
    if expected["head_vm"]:  # and the controller VM, which boots with them, for its roles
        assert {CUSTOM_ROLE, "gcp:serviceaccount/iAMMember:IAMMember"} <= waited
    rules = {r.urn for r in run.of_type(FIREWALL)}
    booting = [r for r in run.registrations if r.type in BOOTS_HOSTS]
    assert booting
    for r in booting:
        assert sleep.urn in r.dependencies, r.name
        assert rules <= r.dependencies, r.name
