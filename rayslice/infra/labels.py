"""GCP labels rayslice puts on every resource that takes labels.

`spec.labels` are the user's; rayslice adds the ones below (the spec leaves room for them) so
that a cluster's resources can be found and billed together. rayslice's keys win a clash: the
role and cluster labels are what `gcloud ... --filter` commands in the docs rely on.
"""

from __future__ import annotations

from rayslice.spec import ClusterSpec

LABEL_CLUSTER = "rayslice-cluster"
LABEL_ROLE = "rayslice-role"
LABEL_SLICE = "rayslice-slice"
LABEL_MANAGED_BY = "managed-by"


def resource_labels(spec: ClusterSpec, role: str, slice_index: int | None = None) -> dict[str, str]:
    """The labels of one resource: the user's plus cluster, role, slice index and manager."""
    labels = {**spec.labels, LABEL_CLUSTER: spec.name, LABEL_ROLE: role, LABEL_MANAGED_BY: "rayslice"}
    if slice_index is not None:
        labels[LABEL_SLICE] = str(slice_index)
    return labels
