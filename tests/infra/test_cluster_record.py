"""The record of a VM cluster in its program: a bucket that `pulumi destroy` keeps (or one the
stack names, or none), every machine told where its record goes, and the machines' accounts
allowed to create objects there, under their own folders only, and nothing more
(`rayslice.infra.record_bucket`)."""

from __future__ import annotations

import re

import pytest

from rayslice import spec
from rayslice.errors import SpecError
from rayslice.local.google.cloud_api.iam import EmulatedIam
from rayslice.local.google.cloud_api.routes import ApiError
from rayslice.names import ATTR_RECORD, ATTR_ROLE
from tests.infra.test_compilation_cache import BUCKET, BUCKET_MEMBER, INSTANCE, SLEEP, TEMPLATE, V2VM
from tests.infra.test_infra_variants import _run as run_variant

HOSTS = "serviceAccount:train-hosts@my-gcp-project.iam.gserviceaccount.com"
CONTROLLER = "serviceAccount:train-controller@my-gcp-project.iam.gserviceaccount.com"
CREATE_ONLY = "roles/storage.objectCreator"  # storage.objects.create, and nothing that reads or deletes


def _run(**overrides: str):
    """A cluster named train with a head VM and the recovery controller (Spot)."""
    return run_variant(name="train", capacity="spot", **overrides)


def _records(run):
    return [b for b in run.of_type(BUCKET) if b.inputs["name"].startswith("rayslice-record-")]


def _machines(run, hosts_type: str):
    """Every machine's metadata: the slices' hosts, the head VM, the controller VM."""
    return [r.inputs["metadata"] for r in run.of_type(hosts_type) + run.of_type(INSTANCE)]


@pytest.mark.parametrize("platform, hosts_type", [("tpu-vm", V2VM), ("compute", TEMPLATE)])
def test_the_bucket_outlives_the_cluster_and_every_machine_may_only_add_to_it(platform, hosts_type):
    run = _run(platform=platform)
    (bucket,) = _records(run)
    name = bucket.inputs["name"]
    assert re.fullmatch(r"rayslice-record-[0-9a-f]{16}", name)  # no project or cluster name in it
    assert bucket.retain_on_delete  # `pulumi destroy` leaves it, with the record
    assert bucket.inputs["forceDestroy"] is False and bucket.inputs["location"] == "US-EAST5"
    assert bucket.inputs["publicAccessPrevention"] == "enforced"
    grants = [g for g in run.of_type(BUCKET_MEMBER) if g.inputs["bucket"] == name]
    assert sorted((g.inputs["member"], g.inputs["role"]) for g in grants) == [
        (CONTROLLER, CREATE_ONLY),
        (HOSTS, CREATE_ONLY),  # the head VM runs as the hosts' account
    ]
    # No machine boots before its grant: the IAM wait comes after every grant.
    (wait,) = run.of_type(SLEEP)
    assert {g.urn for g in grants} <= set(wait.dependencies)
    # Every machine, the controller's VM too, is told the cluster's prefix in that bucket.
    location = run.value["record"]
    assert re.fullmatch(rf"gs://{name}/clusters/train/[0-9a-f]{{8}}", location)
    machines = _machines(run, hosts_type)
    assert len(machines) >= 3 and all(m[ATTR_RECORD] == location for m in machines)
    assert {m.get(ATTR_ROLE) for m in machines} >= {"head-vm", "controller-vm"}


def test_a_bucket_the_stack_names_is_written_to_and_not_declared():
    run = _run(platform="compute", recordBucket="team-records", allowForeignRecordBucket="true")
    assert not _records(run)
    grants = [g for g in run.of_type(BUCKET_MEMBER) if g.inputs["bucket"] == "team-records"]
    assert sorted((g.inputs["member"], g.inputs["role"]) for g in grants) == [
        (CONTROLLER, CREATE_ONLY),
        (HOSTS, CREATE_ONLY),
    ]
    assert re.fullmatch(r"gs://team-records/clusters/train/[0-9a-f]{8}", run.value["record"])
    assert all(m[ATTR_RECORD] == run.value["record"] for m in _machines(run, TEMPLATE))


def test_with_no_record_nothing_is_declared_granted_or_told():
    run = _run(platform="tpu-vm", recordBucket="none")
    assert not _records(run) and run.value["record"] is None
    assert all(
        g.inputs["role"] != CREATE_ONLY or g.inputs["member"] == HOSTS for g in run.of_type(BUCKET_MEMBER)
    )
    assert len(run.of_type(BUCKET_MEMBER)) == 2  # the compilation cache's two, for the hosts
    assert not any(ATTR_RECORD in m for m in _machines(run, V2VM))


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"recordBucket": "Team_Records"}, "is not a Cloud Storage bucket name"),
        ({"recordBucket": "gs://team-records"}, "is not a Cloud Storage bucket name"),
        ({"recordBucket": "ab"}, "is not a Cloud Storage bucket name"),
        ({"recordBucket": "team-records", "platform": "gke"}, "applies to the VM platforms"),
    ],
)
def test_a_record_bucket_that_cannot_be_is_refused_before_anything_is_created(raw, message):
    with pytest.raises(SpecError, match=message):
        spec.load({"acceleratorType": "v6e-16", **raw}, require_zone=False)


def test_no_record_is_a_value_every_platform_takes():
    for platform in ("gke", "compute", "tpu-vm"):
        loaded = spec.load(
            {"acceleratorType": "v6e-16", "platform": platform, "recordBucket": "none"}, require_zone=False
        )
        assert loaded.record_bucket == spec.RECORD_OFF


def test_each_machines_grant_admits_only_its_own_folders_of_this_clusters_record():
    """The grants' IAM conditions, evaluated by the emulated IAM as Google documents them: the
    hosts' account (every Ray job) only under hosts/, the controller's only under events/ and its
    own VM's folder; neither in jobs/, cluster.json or another cluster's record."""
    run = _run(platform="compute")
    (bucket,) = _records(run)
    name = bucket.inputs["name"]
    prefix = run.value["record"].removeprefix(f"gs://{name}/")
    iam = EmulatedIam()
    for grant in run.of_type(BUCKET_MEMBER):
        if grant.inputs["bucket"] == name:
            iam.bind(
                grant.inputs["member"], ["storage.objects.create"], grant.inputs["condition"]["expression"]
            )

    def may_create(member: str, key: str) -> bool:
        try:
            iam.authorize(member, "storage.objects.insert", None, {"bucket": name, "object": key})
        except ApiError:
            return False
        return True

    assert may_create(HOSTS, f"{prefix}/hosts/train-slice-0-w0/boot.log/000000000000-000000000010-0a1b2c3d")
    assert may_create(CONTROLLER, f"{prefix}/events/train-controller/000000000000-000000000010-0a1b2c3d")
    assert may_create(CONTROLLER, f"{prefix}/hosts/train-controller/boot.log/000000000000-000000000010-0a1b")
    for forged in ("events/train-controller/000000000000-999999999999", "cluster.json", "ended.json"):
        assert not may_create(HOSTS, f"{prefix}/{forged}")
    assert not may_create(HOSTS, f"{prefix}/jobs/raysubmit_1/submitted.json")
    assert not may_create(HOSTS, "clusters/other/00000000/hosts/h/boot.log")  # another cluster's
    assert not may_create(HOSTS, f"{prefix}/hostsx/h")  # a folder, not a name's start
    assert not may_create(CONTROLLER, f"{prefix}/hosts/train-slice-0-w0/boot.log")
    assert not may_create(CONTROLLER, f"{prefix}/jobs/raysubmit_1/ended.json")


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"recordBucket": "acme-terraform-state"}, "set allowForeignRecordBucket=true"),
        (
            {"packageIndex": "https://pypi.corp.example/simple", "packageIndexCredentialsSecret": "prod-db"},
            "set allowForeignPackageIndexSecret=true",
        ),
    ],
)
def test_naming_a_bucket_or_secret_the_stack_does_not_declare_needs_its_opt_in(raw, message):
    """A stack file that names someone else's bucket or secret would extend every job's account
    to it: refused without the key that says so, before anything is created."""
    with pytest.raises(SpecError, match=message):
        spec.load({"acceleratorType": "v6e-16", **raw}, require_zone=False)
    opted = {"allowForeignRecordBucket": "true", "allowForeignPackageIndexSecret": "true"}
    spec.load({"acceleratorType": "v6e-16", **raw, **opted}, require_zone=False)
