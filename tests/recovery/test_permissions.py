"""The controller's roles hold exactly the permissions of the methods it calls."""

from __future__ import annotations

import re

import pytest

from rayslice.local.google.cloud_api.routes import ROUTES
from rayslice.recovery import permissions

STARTS_WITH = re.compile(r'resource\.name\.startsWith\("([^"]+)"\)')


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
    assert set(verbs) <= called
    for method in called & set(verbs):
        assert f"compute.instanceGroupManagers.{verbs[method]}" in permissions.permissions("compute")
    assert permissions.permissions("gke") == () and permissions.role_parts("gke") == ()


@pytest.mark.parametrize("platform", ["tpu-vm", "compute"])
def test_each_permission_is_in_exactly_one_role(platform: str) -> None:
    parts = permissions.role_parts(platform)
    every = [p for part in parts for p in part.permissions]
    assert len(every) == len(set(every)) == len(permissions.permissions(platform))
    assert all(re.fullmatch(r"[a-z]{1,9}", part.key) for part in parts)
    assert len({part.key for part in parts}) == len(parts)


def test_only_the_template_grant_is_narrowed_and_the_rest_is_said_to_be_unnarrowed() -> None:
    narrowed = {
        p for part in permissions.ROLE_PARTS["compute"] if part.templates_only for p in part.permissions
    }
    assert narrowed == {"compute.instanceTemplates.useReadOnly"}
    assert not any(part.templates_only for part in permissions.role_parts("tpu-vm"))
    # Every unnarrowed compute permission is named in the explanation docs/recovery.md repeats.
    for part in permissions.role_parts("compute"):
        if not part.templates_only:
            for permission in part.permissions:
                assert permission.split(".", 1)[1].split(".")[0] in permissions.UNNARROWED["compute"]
    assert set(permissions.UNNARROWED) == {"tpu-vm", "compute"}


def test_the_condition_names_exactly_this_clusters_templates() -> None:
    prefixes = [f"train-slice-{i}-" for i in range(11)]
    condition = permissions.template_condition("proj-1", prefixes)
    found = STARTS_WITH.findall(condition)
    assert found == [f"projects/proj-1/global/instanceTemplates/{p}" for p in prefixes]
    assert condition.count("||") == len(prefixes) - 1

    def granted(template: str) -> bool:  # CEL's startsWith, for the expressions above
        return any(f"projects/proj-1/global/instanceTemplates/{template}".startswith(p) for p in found)

    assert granted("train-slice-1-20250101000000000000000001")
    assert granted("train-slice-10-20250101000000000000000001")
    assert not granted("trainx-slice-0-20250101")  # another cluster
    assert not granted("train-slice-11-20250101")  # a slice this cluster does not have
    assert not any(f.startswith("projects/other/") for f in found)


@pytest.mark.parametrize("prefixes", [[], ["train-slice-0"]])
def test_a_condition_without_a_trailing_hyphen_or_prefixes_is_refused(prefixes: list[str]) -> None:
    with pytest.raises(ValueError):
        permissions.template_condition("proj-1", prefixes)
