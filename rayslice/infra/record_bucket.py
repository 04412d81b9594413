"""The record's GCS bucket (`rayslice.observability.record`): declared apart from any cluster, kept
by `pulumi destroy`.

A cluster's record must outlive the cluster. The VM programs (`rayslice.infra.hosts`) declare
one with each cluster (`cluster_record`) unless the stack names an existing one
(``recordBucket``, e.g. one declared with `RecordBucket` in a stack of its own, or the bucket an
earlier deployment of this stack left) or turns it off (``recordBucket: none``); every host, the
head and the controller write under ``clusters/<cluster>/<run id>/`` there as they run
(`rayslice.observability.shipper`), the run id a `random.RandomId` that lives as long as the
stack's resources. Give its ``gs://`` URL (the stack output ``record``) to `rayslice run`
(``RAYSLICE_RECORD``), `rayslice history` and `rayslice goodput` (``--record``). Whatever
declares it, the bucket is declared with Pulumi's
``retainOnDelete`` resource option: "Pulumi will not call through to the resource provider's
Delete method when deleting or replacing the resource during pulumi up or pulumi destroy"
(pulumi.com/docs/iac/concepts/resources/options/retainondelete). Not ``protect``, which would
make every `pulumi destroy` of a stack holding it fail.

The bucket's fields, as pulumi-gcp 10.2's ``gcp.storage.Bucket`` names them (its ``BucketArgs``):

- ``lifecycle_rules``: one rule, action ``Delete`` at condition ``age`` = `RecordBucketArgs.keep_days`
  (Cloud Storage's Object Lifecycle Management: age counts days since an object's creation);
  that is how long a record is kept;
- ``retention_policy`` (``retention_period`` in seconds, a string in pulumi-gcp) only with
  `RecordBucketArgs.locked_days`: no object can be deleted or replaced before that age. The record
  writes every object once, so a writer never trips over it;
- ``uniform_bucket_level_access`` (IAM only, no object ACLs), ``public_access_prevention``
  ``enforced`` and no ``force_destroy``: a record holds logs.

Who may write and read is IAM on the bucket (``gcp.storage.BucketIAMMember``), least privilege:
`writers` get ``roles/storage.objectCreator`` (create objects; the record's writers only write,
each object once, and never read, overwrite or delete one), `readers` get
``roles/storage.objectViewer`` (list and read: `rayslice history`). A cluster's own accounts get
their grant from `rayslice.infra.identity` (the same role, on this bucket alone), so that the
hosts boot only after it, each with an IAM condition on the objects' names (`object_condition`):
the hosts' account (every Ray job's) may create objects under ``<cluster prefix>/hosts/`` only,
the controller's under ``<cluster prefix>/events/`` and its own VM's ``hosts/<vm>/`` only, so no
job can forge the controller's decisions, a job's record written by `rayslice run`, or another
cluster's record. `writers` (the accounts that run `rayslice run`) get no condition: they are the
operators' own. Not verified against real GCP.

The bucket's name, when a cluster declares it: ``rayslice-record-`` and a `random.RandomId`
(globally unique, and without the project's or the cluster's name, as Google's "Bucket names"
asks); its location is the cluster's region.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import pulumi
import pulumi_gcp as gcp
import pulumi_random as random

from rayslice import catalog
from rayslice.errors import InvalidInput
from rayslice.infra.labels import resource_labels
from rayslice.observability import record
from rayslice.spec import RECORD_OFF, ClusterSpec

WRITER_ROLES = ("roles/storage.objectCreator",)
READER_ROLES = ("roles/storage.objectViewer",)
DEFAULT_KEEP_DAYS = 90
SECONDS_PER_DAY = 86_400
BUCKET_PREFIX = "rayslice-record-"
NAME_BYTES = 8  # 16 hex characters after the prefix
RUN_ID_BYTES = 4  # a cluster's run id: 8 hex characters


@dataclass(frozen=True)
class RecordBucketArgs:
    """The bucket's name (globally unique), project, location (a region such as ``us-east5``),
    how long records are kept, and who writes and reads them (IAM members, e.g.
    ``serviceAccount:EMAIL`` or ``user:EMAIL``)."""

    name: pulumi.Input[str]
    project: str | None  # None: the provider's project
    location: str
    keep_days: int = DEFAULT_KEEP_DAYS
    locked_days: int | None = None  # a retention policy: no object deleted before this age
    writers: Sequence[pulumi.Input[str]] = ()
    readers: Sequence[pulumi.Input[str]] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.keep_days < 1:
            raise InvalidInput(f"keep_days must be at least 1 (days a record is kept), got {self.keep_days}")
        if self.locked_days is not None and not 1 <= self.locked_days <= self.keep_days:
            raise InvalidInput(
                f"locked_days must be between 1 and keep_days ({self.keep_days}), got {self.locked_days}: "
                "a record cannot be deleted by its lifecycle rule before its retention ends"
            )


class RecordBucket(pulumi.ComponentResource):
    """The record bucket and its IAM bindings; `url` is what ``--record`` and ``RAYSLICE_RECORD`` take."""

    url: pulumi.Output[str]

    def __init__(self, name: str, args: RecordBucketArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:index:RecordBucket", name, None, opts)
        retention = (
            gcp.storage.BucketRetentionPolicyArgs(retention_period=str(args.locked_days * SECONDS_PER_DAY))
            if args.locked_days is not None
            else None
        )
        self.bucket = gcp.storage.Bucket(
            f"{name}-bucket",
            name=args.name,
            project=args.project,
            location=args.location,
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            force_destroy=False,
            lifecycle_rules=[
                gcp.storage.BucketLifecycleRuleArgs(
                    action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
                    condition=gcp.storage.BucketLifecycleRuleConditionArgs(age=args.keep_days),
                )
            ],
            retention_policy=retention,
            labels=dict(args.labels),
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
        )
        grants = [(m, r) for m in args.writers for r in WRITER_ROLES]
        grants += [(m, r) for m in args.readers for r in READER_ROLES]
        for index, (member, role) in enumerate(grants):
            gcp.storage.BucketIAMMember(
                f"{name}-iam-{index}",
                bucket=self.bucket.name,
                role=role,
                member=member,
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.url = self.bucket.name.apply(lambda bucket: f"gs://{bucket}")
        # What a user needs next: the URL for --record and RAYSLICE_RECORD.
        self.register_outputs({"url": self.url})


# The name IAM Conditions see for a Cloud Storage object ("Resource attributes for IAM
# Conditions", https://cloud.google.com/iam/docs/conditions-resource-attributes, resource name
# format of Cloud Storage objects). "Using IAM Conditions on buckets"
# (https://cloud.google.com/storage/docs/access-control/using-iam-conditions) gives the prefix form
# resource.name.startsWith("projects/_/buckets/BUCKET/objects/PREFIX"); conditions need uniform
# bucket-level access, which a `RecordBucket` has.
OBJECT_NAME = "projects/_/buckets/{bucket}/objects/{object}"


def object_condition(bucket: str, prefixes: Sequence[str]) -> str:
    """CEL expression true for the objects of `bucket` whose names start with one of `prefixes`
    (each a "folder" of the record, ending in "/", so that ``hosts/a`` never admits ``hosts/ab``)."""
    if not prefixes or any(not p.endswith("/") for p in prefixes):
        raise ValueError(f"object prefixes must be given and end with '/': {list(prefixes)}")
    return " || ".join(
        f'resource.name.startsWith("{OBJECT_NAME.format(bucket=bucket, object=prefix)}")'
        for prefix in prefixes
    )


@dataclass(frozen=True)
class ClusterRecord:
    """Where one cluster's record goes: its bucket's name and the cluster's prefix in it (for the
    accounts' conditional grants), and its gs:// location (for the machines' metadata)."""

    bucket: pulumi.Output[str]
    prefix: pulumi.Output[str]  # clusters/<cluster>/<run id>
    location: pulumi.Output[str]  # gs://BUCKET/clusters/<cluster>/<run id>


def cluster_record(name: str, spec: ClusterSpec, opts: pulumi.ResourceOptions) -> ClusterRecord | None:
    """`spec`'s record: in the bucket ``recordBucket`` names, else in a `RecordBucket` declared
    here (kept by `pulumi destroy`); None with ``recordBucket: none``."""
    if spec.record_bucket == RECORD_OFF:
        return None
    if spec.zone is None:  # `spec.load` requires one unless the simulator asked it not to
        raise AssertionError("a cloud cluster has a zone")
    if spec.record_bucket is not None:
        bucket = pulumi.Output.from_input(spec.record_bucket)
    else:
        suffix = random.RandomId(f"{name}-name", byte_length=NAME_BYTES, opts=opts)
        declared = RecordBucket(
            name,
            RecordBucketArgs(
                name=suffix.hex.apply(lambda hex_: f"{BUCKET_PREFIX}{hex_}"),
                project=spec.project,
                location=catalog.region_of(spec.zone).upper(),
                labels=resource_labels(spec, "record"),
            ),
            opts,
        )
        bucket = declared.bucket.name
    run = random.RandomId(f"{name}-run", byte_length=RUN_ID_BYTES, opts=opts)
    prefix = run.hex.apply(partial(record.cluster_prefix, spec.name))
    location = pulumi.Output.all(bucket, prefix).apply(lambda known: f"gs://{known[0]}/{known[1]}")
    return ClusterRecord(bucket=bucket, prefix=prefix, location=location)
