"""The record's GCS bucket (`rayslice.observability.record`): declared apart from any cluster, kept
by `pulumi destroy`.

A cluster's record must outlive the cluster, so its bucket is not one of the cluster's
resources: declare `RecordBucket` once, in its own stack or beside your clusters in your own
program (docs/history.md), and give its ``gs://`` URL to `rayslice run` (``RAYSLICE_RECORD``),
`rayslice history` and `rayslice goodput` (``--record``). Its bucket is declared with Pulumi's
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
`writers` get ``roles/storage.objectCreator`` (create objects; `rayslice run` only writes, each
object once, and never reads, overwrites or deletes one), `readers` get
``roles/storage.objectViewer`` (list and read: `rayslice history`). Not verified against real GCP.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

from rayslice.errors import InvalidInput

WRITER_ROLES = ("roles/storage.objectCreator",)
READER_ROLES = ("roles/storage.objectViewer",)
DEFAULT_KEEP_DAYS = 90
SECONDS_PER_DAY = 86_400


@dataclass(frozen=True)
class RecordBucketArgs:
    """The bucket's name (globally unique), project, location (a region such as ``us-east5``),
    how long records are kept, and who writes and reads them (IAM members, e.g.
    ``serviceAccount:EMAIL`` or ``user:EMAIL``)."""

    name: str
    project: str
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
