"""The emulated GKE (container v1) API: ``projects.locations.clusters.nodePools`` get and list,
the two calls `rayslice status` makes on ``platform=gke``.

The pools are the twin's (`rayslice.cloud.twin.CloudTwin.node_pools`, created from the program's
NodePool resources or by a test); their nodes live in the MIGs each pool names in
``instanceGroupUrls``, which the emulated Compute Engine API serves. A pool the twin does not
hold is a 404 NOT_FOUND, as Google answers.
"""

from __future__ import annotations

import copy
from typing import Any

from rayslice.local.google.cloud_api.project import EmulatedProject
from rayslice.local.google.cloud_api.routes import ApiError


class ContainerApi(EmulatedProject):
    """Node pools, read-only."""

    def pool_get(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        pool = self.state.node_pools.get((p["project"], p["location"], p["cluster"], p["name"]))
        if pool is None:
            raise ApiError(
                404,
                "NOT_FOUND",
                f"Not found: projects/{p['project']}/locations/{p['location']}/clusters/{p['cluster']}"
                f"/nodePools/{p['name']}.",
            )
        return copy.deepcopy(pool)

    def pool_list(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        return {"nodePools": self.state.node_pools_of(p["project"], p["location"], p["cluster"])}
