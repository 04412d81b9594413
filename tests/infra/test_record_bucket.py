"""The record bucket under the cloud twin's mocks: kept by `pulumi destroy` (retainOnDelete), its
records deleted after their days, private, and written by whom it names (docs/history.md)."""

from __future__ import annotations

import pytest

from rayslice.errors import InvalidInput
from rayslice.infra.mocks import run_offline
from rayslice.infra.record_bucket import RecordBucket, RecordBucketArgs

BUCKET = "gcp:storage/bucket:Bucket"
IAM = "gcp:storage/bucketIAMMember:BucketIAMMember"
HOSTS = "serviceAccount:rayslice-hosts@p1.iam.gserviceaccount.com"


def declare(**extra: object) -> object:
    args = RecordBucketArgs(name="rayslice-record-p1", project="p1", location="us-east5", **extra)  # type: ignore[arg-type]
    return RecordBucket("record", args).url


def test_the_bucket_outlives_a_destroy_and_keeps_records_for_their_days() -> None:
    run = run_offline(lambda: declare(writers=[HOSTS], readers=["user:ops@example.com"]))
    assert run.value == "gs://rayslice-record-p1"
    [bucket] = run.of_type(BUCKET)
    assert bucket.retain_on_delete and bucket.parent.endswith("::record")
    assert bucket.inputs["lifecycleRules"] == [{"action": {"type": "Delete"}, "condition": {"age": 90}}]
    assert bucket.inputs["uniformBucketLevelAccess"] is True
    assert bucket.inputs["publicAccessPrevention"] == "enforced" and bucket.inputs["forceDestroy"] is False
    assert "retentionPolicy" not in bucket.inputs
    grants = {(r.inputs["member"], r.inputs["role"]) for r in run.of_type(IAM)}
    assert grants == {
        (HOSTS, "roles/storage.objectCreator"),  # writes only, never reads or deletes
        ("user:ops@example.com", "roles/storage.objectViewer"),
    }
    assert not any(r.retain_on_delete for r in run.of_type(IAM))  # bindings go with the stack


def test_a_locked_retention_keeps_every_object_its_days() -> None:
    [bucket] = run_offline(lambda: declare(keep_days=30, locked_days=7)).of_type(BUCKET)
    assert bucket.inputs["retentionPolicy"] == {"retentionPeriod": str(7 * 86_400)}


@pytest.mark.parametrize("extra", [{"keep_days": 0}, {"keep_days": 5, "locked_days": 6}, {"locked_days": 0}])
def test_days_that_cannot_hold_are_refused(extra: dict[str, int]) -> None:
    with pytest.raises(InvalidInput):
        RecordBucketArgs(name="b", project="p", location="us-east5", **extra)  # type: ignore[arg-type]
