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


# The most nodes a stack file may hold once its aliases are expanded. A real stack file has a few
# hundred; anchors and aliases can make a few lines stand for billions (the "billion laughs"), which
# the readers would turn into text and run out of memory on.
MAX_EXPANDED_NODES = 100_000


def read_stack_file(path: str | Path) -> dict[str, Any]:
    """Raw values from a Pulumi stack file (``config:`` with ``rayslice:`` and ``gcp:`` keys)."""
    path = Path(path)
    try:
        loader = yaml.SafeLoader(path.read_text())
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_size(node, path)
            document = (loader.construct_document(node) if node is not None else None) or {}
        finally:
            loader.dispose()
    except OSError as exc:
        raise SpecError([f"cannot read stack file {path}: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"stack file {path} is not valid YAML: {exc}"]) from None
    except RecursionError:
        raise SpecError([f"stack file {path} is nested too deeply to be a stack file"]) from None
    if not isinstance(document, dict):
        raise SpecError([f"stack file {path}: the document must be a mapping with a 'config' key"])
    config = document.get("config") or {}
    if not isinstance(config, dict):
        raise SpecError([f"stack file {path}: 'config' must be a mapping"])
    return from_namespaced(config.get, config.keys())


def _check_size(root: yaml.Node, path: Path) -> None:
    """Refuse a document whose aliases expand it beyond `MAX_EXPANDED_NODES`, or that refers to
    itself: sizes are summed over the composed graph, where an alias is a shared node, so the
    check itself costs one visit per distinct node."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise SpecError([f"stack file {path}: an alias refers to the node that contains it"])
        open_nodes.add(id(node))
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(key) + size(value) for key, value in node.value)
        open_nodes.discard(id(node))
        sizes[id(node)] = total = min(total, MAX_EXPANDED_NODES + 1)
        return total

    if size(root) > MAX_EXPANDED_NODES:
        raise SpecError(
            [
                f"stack file {path}: its aliases (*name) expand it to more than "
                f"{MAX_EXPANDED_NODES:,} values; a stack file needs no such nesting: write the "
                "values out"
            ]
        )


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
