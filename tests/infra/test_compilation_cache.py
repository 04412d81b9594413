"""The compilation cache's bucket: declared with JAX's recommended settings, readable and
writable by the hosts' account alone, named to every Ray host in its metadata
(`rayslice.infra.compilation_cache`)."""

from __future__ import annotations

import re

import pytest

from rayslice import compilation_cache
from rayslice.cloud import bodies
from rayslice.names import ATTR_COMPILATION_CACHE, ATTR_ROLE, HEAD_VM_ROLE
from tests.infra.test_infra_variants import _run as run_variant

BUCKET = "gcp:storage/bucket:Bucket"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
# The Pulumi type tokens these tests look for: the compute and TPU ones are the cloud bodies'
# (`rayslice.cloud.bodies`); the storage and time ones, which no request body needs, are here.
V2VM, INSTANCE, TEMPLATE = bodies.TPU_NODE, bodies.INSTANCE, bodies.TEMPLATE
SLEEP = "time:index/sleep:Sleep"
HOSTS = "serviceAccount:train-hosts@my-gcp-project.iam.gserviceaccount.com"


def _run(**overrides: str):
    """The program under the mocks, for a cluster named train (its hosts' account: HOSTS)."""
    return run_variant(name="train", **overrides)


def _caches(run):
    """The compilation cache's buckets among the run's (the cluster's record has one too)."""
    return [b for b in run.of_type(BUCKET) if b.inputs["name"].startswith("rayslice-xla-")]


def test_the_bucket_follows_jaxs_advice_for_a_cache_on_google_cloud():
    (bucket,) = _caches(_run(platform="tpu-vm"))
    inputs = bucket.inputs
    assert re.fullmatch(r"rayslice-xla-[0-9a-f]{16}", inputs["name"])  # no project or cluster name
    assert inputs["location"] == "US-EAST5"  # the cluster's region
    assert inputs["storageClass"] == "STANDARD"
    assert inputs["uniformBucketLevelAccess"] is True
    assert inputs["publicAccessPrevention"] == "enforced"
    assert inputs["softDeletePolicy"] == {"retentionDurationSeconds": 0}
    assert inputs["lifecycleRules"] == [{"action": {"type": "Delete"}, "condition": {"age": 30}}]
    assert inputs["forceDestroy"] is True
    assert inputs["labels"]["rayslice-cluster"] == "train"


@pytest.mark.parametrize("platform", ["tpu-vm", "compute"])
def test_only_the_hosts_account_reads_and_writes_it_before_any_host_boots(platform):
    run = _run(platform=platform, capacity="spot")  # a head VM and a recovery controller too
    (bucket,) = _caches(run)
    grants = [g for g in run.of_type(BUCKET_MEMBER) if g.inputs["bucket"] == bucket.inputs["name"]]
    assert sorted((g.inputs["member"], g.inputs["role"]) for g in grants) == [
        (HOSTS, "roles/storage.objectCreator"),
        (HOSTS, "roles/storage.objectViewer"),
    ]
    assert {g.inputs["bucket"] for g in grants} == {bucket.inputs["name"]}
    # Hosts boot after the IAM wait, which comes after every grant.
    (wait,) = run.of_type(SLEEP)
    assert {g.urn for g in grants} <= set(wait.dependencies)


@pytest.mark.parametrize("platform, hosts", [("tpu-vm", V2VM), ("compute", TEMPLATE)])
def test_every_ray_host_and_the_head_vm_find_the_cache_in_metadata_and_the_controller_does_not(
    platform, hosts
):
    run = _run(platform=platform, capacity="spot")
    (bucket,) = _caches(run)
    location = compilation_cache.bucket_location(bucket.inputs["name"])
    for host in run.of_type(hosts):
        assert host.inputs["metadata"][ATTR_COMPILATION_CACHE] == location
    by_role = {i.inputs["metadata"].get(ATTR_ROLE): i for i in run.of_type(INSTANCE)}
    assert by_role[HEAD_VM_ROLE].inputs["metadata"][ATTR_COMPILATION_CACHE] == location
    assert ATTR_COMPILATION_CACHE not in by_role["controller-vm"].inputs["metadata"]


def test_the_xla_preset_gets_no_bucket():
    run = _run(platform="tpu-vm", acceleratorType="v5p-16", zone="us-east5-a", preset="xla")
    assert not _caches(run) and all(
        g.inputs["role"] == "roles/storage.objectCreator" for g in run.of_type(BUCKET_MEMBER)
    )
    (vm,) = run.of_type(V2VM)
    assert ATTR_COMPILATION_CACHE not in vm.inputs["metadata"]
