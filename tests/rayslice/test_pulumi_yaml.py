"""Pulumi.yaml declares the config schema that rayslice.spec.KEYS defines, and nothing else."""

from __future__ import annotations

from pathlib import Path

import yaml

from rayslice import spec

PROJECT = Path(__file__).resolve().parents[2] / "Pulumi.yaml"
# Pulumi config declarations support only these types, and a declared key without a default
# is required by Pulumi: such keys stay undeclared (and are listed in a comment).
PULUMI_TYPES = {"string", "integer", "boolean", "array"}


def _declarable(key: spec.Key) -> bool:
    return key.type in PULUMI_TYPES and key.default is not None


def test_project_runs_the_infra_program():
    project = yaml.safe_load(PROJECT.read_text())
    assert project["name"] == spec.NAMESPACE
    assert project["runtime"]["name"] == "python"
    assert project["runtime"]["options"]["virtualenv"] == ".venv"
    assert project["main"] == "rayslice/infra/"
    assert (PROJECT.parent / "infra" / "__main__.py").is_file()


def test_config_declarations_match_spec_keys():
    declared = yaml.safe_load(PROJECT.read_text())["config"]
    expected = {f"{spec.NAMESPACE}:{k.name}": k for k in spec.KEYS if _declarable(k)}
    assert set(declared) == set(expected)
    for name, key in expected.items():
        entry = declared[name]
        assert entry["type"] == key.type, name
        assert entry["description"] == key.description, name
        default = list(key.default) if isinstance(key.default, tuple) else key.default
        assert entry["default"] == default, name
        if key.type == "array":
            assert entry["items"] == {"type": "string"}, name


def test_undeclarable_keys_are_documented():
    text = PROJECT.read_text()
    for key in spec.KEYS:
        if not _declarable(key):
            assert f"#   {spec.NAMESPACE}:{key.name} ({key.type}): {key.description}" in text
