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

from rayslice.errors import SpecError, shown
from rayslice.spec.model import KEY_NAMES, ClusterSpec
from rayslice.spec.rules import load

# The Pulumi config namespace of every key (Pulumi.yaml's project name too).
NAMESPACE = "rayslice"


# The most nodes a stack file may hold once its aliases are expanded. A real stack file has a few
# hundred; anchors and aliases can make a few lines stand for billions (the "billion laughs"), which
# the readers would turn into text and run out of memory on.
MAX_EXPANDED_NODES = 100_000
# The largest stack file read. A real one is a few KB (its encrypted secrets included); a larger
# one is the wrong file, and reading /dev/zero would never end.
MAX_STACK_FILE_BYTES = 1 << 20
_UTF8_BOM = b"\xef\xbb\xbf"
_NULL = "tag:yaml.org,2002:null"


def read_stack_file(path: str | Path) -> dict[str, Any]:
    """Raw values from a Pulumi stack file (``config:`` with ``rayslice:`` and ``gcp:`` keys),
    each as the Pulumi CLI hands it to the program (`_pulumi_value`), so that what `validate` and
    `preview` read is what `pulumi up` deploys."""
    path = Path(path)
    text = _stack_text(path)
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_size(node, path)
            config = _config_node(node, path)
            pairs = config.value if config is not None else []
            values = {_key(key, path): _pulumi_value(loader, value) for key, value in pairs}
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise SpecError([f"stack file {path} is not valid YAML: {_yaml_problem(exc)}"]) from None
    except RecursionError:
        raise SpecError([f"stack file {path} is nested too deeply to be a stack file"]) from None
    except ValueError as exc:  # a value YAML cannot hold in Python: an int of 4,300+ digits, a date
        raise SpecError([f"stack file {path}: a value cannot be read ({shown(str(exc))})"]) from None
    return from_namespaced(values.get, values.keys())


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What the YAML reader found wrong, and where, on one line."""
    if isinstance(exc, yaml.reader.ReaderError):
        character = exc.character if isinstance(exc.character, str) else chr(exc.character)
        return f"it holds U+{ord(character):04X} at character {exc.position}, which YAML does not allow"
    problem = getattr(exc, "problem", None) or str(exc)
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{shown(' '.join(problem.split()))}{where}"


def _stack_text(path: Path) -> str:
    """The file's text: at most `MAX_STACK_FILE_BYTES`, UTF-8 (a leading byte order mark dropped,
    as the Pulumi CLI drops it)."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_STACK_FILE_BYTES + 1)
    except OSError as exc:
        raise SpecError([f"cannot read stack file {path}: {exc.strerror}"]) from None
    if len(data) > MAX_STACK_FILE_BYTES:
        raise SpecError(
            [
                f"stack file {path} is larger than {MAX_STACK_FILE_BYTES >> 20} MiB; a stack file "
                "is a few KB: give the Pulumi.<stack>.yaml of your stack"
            ]
        )
    try:
        return data.removeprefix(_UTF8_BOM).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            [
                f"stack file {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                f"{exc.start}): save it as UTF-8"
            ]
        ) from None


def _config_node(root: yaml.Node | None, path: Path) -> yaml.MappingNode | None:
    """The node of the document's ``config:`` mapping; None when there is none."""
    if root is None:
        return None
    if not isinstance(root, yaml.MappingNode):
        raise SpecError([f"stack file {path}: the document must be a mapping with a 'config' key"])
    config = next((v for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == "config"), None)
    if config is None or (isinstance(config, yaml.ScalarNode) and config.tag == _NULL):
        return None
    if not isinstance(config, yaml.MappingNode):
        raise SpecError([f"stack file {path}: 'config' must be a mapping"])
    return config


def _key(node: yaml.Node, path: Path) -> str:
    if not isinstance(node, yaml.ScalarNode):
        raise SpecError([f"stack file {path}: a config key must be a name like rayslice:slices"])
    return node.value


def _pulumi_value(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    """A config value as the Pulumi CLI hands it to the program, which reads strings only.

    The CLI reads a stack file's value into its config `Value` by first asking the YAML decoder
    for a string (pulumi/pulumi sdk/go/common/resource/config/value.go, `unmarshalValue`), and
    the decoder gives a string target the scalar's text as written (gopkg.in/yaml, `scalar`):
    ``slices: 010`` reaches the program as "010" (10 to `Config.get_int`), not as YAML 1.1's
    octal 8; ``queued: yes`` as "yes"; a null as "". Only a list or a mapping is parsed as YAML
    and handed over as JSON, which the keys read (`rayslice.spec.model._strings`).
    """
    if isinstance(node, yaml.ScalarNode):
        return "" if node.tag == _NULL else node.value
    return loader.construct_object(node, deep=True)


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
    given = [k.split(":", 1)[1] for k in (keys or ()) if str(k).startswith(NAMESPACE + ":")]
    for name in dict.fromkeys([*sorted(KEY_NAMES), *given]):  # in order: unknown keys as written
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
            problems.append(f"--set {shown(pair)} must look like KEY=VALUE (e.g. --set slices=2)")
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
