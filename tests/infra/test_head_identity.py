"""Who runs as what: the hosts and the head VM share the hosts' account, and only the recovery
controller's own VM holds the controller's roles (issues 10 and 20).

Every expectation is written out here (account IDs, roles, permissions, resource names), not
read back from the code under test: `NEEDS` is this test's own statement of what each account
needs, made from Google's REST reference for the calls each one makes, and the roles the
program creates are compared with it, not with `rayslice.recovery.permissions`, the list they
are built from. tests/recovery/test_permissions.py derives the same sets from the calls the
controller makes against the emulation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rayslice import cli
from rayslice.infra.identity import account_id, role_id
from rayslice.infra.mocks import OfflineRun, Registration, run_offline
from rayslice.infra.program import main

PROJECT = "my-gcp-project"
ACCOUNT = "gcp:serviceaccount/account:Account"
PROJECT_MEMBER = "gcp:projects/iAMMember:IAMMember"
ACCOUNT_MEMBER = "gcp:serviceaccount/iAMMember:IAMMember"
CUSTOM_ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"
SECRET_MEMBER = "gcp:secretmanager/secretIamMember:SecretIamMember"
RANDOM_ID = "random:index/randomId:RandomId"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
INSTANCE = "gcp:compute/instance:Instance"
V2VM = "gcp:tpu/v2Vm:V2Vm"
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
SLEEP = "time:index/sleep:Sleep"
BASE = {
    "rayslice:acceleratorType": "v6e-16",
    "rayslice:zone": "us-east5-b",
    "rayslice:name": "train",
    "gcp:project": PROJECT,
    # The record's grants (object creation on its bucket, for the hosts and the controller) are
    # tests/infra/test_cluster_record.py's; here the accounts' power over slices alone.
    "rayslice:recordBucket": "none",
}
HOSTS_EMAIL = f"train-hosts@{PROJECT}.iam.gserviceaccount.com"
CONTROLLER_EMAIL = f"train-controller@{PROJECT}.iam.gserviceaccount.com"
HOSTS_NAME = f"projects/{PROJECT}/serviceAccounts/{HOSTS_EMAIL}"
STARTS_WITH = re.compile(r'resource\.name\.startsWith\("([^"]+)"\)')
ROLE_ID = re.compile(r"[a-zA-Z0-9_.]{3,64}")

# What each account needs, stated here from Google's REST reference (each method's "IAM
# Permissions" section), independently of rayslice.recovery.permissions. The controller calls:
# TPU nodes.get / delete / create and operations.get (it polls them); Compute
# instanceGroupManagers.get (+ listManagedInstances, listPerInstanceConfigs) / delete / insert
# (".create") / createInstances (".update") and zoneOperations.get, and the MIG it inserts names
# the slice's workload policy (resourcePolicies.use) and instance template (useReadOnly, the
# one narrowed by name). Per custom role ("part"):
CONTROLLER_NEEDS = {
    "tpu-vm": {
        "slices": {
            "tpu.nodes.get",
            "tpu.nodes.delete",
            "tpu.nodes.create",
            "tpu.operations.get",
            # a queued slice is read and recreated through its queued resource
            "tpu.queuedResources.get",
            "tpu.queuedResources.delete",
            "tpu.queuedResources.create",
        }
    },
    "compute": {
        "slices": {
            "compute.instanceGroupManagers.get",
            "compute.instanceGroupManagers.delete",
            "compute.instanceGroupManagers.create",
            "compute.instanceGroupManagers.update",
            "compute.resourcePolicies.use",
            "compute.zoneOperations.get",
            "compute.zoneOperations.list",  # the zone's preemption operations (issue 40, D2)
        },
        "templates": {"compute.instanceTemplates.useReadOnly"},
    },
}
# Hosts and the head VM boot the Ray script: they write logs and metrics and read the Ray token.
HOSTS_NEED = {"roles/logging.logWriter", "roles/monitoring.metricWriter"}
SLICE_POWER = re.compile(r"tpu\.nodes\.|compute\.instanceGroupManagers\.")


def _run(platform: str, **overrides: str) -> OfflineRun:
    config = {**BASE, "rayslice:platform": platform, **{f"rayslice:{k}": v for k, v in overrides.items()}}
    return run_offline(lambda: main().exports, config)


def _instance(run: OfflineRun, role: str) -> Registration:
    (instance,) = [i for i in run.of_type(INSTANCE) if i.inputs["metadata"].get("rayslice-role") == role]
    return instance


def _member(email: str) -> str:
    return f"serviceAccount:{email}"


@pytest.fixture(scope="module", params=["tpu-vm", "compute"])
def recovering(request) -> tuple[str, OfflineRun]:
    """Two spot slices: head=vm and recovery=true are the defaults, so the controller runs."""
    return request.param, _run(request.param, capacity="spot", slices="2")


def test_the_head_vm_runs_as_the_hosts_and_the_controller_vm_as_its_own_account(recovering):
    platform, run = recovering
    assert {a.inputs["accountId"] for a in run.of_type(ACCOUNT)} == {"train-hosts", "train-controller"}
    assert _instance(run, "head-vm").inputs["serviceAccount"]["email"] == HOSTS_EMAIL
    assert _instance(run, "controller-vm").inputs["serviceAccount"]["email"] == CONTROLLER_EMAIL
    slices = run.of_type(V2VM) if platform == "tpu-vm" else run.of_type(TEMPLATE)
    assert len(slices) == 2
    assert {s.inputs["serviceAccount"]["email"] for s in slices} == {HOSTS_EMAIL}


@pytest.mark.parametrize("external_ips", [False, True], ids=["internal", "externalIps"])
def test_nothing_reaches_the_controller_vm_and_it_runs_no_ray(recovering, external_ips):
    platform, run = recovering
    if external_ips:
        run = _run(platform, capacity="spot", slices="2", externalIps="true")
        assert _instance(run, "head-vm").inputs["networkInterfaces"][0]["accessConfigs"] == [{}]
    controller = _instance(run, "controller-vm")
    # No external IP, with externalIps too: it serves nothing, and needs none to reach Google.
    assert [nic.get("accessConfigs") for nic in controller.inputs["networkInterfaces"]] == [None]
    # Its own tag only: not the hosts' (Ray's internal rule) nor the head's (dashboard), so no
    # allow rule targets it, and the rules that do deny everything, IPv4 and IPv6, first. A rule
    # holds one IP version only (Google's "Use VPC firewall rules"): hence two.
    assert controller.inputs["tags"] == ["train-controller"]
    rules = [
        r
        for r in run.of_type("gcp:compute/firewall:Firewall")
        if "train-controller" in r.inputs["targetTags"]
    ]
    assert sorted(
        (
            r.inputs["name"],
            r.inputs.get("allows"),
            r.inputs["denies"],
            r.inputs["sourceRanges"],
            r.inputs["priority"],
        )
        for r in rules
    ) == [
        ("train-fw-controller-deny", None, [{"protocol": "all"}], ["0.0.0.0/0"], 0),
        ("train-fw-controller-deny-v6", None, [{"protocol": "all"}], ["::/0"], 0),
    ]
    metadata = controller.inputs["metadata"]
    assert metadata["block-project-ssh-keys"] == "TRUE" and metadata["enable-oslogin"] == "TRUE"
    script = metadata["startup-script"]
    assert script != _instance(run, "head-vm").inputs["metadata"]["startup-script"]
    assert "ray start" not in script and "rayslice-token-secret" not in metadata
    assert controller.inputs.get("scheduling", {}).get("provisioningModel") in (None, "STANDARD")


@pytest.mark.parametrize(
    "platform, overrides, controller",
    [
        ("tpu-vm", {"capacity": "spot", "slices": "2", "recovery": "false"}, False),
        ("compute", {"capacity": "spot", "slices": "2", "recovery": "false"}, False),
        ("compute", {"head": "vm"}, True),  # on-demand: recovery is still on by default
    ],
    ids=["tpu-vm-no-recovery", "compute-no-recovery", "compute-on-demand-head-vm"],
)
def test_the_controller_vm_and_its_account_exist_exactly_when_it_runs(platform, overrides, controller):
    run = _run(platform, **overrides)
    assert _instance(run, "head-vm").inputs["serviceAccount"]["email"] == HOSTS_EMAIL
    if not controller:
        assert [a.inputs["accountId"] for a in run.of_type(ACCOUNT)] == ["train-hosts"]
        assert not run.of_type(CUSTOM_ROLE) and not run.of_type(ACCOUNT_MEMBER) and not _role_suffixes(run)
        assert len(run.of_type(INSTANCE)) == 1
    else:
        assert len(run.of_type(CUSTOM_ROLE)) == len(CONTROLLER_NEEDS[platform])
        assert _instance(run, "controller-vm").inputs["serviceAccount"]["email"] == CONTROLLER_EMAIL


@pytest.mark.parametrize(
    "platform, overrides",
    [("tpu-vm", {}), ("compute", {}), ("gke", {"capacity": "spot", "slices": "2"})],
    ids=["tpu-vm-head-on-slice", "compute-head-on-slice", "gke"],
)
def test_no_controller_identity_without_a_head_vm_or_on_gke(platform, overrides):
    run = _run(platform, **overrides)
    assert not run.of_type(INSTANCE)
    assert "train-controller" not in {a.inputs["accountId"] for a in run.of_type(ACCOUNT)}
    assert not run.of_type(CUSTOM_ROLE) and not run.of_type(ACCOUNT_MEMBER) and not _role_suffixes(run)


def test_the_custom_roles_hold_exactly_what_the_controller_needs(recovering):
    platform, run = recovering
    roles = {r.name.rsplit("-recovery-", 1)[1]: r for r in run.of_type(CUSTOM_ROLE)}
    assert {key: set(role.inputs["permissions"]) for key, role in roles.items()} == CONTROLLER_NEEDS[platform]
    granted = [p for r in roles.values() for p in r.inputs["permissions"]]
    assert len(granted) == len(set(granted))
    (suffix,) = _role_suffixes(run)
    for key, role in roles.items():
        assert ROLE_ID.fullmatch(role.inputs["roleId"])
        assert re.fullmatch(rf"rayslice_train_{key}_[0-9a-f]{{6}}", role.inputs["roleId"])
        assert role.inputs["project"] == PROJECT
    assert suffix.inputs["byteLength"] == 3


def test_each_role_is_bound_to_the_controller_only_and_only_templates_are_narrowed(recovering):
    platform, run = recovering
    roles = {f"projects/{PROJECT}/roles/{r.inputs['roleId']}": r for r in run.of_type(CUSTOM_ROLE)}
    bindings = [m for m in run.of_type(PROJECT_MEMBER) if m.inputs["role"] in roles]
    assert len(bindings) == len(roles)
    assert {m.inputs["member"] for m in bindings} == {_member(CONTROLLER_EMAIL)}
    conditioned = {m.inputs["role"].split("/")[-1].split("_")[2]: m.inputs.get("condition") for m in bindings}
    if platform == "tpu-vm":
        assert conditioned == {"slices": None}  # Cloud TPU cannot be narrowed by name
        return
    assert conditioned["slices"] is None  # MIGs cannot be named in a condition
    expression = conditioned["templates"]["expression"]
    base = f"projects/{PROJECT}/global/instanceTemplates/"
    assert STARTS_WITH.findall(expression) == [base + "train-slice-0-", base + "train-slice-1-"]
    assert expression.count("||") == 1 and "resource.type" not in expression
    # The prefixes are the ones the slices' templates are actually created with.
    templates = run.of_type(TEMPLATE)
    assert sorted(base + t.inputs["namePrefix"] for t in templates) == STARTS_WITH.findall(expression)


def test_the_controller_may_act_as_the_hosts_account_only(recovering):
    _, run = recovering
    (act_as,) = run.of_type(ACCOUNT_MEMBER)
    assert act_as.inputs == {
        "serviceAccountId": HOSTS_NAME,
        "role": "roles/iam.serviceAccountUser",
        "member": _member(CONTROLLER_EMAIL),
    }
    assert not [m for m in run.of_type(PROJECT_MEMBER) if m.inputs["role"] == "roles/iam.serviceAccountUser"]


def test_the_controller_account_holds_nothing_but_its_roles_and_act_as(recovering):
    _, run = recovering
    held = [r for r in run.registrations if r.inputs.get("member") == _member(CONTROLLER_EMAIL)]
    custom = {f"projects/{PROJECT}/roles/{r.inputs['roleId']}" for r in run.of_type(CUSTOM_ROLE)}
    assert sorted((r.type, r.inputs["role"] in custom or r.inputs["role"]) for r in held) == sorted(
        [(PROJECT_MEMBER, True)] * len(custom) + [(ACCOUNT_MEMBER, "roles/iam.serviceAccountUser")]
    )


def test_the_head_and_hosts_hold_no_slice_power(recovering):
    """The head runs Ray and every job's driver: its account (the hosts') can neither create nor
    delete a TPU node or a MIG."""
    _, run = recovering
    held = [r for r in run.registrations if r.inputs.get("member") == _member(HOSTS_EMAIL)]
    assert {r.inputs["role"] for r in held if r.type == PROJECT_MEMBER} == HOSTS_NEED
    assert sorted((r.type, r.inputs["role"]) for r in held if r.type != PROJECT_MEMBER) == [
        (SECRET_MEMBER, "roles/secretmanager.secretAccessor"),
        (BUCKET_MEMBER, "roles/storage.objectCreator"),
        (BUCKET_MEMBER, "roles/storage.objectViewer"),
    ]
    custom = {f"projects/{PROJECT}/roles/{r.inputs['roleId']}": r for r in run.of_type(CUSTOM_ROLE)}
    assert not [r for r in held if r.inputs["role"] in custom]


def test_the_index_credentials_are_read_by_the_hosts_only():
    run = _run(
        "tpu-vm",
        capacity="spot",
        packageIndex="https://pypi.example.com/simple",
        packageIndexCredentialsSecret="pypi-mirror-login",
        allowForeignPackageIndexSecret="true",
    )
    readers = {
        m.inputs["member"] for m in run.of_type(SECRET_MEMBER) if m.inputs["secretId"] == "pypi-mirror-login"
    }
    assert readers == {_member(HOSTS_EMAIL)}


def test_the_controller_vm_waits_for_every_grant_of_its_account_and_for_the_slices(recovering):
    platform, run = recovering
    (sleep,) = run.of_type(SLEEP)
    grants = [
        r
        for r in run.registrations
        if r.inputs.get("member") == _member(CONTROLLER_EMAIL) or r.type == CUSTOM_ROLE
    ]
    account = [a for a in run.of_type(ACCOUNT) if a.inputs["accountId"] == "train-controller"]
    # 1 act-as, the bindings and the roles themselves.
    assert len(grants) == 1 + 2 * len(run.of_type(CUSTOM_ROLE))
    assert {r.urn for r in grants + account} <= sleep.dependencies
    controller = _instance(run, "controller-vm")
    assert sleep.urn in controller.dependencies
    # Depending on a slice's component waits for every resource it holds (the SDK expands it).
    slices = {
        c.urn for c in run.registrations if not c.custom and c.name.startswith(f"train-{platform}-slice-")
    }
    held = {r.urn for r in run.registrations if r.custom and r.parent in slices}
    assert len(slices) == 2 and held and held <= controller.dependencies


def _role_suffixes(run: OfflineRun) -> list:
    """The random ends of the controller's role IDs (the compilation cache's bucket has its own)."""
    return [r for r in run.of_type(RANDOM_ID) if "compilation-cache" not in r.name]


def _hosts_grants(run: OfflineRun) -> list[tuple[str, str, dict]]:
    """What is granted to the hosts' account, and the account itself, as (type, name, inputs)."""
    member = _member(HOSTS_EMAIL)
    found = [
        (r.type, r.name, r.inputs)
        for r in run.registrations
        if r.inputs.get("member") == member or (r.type == ACCOUNT and r.inputs["accountId"] == "train-hosts")
    ]
    # The compilation cache's bucket has a random name of its own in every run.
    found = [(t, n, {**i, "bucket": "<random>"} if t == BUCKET_MEMBER else i) for t, n, i in found]
    return sorted(found, key=lambda t: t[1])


@pytest.mark.parametrize("platform", ["tpu-vm", "compute"])
def test_the_hosts_identity_does_not_change(platform):
    with_controller = _hosts_grants(_run(platform, capacity="spot", slices="2"))
    without = _hosts_grants(_run(platform, capacity="spot", slices="2", recovery="false"))
    assert with_controller == without
    assert sorted((t, i["role"]) for t, _, i in with_controller if t != ACCOUNT) == [
        (PROJECT_MEMBER, "roles/logging.logWriter"),
        (PROJECT_MEMBER, "roles/monitoring.metricWriter"),
        (SECRET_MEMBER, "roles/secretmanager.secretAccessor"),
        (BUCKET_MEMBER, "roles/storage.objectCreator"),
        (BUCKET_MEMBER, "roles/storage.objectViewer"),
    ]


def test_account_ids_of_one_cluster_never_collide():
    assert account_id("train", "controller") == "train-controller"
    assert account_id("train") == account_id("train", "hosts") == "train-hosts"
    long_name = "a" * 30 + "-b"
    hosts, controller = account_id(long_name, "hosts"), account_id(long_name, "controller")
    assert hosts != controller and "-c-" in controller
    for account in (hosts, controller, account_id("a" * 30 + "-c", "controller")):
        assert re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", account), account
    assert account_id(long_name, "controller") != account_id("a" * 30 + "-c", "controller")


def test_role_ids_are_valid_and_unique_per_cluster():
    assert role_id("train-v6e", "slices", "0a1b2c") == "rayslice_train_v6e_slices_0a1b2c"
    long_a, long_b = "a" * 38 + "-one", "a" * 38 + "-two"
    ids = {role_id(name, "templates", "0a1b2c") for name in (long_a, long_b)}
    assert len(ids) == 2
    assert all(ROLE_ID.fullmatch(i) and i.endswith("_templates_0a1b2c") for i in ids)


def test_preview_json_of_a_spot_multislice_stack_gives_slice_power_to_the_controller_only(capsys):
    """Issue 20's acceptance: in `rayslice preview --output json` of a Spot multi-slice example,
    the head VM's account holds no tpu.nodes.* or compute.instanceGroupManagers.* permission and
    a separate account, the controller VM's, holds them."""
    stack = Path(__file__).resolve().parents[2] / "infra" / "Pulumi.example-multislice.yaml"
    assert (
        cli.main(["preview", "--stack-file", str(stack), "--set", "capacity=spot", "--output", "json"]) == 0
    )
    resources = json.loads(capsys.readouterr().out)
    by_type: dict[str, list[dict]] = {}
    for r in resources:
        by_type.setdefault(r["type"], []).append(r["inputs"])
    custom = {
        f"projects/{r['project']}/roles/{r['roleId']}": set(r["permissions"]) for r in by_type[CUSTOM_ROLE]
    }
    project_roles: dict[str, set[str]] = {}
    for binding in by_type[PROJECT_MEMBER]:
        project_roles.setdefault(binding["member"], set()).add(binding["role"])
    vms = {vm["metadata"]["rayslice-role"]: vm["serviceAccount"]["email"] for vm in by_type[INSTANCE]}
    head, controller = _member(vms["head-vm"]), _member(vms["controller-vm"])
    assert head != controller

    def permissions_of(member: str) -> set[str]:
        return {p for role in project_roles.get(member, ()) for p in custom.get(role, ())}

    # The head's predefined roles are the log and metric writers, which hold neither.
    assert project_roles[head] == HOSTS_NEED
    assert not {p for p in permissions_of(head) if SLICE_POWER.match(p)}
    assert {"tpu.nodes.create", "tpu.nodes.delete", "tpu.nodes.get"} <= permissions_of(controller)
    assert project_roles[controller] <= set(custom)  # nothing but the controller's custom roles


def test_an_elastic_controller_may_read_the_guest_attributes_of_the_head_vm_alone():
    """Ray's demand reaches the controller through the head VM's guest attributes: one more role,
    narrowed to that instance (IAM Conditions name instances); a fixed cluster has no such role."""
    run = _run("compute", slices="2", minSlices="0")
    roles = {f"projects/{PROJECT}/roles/{r.inputs['roleId']}": r for r in run.of_type(CUSTOM_ROLE)}
    [demand] = [r for r in roles.values() if "_demand_" in r.inputs["roleId"]]
    assert demand.inputs["permissions"] == ["compute.instances.getGuestAttributes"]
    [binding] = [m for m in run.of_type(PROJECT_MEMBER) if m.inputs["role"].endswith(demand.inputs["roleId"])]
    head = f"projects/{PROJECT}/zones/{_instance(run, 'head-vm').inputs['zone']}/instances/train-head"
    assert binding.inputs["condition"]["expression"] == f'resource.name == "{head}"'
    assert binding.inputs["member"] == _member(CONTROLLER_EMAIL)
    fixed = _run("compute", slices="2")
    assert not [r for r in fixed.of_type(CUSTOM_ROLE) if "_demand_" in r.inputs["roleId"]]
