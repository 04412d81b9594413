"""The draft: raw config values typed key by key, before the cross-field rules run.

`ClusterSpec` cannot hold a half-valid configuration (its fields are required and frozen), yet
`load` reports every problem at once: a value refused for its own key must not stop the rules
that compare keys. So each key is coerced on its own into a `Draft`, typed like the spec but
optional, and the rules (`rayslice.spec.rules`) read its attributes, checked by mypy, instead
of a dict by alias.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

from rayslice import catalog
from rayslice.errors import shown
from rayslice.spec.model import (
    KEY_NAMES,
    KEYS,
    Bool,
    Capacity,
    CapacityMode,
    ClusterSpec,
    Head,
    Int,
    KubeRay,
    Platform,
    Preset,
    RayAuth,
    Str,
    Strings,
    StrMap,
    coerce,
)


@dataclasses.dataclass(kw_only=True)
class Draft:
    """One attribute per `ClusterSpec` field, of the same type or None.

    None means: not set and no static default (the derived keys platform, zone and head, and
    the optional keys), or refused (the problem is already listed; rules then leave the key
    alone). A test keeps these fields in step with `ClusterSpec`'s.
    """

    name: Str | None
    project: Str | None
    platform: Platform | None
    accelerator_type: Str | None
    slices: Int | None
    min_slices: Int | None
    idle_timeout_seconds: Int | None
    max_usd_per_hour: Int | None
    zone: Str | None
    runtime_version: Str | None
    capacity: Capacity | None
    reservation: Str | None
    calendar_mode: Bool | None
    capacity_mode: CapacityMode | None
    max_run_hours: Int | None
    queued: Bool | None
    queue_deadline_hours: Int | None
    head: Head | None
    head_machine_type: Str | None
    network: Str | None
    subnetwork: Str | None
    external_ips: Bool | None
    dashboard_source_ranges: Strings | None
    allow_wide_dashboard_ranges: Bool | None
    preset: Preset | None
    requirements: Strings | None
    package_index: Str | None
    allow_insecure_package_index: Bool | None
    package_index_credentials_secret: Str | None
    allow_foreign_package_index_secret: Bool | None
    package_cache: Bool | None
    ray_version: Str | None
    host_image: Str | None
    record_bucket: Str | None
    allow_foreign_record_bucket: Bool | None
    labels: StrMap | None
    ray_auth: RayAuth | None
    recovery: Bool | None
    kuberay: KubeRay | None
    gke_cluster: Str | None
    gke_authorized_networks: Strings | None
    allow_wide_gke_authorized_networks: Bool | None
    # Fields whose raw value was refused: a derived key refused is not derived (the user's value
    # stands, wrong), and a refused zone is not compared with anything.
    refused: frozenset[str] = frozenset()

    def spec(self, tpu: catalog.TpuType) -> ClusterSpec:
        """The frozen spec, once the rules found no problem and filled every derived key."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "refused"}
        return ClusterSpec(tpu=tpu, **values)


def read(raw: Mapping[str, Any], problems: list[str]) -> Draft:
    """Every key of `raw` coerced to its type; unknown keys and refused values go to `problems`."""
    unknown = [key for key in raw if key not in KEY_NAMES]
    if unknown:
        problems.append(_unknown_keys(unknown))
    values: dict[str, Any] = {}
    refused = set()
    for key in KEYS:
        if raw.get(key.name) is None:
            values[key.field] = key.default
            continue
        try:
            values[key.field] = coerce(key, raw[key.name])
        except ValueError as exc:
            problems.append(str(exc))
            values[key.field] = None
            refused.add(key.field)
    return Draft(**values, refused=frozenset(refused))


# How many unknown keys one message names (each with its nearest known key); it counts the rest.
_UNKNOWN_SHOWN = 5
# How much of an unknown key is compared with the known ones: difflib's cost grows with the
# product of the lengths, and no known key is half this long.
_KEY_MATCHED = 64


def _unknown_keys(keys: list[Any]) -> str:
    """One problem for every unknown key: the first few, each with the known key it is closest
    to, a count of the others, and the known keys once when some key resembles none of them."""
    named, far = [], False
    for key in keys[:_UNKNOWN_SHOWN]:
        near = difflib.get_close_matches(str(key)[:_KEY_MATCHED], sorted(KEY_NAMES), n=1)
        far = far or not near
        named.append(f"{shown(key)}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    more = f" and {len(keys) - _UNKNOWN_SHOWN:,} more" if len(keys) > _UNKNOWN_SHOWN else ""
    known = f"; known keys: {', '.join(sorted(KEY_NAMES))}" if far or more else ""
    return f"unknown config key{'s' if len(keys) > 1 else ''} {', '.join(named)}{more}{known}"
