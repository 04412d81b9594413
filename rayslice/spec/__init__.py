"""ClusterSpec: the one reader of user input, and the one declaration of every config key.

Pulumi config, a stack file read by the CLI and ``--set KEY=VALUE`` overrides arrive as raw
values (`sources`). `load` types each key on its own into a draft (`draft`), applies the rules
across keys to it (`rules`), reports every problem at once (each saying what to do), fills the
defaults that depend on other keys (platform, zone, head, runtime version) and returns the frozen
`ClusterSpec` declared in `model`; everything downstream trusts it and never re-validates.

Modules depend one way: model <- draft <- rules <- sources. This package re-exports what the
rest of rayslice uses, so callers import from ``rayslice.spec``.
"""

from rayslice.errors import SpecError
from rayslice.spec.model import (
    DEFAULT_RAY_VERSION,
    KEY_NAMES,
    KEYS,
    MAX_TEXT,
    RECORD_OFF,
    SECONDS_PER_HOUR,
    ClusterSpec,
    Key,
)
from rayslice.spec.rules import GKE_NODE_POOL_NAME_MAX, host_image_link, load
from rayslice.spec.sources import (
    MAX_STACK_FILE_BYTES,
    NAMESPACE,
    from_namespaced,
    load_cli,
    parse_overrides,
    read_stack_file,
)

__all__ = [
    "DEFAULT_RAY_VERSION",
    "GKE_NODE_POOL_NAME_MAX",
    "KEYS",
    "KEY_NAMES",
    "MAX_STACK_FILE_BYTES",
    "MAX_TEXT",
    "NAMESPACE",
    "RECORD_OFF",
    "SECONDS_PER_HOUR",
    "ClusterSpec",
    "Key",
    "SpecError",
    "from_namespaced",
    "host_image_link",
    "load",
    "load_cli",
    "parse_overrides",
    "read_stack_file",
]
