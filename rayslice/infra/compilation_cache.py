"""The cluster's bucket for JAX's persistent compilation cache (`rayslice.compilation_cache`).

Every host's jobs cache their compiled steps in a folder of this bucket, so a step compiled once
is loaded by every host and by every later run: a job resubmitted after a preemption, or started
on a new slice, skips its compilation. Its configuration follows JAX's guide for a cache on
Google Cloud ("Persistent compilation cache", https://docs.jax.dev/en/latest/persistent_compilation_cache.html):
a bucket in the workload's region and project, the Standard storage class, no replication, the
shortest soft delete and an age-based Delete rule, since the cache itself never evicts anything.

Only the hosts' account may read and write its objects (`ClusterIdentity`, given `name`); JAX
runs what it loads from the cache, so nothing else may write there. Fields, with pulumi-gcp's
``gcp.storage.Bucket`` reference (https://www.pulumi.com/registry/packages/gcp/api-docs/storage/bucket/)
and Cloud Storage's JSON API bucket resource (https://cloud.google.com/storage/docs/json_api/v1/buckets):

- ``name``: globally unique and publicly visible, so it carries neither the project nor the
  cluster's name (Google's "Bucket names": "Don't use user IDs, email addresses, project names,
  project numbers, or any personally identifiable information"): ``rayslice-xla-`` and a
  `random.RandomId` kept in the stack's state; the labels say whose it is.
- ``location``: the region of the cluster's zone (JAX's guide: "the same region as where the
  workload will run"); ``storage_class`` ``STANDARD`` (the guide's choice).
- ``uniform_bucket_level_access`` and ``public_access_prevention: enforced``: IAM alone decides
  who reads it, and it never becomes public.
- ``soft_delete_policy.retention_duration_seconds`` 0: "To disable the soft delete policy on a
  bucket, this field must be set to 0" (pulumi-gcp); JAX's guide asks for the shortest, and a
  cache's deleted entries are worth nothing.
- ``lifecycle_rules``: Delete at `ENTRY_MAX_AGE_DAYS` (``condition.age``, days since creation;
  the guide's "Use age for the lifecycle condition and Delete for the action"). A host that
  misses a deleted entry compiles and writes it again.
- ``force_destroy``: ``pulumi destroy`` deletes the bucket with its entries ("When deleting a
  bucket, this boolean option will delete all contained objects", pulumi-gcp).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_random as random

from rayslice import catalog, compilation_cache
from rayslice.infra.labels import resource_labels
from rayslice.spec import ClusterSpec

BUCKET_PREFIX = "rayslice-xla-"
NAME_BYTES = 8  # 16 hex characters after the prefix: 29 of the 63 a bucket name may have
ENTRY_MAX_AGE_DAYS = 30
STORAGE_CLASS = "STANDARD"
PUBLIC_ACCESS_PREVENTION = "enforced"


def wanted(spec: ClusterSpec) -> bool:
    """Whether `spec`'s cluster gets the bucket: the jax preset's hosts read it (its lock carries
    JAX's gs:// reader); the xla preset's PyTorch/XLA has a cache of its own, not set up here."""
    return spec.preset == "jax"


@dataclass(frozen=True)
class CompilationCacheBucketArgs:
    spec: ClusterSpec


class CompilationCacheBucket(pulumi.ComponentResource):
    """The bucket; `name` for the hosts' grant, `location` for the hosts' metadata."""

    name: pulumi.Output[str]
    location: pulumi.Output[str]  # gs://<name>/<compilation_cache.FOLDER>, where JAX caches

    def __init__(
        self, name: str, args: CompilationCacheBucketArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("rayslice:infra:CompilationCacheBucket", name, None, opts)
        spec = args.spec
        if spec.zone is None:  # `spec.load` requires one unless the simulator asked it not to
            raise AssertionError("a cloud cluster has a zone")
        child = pulumi.ResourceOptions(parent=self)
        suffix = random.RandomId(f"{name}-name", byte_length=NAME_BYTES, opts=child)
        bucket = gcp.storage.Bucket(
            f"{name}-bucket",
            name=suffix.hex.apply(lambda hex_: f"{BUCKET_PREFIX}{hex_}"),
            project=spec.project,
            location=catalog.region_of(spec.zone).upper(),
            storage_class=STORAGE_CLASS,
            uniform_bucket_level_access=True,
            public_access_prevention=PUBLIC_ACCESS_PREVENTION,
            soft_delete_policy=gcp.storage.BucketSoftDeletePolicyArgs(retention_duration_seconds=0),
            lifecycle_rules=[
                gcp.storage.BucketLifecycleRuleArgs(
                    action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
                    condition=gcp.storage.BucketLifecycleRuleConditionArgs(age=ENTRY_MAX_AGE_DAYS),
                )
            ],
            force_destroy=True,
            labels=resource_labels(spec, "compilation-cache"),
            opts=child,
        )
        self.name = bucket.name
        self.location = bucket.name.apply(compilation_cache.bucket_location)
        # Repeated from the annotations: registered outputs are what `pulumi stack` shows.
        self.register_outputs({"name": self.name, "location": self.location})
