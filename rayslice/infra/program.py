"""The Pulumi program `pulumi up` runs: stack config -> `ClusterSpec` -> `TpuRayCluster`.

It lives in the package, not in the Pulumi project's directory: the repository's
`infra/__main__.py` (``main: infra/``) only calls `main`, so `pulumi up`, `rayslice preview` and
the tests run the very same function (the last two under Pulumi's mocks), and Pulumi's `runpy`
never puts a directory of this package on `sys.path`. The spec is validated before any
resource is declared: a bad config fails with the spec's messages and registers nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pulumi.runtime

from rayslice import spec
from rayslice.infra.cluster import TpuRayCluster, TpuRayClusterArgs
from rayslice.startup_scripts.locks import Lock
from rayslice.startup_scripts.stack_locks import LOCK_DIR_NAME, StackLocks

# What the program asks for the stack's lock (`StackLocks.lock`, or the simulator's stand-in).
LockSource = Callable[[spec.ClusterSpec], Lock | None]


def _config_value(key: str) -> Any:
    namespace, _, name = key.partition(":")
    return pulumi.Config(namespace).get(name)


def _config_keys() -> set[str]:
    """Every config key the stack sets, so a misspelt ``rayslice:`` key is reported, not ignored.

    The Pulumi SDK has no public "list config keys"; the engine hands the program its config
    either through `set_all_config` (held in `pulumi.runtime.config.CONFIG`) or the
    ``PULUMI_CONFIG`` environment variable, so both are read.
    """
    return set(pulumi.runtime.config.CONFIG.get()) | set(pulumi.runtime.get_config_env())


def read_spec() -> spec.ClusterSpec:
    """The stack's validated spec (raises `spec.SpecError` listing every problem)."""
    return spec.load(spec.from_namespaced(_config_value, _config_keys()))


def project_locks() -> StackLocks:
    """The stack's lock under `pulumi up`: ``rayslice-locks/<stack>.lock`` beside Pulumi.yaml (the
    engine's root directory; the working directory where the SDK has none, as under mocks)."""
    root = pulumi.get_root_directory() or "."
    return StackLocks(Path(root) / LOCK_DIR_NAME, pulumi.get_stack())


def main(locks: LockSource | None = None) -> TpuRayCluster:
    """Declare the cluster and export what a user needs next. The stack's `requirements` (or,
    for a Ray release without a preset lock, its whole requirement set) are locked first
    (`locks`, the Pulumi project's `rayslice-locks/` by default), so a lock that cannot be made
    stops the program before any resource is declared."""
    cluster_spec = read_spec()
    lock = (locks or project_locks().lock)(cluster_spec)
    cluster = TpuRayCluster(cluster_spec.name, TpuRayClusterArgs(spec=cluster_spec, lock=lock))
    for key, value in cluster.exports.items():
        pulumi.export(key, value)
    return cluster
