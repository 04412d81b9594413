"""The VM platform table (`rayslice.platforms`) is the one place a difference between ``compute``
and ``tpu-vm`` is declared: the entries are consistent, and no other module compares a
platform's name to decide how a VM platform behaves."""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

import pytest

import rayslice
import rayslice.infra.gke.nodes
from rayslice import catalog, names, platforms
from rayslice.capacity_table import CAPACITIES
from rayslice.platforms import (
    COMPUTE,
    COMPUTE_TPU_ATTRIBUTES,
    SLICE_RESOURCES,
    TPU_API_ATTRIBUTES,
    TPU_VM,
    VM_PLATFORMS,
)

PACKAGE = Path(rayslice.__file__).resolve().parent
# The catalog and the spec's rules say which shapes and fields each platform offers (GKE
# included); that is what a platform sells, not how rayslice treats a VM platform's slices.
SHAPE_RULES = {"catalog.py", "spec/rules.py"}


def test_every_platform_but_gke_is_a_vm_platform():
    assert set(VM_PLATFORMS) == set(catalog.PLATFORMS) - {"gke"}
    assert all(VM_PLATFORMS[name].name == name for name in VM_PLATFORMS)


@pytest.mark.parametrize("platform", VM_PLATFORMS.values(), ids=lambda p: p.name)
def test_each_entry_names_a_known_resource_and_known_attributes(platform):
    assert platform.slice_resource in SLICE_RESOURCES
    assert platform.google_attributes in (TPU_API_ATTRIBUTES, COMPUTE_TPU_ATTRIBUTES)
    # A host learns its worker from Google's attributes (a worker number and the host list) or
    # from the names rayslice gave it.
    google_identity = "worker-network-endpoints" in platform.google_attributes and bool(
        {"worker-id", "tpu-env", "agent-worker-number"} & set(platform.google_attributes)
    )
    assert google_identity or platform.rayslice_names_hosts


def test_the_tpu_api_identifies_its_workers_compute_hosts_get_rayslices_names_as_well():
    """Compute Engine: one published log shows Google's attributes (platforms.py), the Compute
    Engine docs none; so both are there, and the boot script reads one or the other."""
    assert TPU_VM.google_attributes == TPU_API_ATTRIBUTES and not TPU_VM.rayslice_names_hosts
    assert COMPUTE.google_attributes == COMPUTE_TPU_ATTRIBUTES and COMPUTE.rayslice_names_hosts
    assert "worker-id" in COMPUTE_TPU_ATTRIBUTES and "agent-worker-number" not in COMPUTE_TPU_ATTRIBUTES


def test_compute_hosts_get_the_slice_and_its_host_names_tpu_vm_hosts_nothing():
    assert COMPUTE.identity_attributes("c-slice-1", 3) == {
        names.ATTR_SLICE_NAME: "c-slice-1",
        names.ATTR_SLICE_HOSTS: "c-slice-1-w0,c-slice-1-w1,c-slice-1-w2",
    }
    assert COMPUTE.identity_attributes("c-slice-1", 3)[names.ATTR_SLICE_HOSTS].split(",") == [
        names.host_name("c-slice-1", w) for w in range(3)
    ]
    assert TPU_VM.identity_attributes("c-slice-1", 3) == {}


def _platform_name_comparisons(source: str, names: Collection[str] = tuple(VM_PLATFORMS)) -> list[int]:
    """Lines of `source` that branch on one of `names` (by default a VM platform's): a comparison
    with it (``==``, ``in``), a ``case`` of it in a ``match``, or a dict keyed by it
    (``{"compute": ...}[p]``, ``.get(p)`` on one, or such a table under a name)."""

    def named(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value in names

    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            operands += [e for o in operands if isinstance(o, (ast.Tuple, ast.List, ast.Set)) for e in o.elts]
            if any(named(o) for o in operands):
                found.add(node.lineno)
        elif (isinstance(node, ast.MatchValue) and named(node.value)) or (
            isinstance(node, ast.Dict) and any(named(key) for key in node.keys)
        ):
            found.add(node.lineno)
    return sorted(found)


def test_no_module_outside_the_table_branches_on_a_vm_platform_name():
    modules = [
        p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).as_posix() not in SHAPE_RULES
    ]
    assert Path(platforms.__file__) in modules
    found = []
    for path in modules:
        name = path.relative_to(PACKAGE.parent).as_posix()
        found += [f"{name}:{line}" for line in _platform_name_comparisons(path.read_text())]
    assert found == []


# Where a capacity name may be compared: the table itself, nowhere else (the spec's model only
# declares the names the user may write).
CAPACITY_READERS = ("capacity_table.py",)


def test_infra_recovery_status_and_the_simulator_ask_the_capacity_table():
    """No module of infra, recovery (the controller, `status`, the permissions), the cloud twin or
    the simulator branches on a capacity name: each reads the stack's cell."""
    modules = [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if not p.relative_to(PACKAGE).as_posix().startswith(CAPACITY_READERS)
    ]
    assert Path(rayslice.infra.gke.nodes.__file__) in modules
    found = []
    for path in modules:
        name = path.relative_to(PACKAGE.parent).as_posix()
        found += [f"{name}:{line}" for line in _platform_name_comparisons(path.read_text(), CAPACITIES)]
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        'def f(spec):\n    return spec.platform == "compute"\n',
        'def f(spec):\n    if "tpu-vm" != spec.platform:\n        pass\n',
        'def f(spec):\n    return spec.platform in ("tpu-vm", "compute")\n',
        'match platform:\n    case "compute":\n        pass\n',
        'match platform:\n    case "gke" | "tpu-vm":\n        pass\n',
        'match spec:\n    case ("compute", hosts):\n        pass\n',
        'def f(spec):\n    return {"compute": 1, "tpu-vm": 2}[spec.platform]\n',
        'def f(spec):\n    return {"tpu-vm": 2}.get(spec.platform, 1)\n',
        'import x\nTABLE: dict[str, int] = {"compute": 1}\n',
    ],
)
def test_the_check_catches_a_branch_on_a_platform_name(source):
    assert _platform_name_comparisons(source) == [2]


@pytest.mark.parametrize(
    "source",
    [
        "def f(spec):\n    return VM_PLATFORMS[spec.platform].slice_resource\n",
        'def f(spec):\n    return {"gke": 1}.get(spec.platform)\n',  # GKE is not a VM platform
        'match platform:\n    case "gke":\n        pass\n',
    ],
)
def test_the_check_leaves_lookups_in_the_table_alone(source):
    assert _platform_name_comparisons(source) == []
