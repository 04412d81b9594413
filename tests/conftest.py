"""Shared test helpers."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout (design docs, reference tables, fixtures)."""
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} is missing: the tests need ../shared beside the checkout")
    return SHARED


def _strict(schema: dict) -> dict:
    """The CRD schema with unknown fields refused (kubectl's default --validate=strict)."""
    schema = copy.deepcopy(schema)

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@pytest.fixture(scope="session")
def crd_validator(shared_dir) -> jsonschema.Draft7Validator:
    """KubeRay's RayCluster CRD schema (../shared/fixtures/kuberay-v*), strict."""
    [path] = (shared_dir / "fixtures").glob("kuberay-v*/ray.io_rayclusters.yaml")
    crd = yaml.safe_load(path.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))
