"""The component package's schema: what `pulumi package add` generates each language's SDK from.

It is inferred by Pulumi's analyzer from `rayslice.infra.provider` and completed from the spec;
the checked-in schema.json must be what the provider answers, and every config key must be an
input with the spec's type, description, default and allowed values.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from rayslice import spec
from rayslice.infra import provider

REPO = Path(__file__).resolve().parents[3]
WRITER = REPO / "scripts" / "write_provider_schema.py"
SCHEMA = json.loads((REPO / provider.SCHEMA_FILE).read_text())
COMPONENT = SCHEMA["resources"]["rayslice:index:TpuRayCluster"]
# Pulumi schema types of the config types (`spec.Key.type`), written out by hand.
TYPES = {"string": "string", "integer": "integer", "boolean": "boolean", "array": "array", "object": "object"}


def test_checked_in_schema_is_current():
    assert (REPO / provider.SCHEMA_FILE).read_text() == provider.schema_text(), f"run: python {WRITER}"


def test_writer_writes_the_schema(tmp_path):
    subprocess.run([sys.executable, str(WRITER), "--root", str(tmp_path)], check=True, capture_output=True)
    assert (tmp_path / provider.SCHEMA_FILE).read_text() == (REPO / provider.SCHEMA_FILE).read_text()


def test_package_and_component():
    assert SCHEMA["name"] == "rayslice"
    assert SCHEMA["version"] == "0.1.0"  # pyproject.toml's
    assert set(SCHEMA["resources"]) == {"rayslice:index:TpuRayCluster", "rayslice:index:RecordBucket"}
    assert COMPONENT["isComponent"] is True
    assert COMPONENT["description"].startswith("A Ray cluster on Cloud TPU slices")
    # Nothing is required: a stack file may leave every key out too.
    assert COMPONENT["requiredInputs"] == []


@pytest.mark.parametrize("key", spec.KEYS, ids=lambda k: k.name)
def test_every_config_key_is_a_plain_input(key):
    prop = COMPONENT["inputProperties"][key.name]
    # Plain: the spec is read before any resource is declared, so no value may wait on another.
    assert prop["plain"] is True
    assert prop["description"].startswith(" ".join(key.description.split()))
    if key.bounds:
        low, high = key.bounds
        assert prop["description"].endswith(f"A whole number from {low:,} to {high:,}.")
    if key.choices:
        enum = SCHEMA["types"][prop["$ref"].removeprefix("#/types/")]
        assert enum["type"] == "string"
        assert [member["value"] for member in enum["enum"]] == list(key.choices)
    else:
        assert prop["type"] == TYPES[key.type]
    if key.type == "array":
        assert prop["items"]["type"] == "string"
    if key.type == "object":
        assert prop["additionalProperties"]["type"] == "string"
    if key.derived or not key.has_default or key.type not in ("string", "integer", "boolean"):
        assert "default" not in prop
    else:
        assert prop["default"] == key.default


def test_spot_and_derived_keys_by_hand():
    """A few keys' entries written out, so the test does not only restate the code."""
    inputs = COMPONENT["inputProperties"]
    assert inputs["slices"]["type"] == "integer" and inputs["slices"]["default"] == 1
    assert inputs["slices"]["description"].endswith("A whole number from 1 to 64.")
    assert inputs["capacity"]["default"] == "on-demand"
    capacity = SCHEMA["types"]["rayslice:index:Capacity"]["enum"]
    assert [m["value"] for m in capacity] == ["on-demand", "spot", "reserved", "flex-start"]
    assert "default" not in inputs["zone"] and "default" not in inputs["platform"]
    assert inputs["labels"]["type"] == "object"


def test_existing_network_takes_outputs():
    """The one input that is not a config key: names that may be another resource's outputs."""
    prop = COMPONENT["inputProperties"]["existingNetwork"]
    assert prop["$ref"] == "#/types/rayslice:index:ExistingNetwork"
    network = SCHEMA["types"]["rayslice:index:ExistingNetwork"]
    assert network["required"] == ["network"]
    for name in ("network", "subnetwork"):
        assert network["properties"][name]["type"] == "string"
        assert "plain" not in network["properties"][name]  # an Input: outputs allowed
        assert network["properties"][name]["description"]
    assert set(COMPONENT["inputProperties"]) == {k.name for k in spec.KEYS} | {"existingNetwork"}


def test_outputs():
    outputs = COMPONENT["properties"]
    assert set(outputs) == {provider.camel(name) for name in provider.OUTPUTS}
    assert COMPONENT["required"] == [
        "dashboardTunnelCommand",
        "jobsApiAddress",
        "localJobsApiAddress",
        "sliceNames",
    ]
    assert all(prop["description"] for prop in outputs.values())
    assert not any(prop.get("plain") for prop in outputs.values())
    assert outputs["sliceHostIps"]["additionalProperties"]["items"]["type"] == "string"


def test_spec_config_reads_the_wire_format():
    """Pulumi sends every number as a double; integer keys get whole ones back as ints, and a
    fractional one reaches the spec, which refuses it."""
    assert provider.spec_config({"slices": 2.0, "zone": "us-east5-b", "existingNetwork": {}}) == {
        "slices": 2,
        "zone": "us-east5-b",
    }
    assert provider.spec_config({"slices": 1.5}) == {"slices": 1.5}
    with pytest.raises(spec.SpecError, match="slices"):
        spec.load({"zone": "us-east5-b", **provider.spec_config({"slices": 1.5})})


def test_record_bucket():
    bucket = SCHEMA["resources"]["rayslice:index:RecordBucket"]
    assert bucket["isComponent"] is True
    assert bucket["requiredInputs"] == ["location", "name"]
    inputs = bucket["inputProperties"]
    assert set(inputs) == {
        *("name", "location", "project", "keepDays", "lockedDays", "writers", "readers", "labels")
    }
    assert inputs["keepDays"] == {**inputs["keepDays"], "type": "integer", "default": 90, "plain": True}
    assert "plain" not in inputs["name"]  # a name made from another resource's output
    assert "plain" not in inputs["writers"]["items"]  # members such as a service account's
    assert set(bucket["properties"]) == {"url"} and bucket["required"] == ["url"]
    assert all(prop["description"] for prop in inputs.values())


def test_plugin_manifest_is_where_pulumi_looks():
    """`pulumi package add` reads PulumiPlugin.yaml at the package's root; Pulumi's Python host
    runs the ``__main__.py`` beside it (tests/infra/provider/test_construct.py starts it), in the
    environment its toolchain installs from pyproject.toml."""
    manifest = yaml.safe_load((REPO / "PulumiPlugin.yaml").read_text())
    runtime = manifest["runtime"]
    assert runtime["name"] == "python"
    assert runtime["options"]["toolchain"] == "uv"
    # Not the developers' .venv: a local `pulumi package add` must not sync over it.
    assert runtime["options"]["virtualenv"] not in (".venv", "venv")
    assert (REPO / "__main__.py").is_file()
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"] == SCHEMA["name"]
