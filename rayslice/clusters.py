"""The cluster a command acts on when the user names none: the one a registered finder reports.

`rayslice run` without an address and `rayslice status` without a stack file or ``--set`` keys
both act on the simulated cluster of the default state dir, if one is up. The simulator
registers its finder under the ``rayslice.clusters`` entry point, so neither command imports
it, and a client installed without the simulator finds nothing. One finder answers both: where
the Ray dashboard is and which token goes there (`run`), and the spec the cluster was made
from plus how its cloud API is reached (`status`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

CLUSTERS_GROUP = "rayslice.clusters"


@dataclass(frozen=True)
class CloudAccess:
    """How the cluster's cloud API is reached: a credentials file (a service-account key, as
    ``GOOGLE_APPLICATION_CREDENTIALS`` names one) and the endpoint overrides, variable name ->
    base URL, as gcloud reads them (``CLOUDSDK_API_ENDPOINT_OVERRIDES_*``)."""

    credentials_file: Path
    endpoints: Mapping[str, str]


@dataclass(frozen=True)
class FoundCluster:
    """A cluster a finder found: its dashboard and token, the stack config it was made from
    (``rayslice`` keys, with its project and zone), its cloud API (None when that cannot be
    reached, with `cloud_problem` saying why), where its record is kept, and where it was found, for
    messages."""

    where: str
    dashboard_url: str
    token_file: Path | None
    config: Mapping[str, Any] = field(default_factory=dict)
    cloud: CloudAccess | None = None
    cloud_problem: str = ""
    record: str | None = None  # the cluster's record (rayslice.observability.record), if it keeps one


def find() -> FoundCluster | None:
    """The first cluster a registered finder reports; None when none does (or none is registered)."""
    for entry in entry_points(group=CLUSTERS_GROUP):
        finder: Callable[[], FoundCluster | None] = entry.load()
        if (found := finder()) is not None:
            return found
    return None
