"""Where raw config values come from: Pulumi config, a stack file, and ``--set`` overrides.

Each source hands over a plain dict keyed by the camelCase names users write; `load` types and
checks it. Pulumi config lives in the ``rayslice`` namespace, with ``gcp:project`` and
``gcp:zone`` as fallbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from rayslice.errors import SpecError
from rayslice.spec.model import KEY_NAMES, ClusterSpec
from rayslice.spec.rules import load

# The Pulumi config namespace of every key (Pulumi.yaml's project name too).
NAMESPACE = "rayslice"


def read_stack_file(path: str | Path) -> dict[str, Any]:
    """Raw values from a Pulumi stack file (``config:`` with ``rayslice:`` and ``gcp:`` keys)."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise SpecError([f"cannot read stack file {path}: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"stack file {path} is not valid YAML: {exc}"]) from None
    config = document.get("config") or {}
    if not isinstance(config, dict):
        raise SpecError([f"stack file {path}: 'config' must be a mapping"])
    return from_namespaced(config.get, config.keys())


def from_namespaced(get: Callable[[str], Any], keys: Any = None) -> dict[str, Any]:
    """Raw values from ``rayslice:KEY`` config entries, falling back to ``gcp:project/zone``."""
    raw: dict[str, Any] = {}
    names = KEY_NAMES | {k.split(":", 1)[1] for k in (keys or ()) if str(k).startswith(NAMESPACE + ":")}
    for name in names:
        value = get(f"{NAMESPACE}:{name}")
        if value is not None:
            raw[name] = value
    for name in ("project", "zone"):
        if name not in raw and get(f"gcp:{name}") is not None:
            raw[name] = get(f"gcp:{name}")
    return raw


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs from ``--set``; values stay strings and are typed by `load`."""
    raw: dict[str, Any] = {}
    problems = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            problems.append(f"--set {pair!r} must look like KEY=VALUE (e.g. --set slices=2)")
            continue
        raw[key.removeprefix(NAMESPACE + ":")] = value
    if problems:
        raise SpecError(problems)
    return raw


def load_cli(
    stack_file: str | None,
    overrides: list[str],
    *,
    require_zone: bool = True,
    defaults: Mapping[str, Any] | None = None,
) -> ClusterSpec:
    """The spec as the CLI sees it: defaults, then the stack file, then ``--set`` overrides."""
    raw: dict[str, Any] = dict(defaults or {})
    if stack_file:
        raw.update(read_stack_file(stack_file))
    raw.update(parse_overrides(overrides))
    return load(raw, require_zone=require_zone)
