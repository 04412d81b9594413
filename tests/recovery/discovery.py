"""Google's discovery documents (shipped by google-api-python-client) as a validator.

Checks a JSON value against a discovery schema: every field must be a property of the schema
(no invented names), of the declared type (int64/uint64 are JSON strings), with an enum value
the document lists; request bodies must not carry output-only (``readOnly``) fields.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import googleapiclient

DOCUMENTS = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# The API names of `rayslice.cloud.bodies.Request.api` (tpu-v2alpha1: a flex-start queued resource);
# a Path is an excerpt kept in tests/fixtures (with its SOURCE.md).
FILES: dict[str, str | Path] = {
    "tpu": "tpu.v2.json",
    "tpu-v2alpha1": "tpu.v2alpha1.json",
    "compute": "compute.v1.json",
    "container": "container.v1.json",
    "storage": "storage.v1.json",
    "monitoring": FIXTURES / "cloud-monitoring-v3" / "monitoring.v3.timeSeries.create.json",
}


@cache
def document(api: str) -> dict[str, Any]:
    return json.loads((DOCUMENTS / FILES[api]).read_text())  # an absolute Path stays as it is


def method(api: str, method_id: str) -> dict[str, Any]:
    """The discovery method `method_id` (e.g. ``compute.instanceGroupManagers.get``)."""
    node: dict[str, Any] = document(api)
    parts = method_id.split(".")[1:]
    for resource in parts[:-1]:
        node = node["resources"][resource]
    return dict(node["methods"][parts[-1]])


def problems(api: str, schema: dict[str, Any], value: Any, where: str, *, request: bool) -> list[str]:
    """Every way `value` differs from `schema` (empty when it conforms)."""
    schemas = document(api)["schemas"]
    if "$ref" in schema:
        return problems(api, schemas[schema["$ref"]], value, where, request=request)
    kind = schema.get("type")
    found: list[str] = []
    if kind == "any":
        return found
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{where}: expected object, got {type(value).__name__}"]
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                if request and properties[key].get("readOnly"):
                    found.append(f"{where}.{key}: output-only field sent in a request")
                found += problems(api, properties[key], item, f"{where}.{key}", request=request)
            elif extra is not None:
                found += problems(api, extra, item, f"{where}[{key!r}]", request=request)
            else:
                found.append(f"{where}.{key}: no such field in {schema.get('id', 'the schema')}")
        return found
    if kind == "array":
        if not isinstance(value, list):
            return [f"{where}: expected array"]
        for index, item in enumerate(value):
            found += problems(api, schema["items"], item, f"{where}[{index}]", request=request)
        return found
    if kind == "string":
        if not isinstance(value, str):
            return [f"{where}: expected string (format {schema.get('format', '-')}), got {value!r}"]
        if "enum" in schema and value not in schema["enum"]:
            return [f"{where}: {value!r} is not one of {schema['enum']}"]
        return found
    if kind == "integer":
        return (
            [] if isinstance(value, int) and not isinstance(value, bool) else [f"{where}: expected integer"]
        )
    if kind == "number":
        return (
            []
            if isinstance(value, int | float) and not isinstance(value, bool)
            else [f"{where}: expected number"]
        )
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{where}: expected boolean"]
    return [f"{where}: schema type {kind!r} not handled by this validator"]
