"""The controller's role holds exactly the permissions of the methods it calls."""

from __future__ import annotations

import re

from rayslice.local.cloud_api import ROUTES
from rayslice.recovery import permissions


def test_every_mutating_emulated_method_has_its_permission_and_nothing_broader() -> None:
    for platform, api in (("tpu-vm", "tpu"), ("compute", "compute")):
        granted = set(permissions.permissions(platform))
        assert not any(p.endswith((".setIamPolicy", ".list")) or "*" in p for p in granted)
        service = "tpu" if api == "tpu" else "compute"
        assert all(p.startswith(f"{service}.") for p in granted)
    assert {"tpu.nodes.create", "tpu.nodes.delete", "tpu.nodes.get"} <= set(permissions.permissions("tpu-vm"))
    # Each MIG method the controller calls maps to one permission of the role.
    verbs = {"get": "get", "delete": "delete", "insert": "create", "createInstances": "update"}
    called = {r.method_id.rsplit(".", 1)[-1] for r in ROUTES if ".instanceGroupManagers." in r.method_id}
    for method in called & set(verbs):
        assert f"compute.instanceGroupManagers.{verbs[method]}" in permissions.COMPUTE_MIG_PERMISSIONS
    assert permissions.permissions("gke") == ()


def test_the_condition_names_exactly_this_clusters_migs() -> None:
    condition = permissions.mig_condition("proj-1", "us-east5-b", "train", 2)
    names = re.findall(r'resource\.name == "([^"]+)"', condition)
    assert names == [
        "projects/proj-1/zones/us-east5-b/instanceGroupManagers/train-slice-0",
        "projects/proj-1/zones/us-east5-b/instanceGroupManagers/train-slice-1",
    ]
    assert condition.count("||") == 1 and "startsWith" not in condition
