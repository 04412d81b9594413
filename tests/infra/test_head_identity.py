"""The head VM's own least-privilege identity where it runs the recovery controller (issue 10).

Every expectation is written out here (account IDs, roles, resource names), not read back from
the code under test, except the permission lists, whose one source is
`rayslice.recovery.permissions` (tests/recovery/test_permissions.py checks those against the
methods the controller calls).
"""

from __future__ import annotations

import re

import pytest

from rayslice.infra.identity import account_id, role_id
from rayslice.infra.mocks import OfflineRun, Registration, run_offline
from rayslice.infra.program import main
from rayslice.recovery import permissions

PROJECT = "my-gcp-project"
ACCOUNT = "gcp:serviceaccount/account:Account"
PROJECT_MEMBER = "gcp:projects/iAMMember:IAMMember"
ACCOUNT_MEMBER = "gcp:serviceaccount/iAMMember:IAMMember"
CUSTOM_ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"
SECRET_MEMBER = "gcp:secretmanager/secretIamMember:SecretIamMember"
RANDOM_ID = "random:index/randomId:RandomId"
INSTANCE = "gcp:compute/instance:Instance"
V2VM = "gcp:tpu/v2Vm:V2Vm"
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
SLEEP = "time:index/sleep:Sleep"
BASE = {
    "rayslice:acceleratorType": "v6e-16",
    "rayslice:zone": "us-east5-b",
    "rayslice:name": "train",
    "gcp:project": PROJECT,
}
HOSTS_EMAIL = f"train-hosts@{PROJECT}.iam.gserviceaccount.com"
HEAD_EMAIL = f"train-head@{PROJECT}.iam.gserviceaccount.com"
HOSTS_NAME = f"projects/{PROJECT}/serviceAccounts/{HOSTS_EMAIL}"
STARTS_WITH = re.compile(r'resource\.name\.startsWith\("([^"]+)"\)')
ROLE_ID = re.compile(r"[a-zA-Z0-9_.]{3,64}")


def _run(platform: str, **overrides: str) -> OfflineRun:
    config = {**BASE, "rayslice:platform": platform, **{f"rayslice:{k}": v for k, v in overrides.items()}}
    return run_offline(lambda: main().exports, config)


def _head(run: OfflineRun) -> Registration:
    (instance,) = run.of_type(INSTANCE)
    return instance


def _member(email: str) -> str:
    return f"serviceAccount:{email}"


@pytest.fixture(scope="module", params=["tpu-vm", "compute"])
def recovering(request) -> tuple[str, OfflineRun]:
    """Two spot slices: head=vm and recovery=true are the defaults, so the controller runs."""
    return request.param, _run(request.param, capacity="spot", slices="2")


def test_the_head_vm_runs_as_its_own_account_and_the_slices_as_the_hosts(recovering):
    platform, run = recovering
    assert {a.inputs["accountId"] for a in run.of_type(ACCOUNT)} == {"train-hosts", "train-head"}
    assert _head(run).inputs["serviceAccount"]["email"] == HEAD_EMAIL
    slices = run.of_type(V2VM) if platform == "tpu-vm" else run.of_type(TEMPLATE)
    assert len(slices) == 2
    assert {s.inputs["serviceAccount"]["email"] for s in slices} == {HOSTS_EMAIL}


@pytest.mark.parametrize(
    "platform, overrides, email",
    [
        ("tpu-vm", {"capacity": "spot", "slices": "2", "recovery": "false"}, HOSTS_EMAIL),
        ("compute", {"capacity": "spot", "slices": "2", "recovery": "false"}, HOSTS_EMAIL),
        ("compute", {"head": "vm"}, HEAD_EMAIL),  # on-demand: recovery is still on by default
    ],
    ids=["tpu-vm-no-recovery", "compute-no-recovery", "compute-on-demand-head-vm"],
)
def test_the_head_vm_has_its_own_account_exactly_when_it_runs_the_controller(platform, overrides, email):
    run = _run(platform, **overrides)
    assert _head(run).inputs["serviceAccount"]["email"] == email
    if email == HOSTS_EMAIL:
        assert [a.inputs["accountId"] for a in run.of_type(ACCOUNT)] == ["train-hosts"]
        assert not run.of_type(CUSTOM_ROLE) and not run.of_type(ACCOUNT_MEMBER) and not run.of_type(RANDOM_ID)
    else:
        assert len(run.of_type(CUSTOM_ROLE)) == len(permissions.role_parts(platform))


@pytest.mark.parametrize(
    "platform, overrides",
    [("tpu-vm", {}), ("compute", {}), ("gke", {"capacity": "spot", "slices": "2"})],
    ids=["tpu-vm-head-on-slice", "compute-head-on-slice", "gke"],
)
def test_no_controller_identity_without_a_head_vm_or_on_gke(platform, overrides):
    run = _run(platform, **overrides)
    assert not run.of_type(INSTANCE)
    assert "train-head" not in {a.inputs["accountId"] for a in run.of_type(ACCOUNT)}
    assert not run.of_type(CUSTOM_ROLE) and not run.of_type(ACCOUNT_MEMBER) and not run.of_type(RANDOM_ID)


def test_the_custom_roles_hold_exactly_the_controllers_permissions(recovering):
    platform, run = recovering
    roles = {r.name.rsplit("-recovery-", 1)[1]: r for r in run.of_type(CUSTOM_ROLE)}
    parts = {part.key: part for part in permissions.role_parts(platform)}
    assert set(roles) == set(parts) and parts
    for key, role in roles.items():
        assert sorted(role.inputs["permissions"]) == sorted(parts[key].permissions)
    granted = [p for r in roles.values() for p in r.inputs["permissions"]]
    assert sorted(granted) == sorted(permissions.permissions(platform))
    assert len(granted) == len(set(granted))
    (suffix,) = run.of_type(RANDOM_ID)
    for key, role in roles.items():
        assert ROLE_ID.fullmatch(role.inputs["roleId"])
        assert re.fullmatch(rf"rayslice_train_{key}_[0-9a-f]{{6}}", role.inputs["roleId"])
        assert role.inputs["project"] == PROJECT
    assert suffix.inputs["byteLength"] == 3


def test_each_role_is_bound_to_the_head_only_and_only_templates_are_narrowed(recovering):
    platform, run = recovering
    roles = {f"projects/{PROJECT}/roles/{r.inputs['roleId']}": r for r in run.of_type(CUSTOM_ROLE)}
    bindings = [m for m in run.of_type(PROJECT_MEMBER) if m.inputs["role"] in roles]
    assert len(bindings) == len(roles)
    assert {m.inputs["member"] for m in bindings} == {_member(HEAD_EMAIL)}
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


def test_the_head_may_act_as_the_hosts_account_only(recovering):
    _, run = recovering
    (act_as,) = run.of_type(ACCOUNT_MEMBER)
    assert act_as.inputs == {
        "serviceAccountId": HOSTS_NAME,
        "role": "roles/iam.serviceAccountUser",
        "member": _member(HEAD_EMAIL),
    }
    assert not [m for m in run.of_type(PROJECT_MEMBER) if m.inputs["role"] == "roles/iam.serviceAccountUser"]


def test_the_head_runs_the_same_boot_script_grants_as_the_hosts(recovering):
    _, run = recovering
    head_roles = {
        m.inputs["role"] for m in run.of_type(PROJECT_MEMBER) if m.inputs["member"] == _member(HEAD_EMAIL)
    }
    assert {r for r in head_roles if r.startswith("roles/")} == {
        "roles/logging.logWriter",
        "roles/monitoring.metricWriter",
    }
    readers = [m for m in run.of_type(SECRET_MEMBER) if m.inputs["member"] == _member(HEAD_EMAIL)]
    assert [(m.inputs["secretId"], m.inputs["role"]) for m in readers] == [
        ("train-ray-token", "roles/secretmanager.secretAccessor")
    ]


def test_the_head_reads_the_index_credentials_too():
    run = _run(
        "tpu-vm",
        capacity="spot",
        packageIndex="https://pypi.example.com/simple",
        packageIndexCredentialsSecret="pypi-mirror-login",
    )
    readers = {
        m.inputs["member"] for m in run.of_type(SECRET_MEMBER) if m.inputs["secretId"] == "pypi-mirror-login"
    }
    assert readers == {_member(HOSTS_EMAIL), _member(HEAD_EMAIL)}


def test_the_head_vm_waits_for_every_grant_of_its_account(recovering):
    _, run = recovering
    (sleep,) = run.of_type(SLEEP)
    head_grants = [
        r for r in run.registrations if r.inputs.get("member") == _member(HEAD_EMAIL) or r.type == CUSTOM_ROLE
    ]
    head_account = [a for a in run.of_type(ACCOUNT) if a.inputs["accountId"] == "train-head"]
    # 2 project roles, 1 token reader, 1 act-as, the bindings and the roles themselves.
    assert len(head_grants) >= 4 + 2 * len(run.of_type(CUSTOM_ROLE))
    assert {r.urn for r in head_grants + head_account} <= sleep.dependencies
    assert sleep.urn in _head(run).dependencies


def _hosts_grants(run: OfflineRun) -> list[tuple[str, str, dict]]:
    """What is granted to the hosts' account, and the account itself, as (type, name, inputs)."""
    member = _member(HOSTS_EMAIL)
    found = [
        (r.type, r.name, r.inputs)
        for r in run.registrations
        if r.inputs.get("member") == member or (r.type == ACCOUNT and r.inputs["accountId"] == "train-hosts")
    ]
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
    ]


def test_account_ids_of_one_cluster_never_collide():
    assert account_id("train", "head") == "train-head"
    assert account_id("train") == account_id("train", "hosts") == "train-hosts"
    long_name = "a" * 30 + "-b"
    hosts, head = account_id(long_name, "hosts"), account_id(long_name, "head")
    assert hosts != head and "-h-" in head
    for account in (hosts, head, account_id("a" * 30 + "-c", "head")):
        assert re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", account), account
    assert account_id(long_name, "head") != account_id("a" * 30 + "-c", "head")


def test_role_ids_are_valid_and_unique_per_cluster():
    assert role_id("train-v6e", "slices", "0a1b2c") == "rayslice_train_v6e_slices_0a1b2c"
    long_a, long_b = "a" * 38 + "-one", "a" * 38 + "-two"
    ids = {role_id(name, "templates", "0a1b2c") for name in (long_a, long_b)}
    assert len(ids) == 2
    assert all(ROLE_ID.fullmatch(i) and i.endswith("_templates_0a1b2c") for i in ids)
