"""Dependencies point one way: the core never imports a platform package, and platform packages
import each other only where the design allows.

Every module under rayslice/ is parsed with `ast`, so an import inside a function counts as much
as one at the top (a lazy import is still a dependency), and so does `importlib.import_module` or
`__import__` called with a literal module name. Commands reach the core's CLI through the
``rayslice.commands`` entry points instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rayslice

PACKAGE = Path(rayslice.__file__).resolve().parent
PLATFORMS = ("infra", "local", "workloads", "startup_scripts", "recovery")

# importer (a platform package, or "core" for rayslice/*.py) -> packages it must never import.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "core": PLATFORMS,
    "workloads": ("local", "infra", "startup_scripts"),  # jobs run on cluster hosts; no simulator there
    "infra": ("local", "workloads"),
    "startup_scripts": ("infra", "local", "workloads"),
    "recovery": ("infra", "local", "workloads", "startup_scripts"),  # runs on the head VM from core alone
}
# Inside rayslice.local, from the bottom up: the fakes of Google's services (no root, no Linux
# namespaces, so tests run them in-process), the Linux machinery of a host (which may read a
# fake's address, e.g. the metadata server's IP), the simulation built from both, and the
# ``rayslice local`` commands. A layer imports only the layers below it.
LOCAL_LAYERS = ("google", "host", "simulation", "commands")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def owner(module: str) -> str:
    """ "core" for rayslice.<module>, else the platform package's short name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in PLATFORMS) else "core"


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, wherever it stands."""
    found: list[tuple[int, str]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.append((node.lineno, prefix))
            found += [(node.lineno, f"{prefix}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def local_layer(module: str) -> int | None:
    """The position in LOCAL_LAYERS of a rayslice.local module's layer; None outside them."""
    parts = module.split(".")
    if parts[:2] == ["rayslice", "local"] and len(parts) > 2 and parts[2] in LOCAL_LAYERS:
        return LOCAL_LAYERS.index(parts[2])
    return None


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    forbidden = FORBIDDEN.get(owner(module), ())
    layer = local_layer(module)
    bad = []
    for line, name in imported_modules(source, module, is_package):
        parts = name.split(".")
        if len(parts) >= 2 and parts[0] == "rayslice" and parts[1] in forbidden:
            bad.append(f"{module}:{line} imports {name}")
        imported_layer = local_layer(name)
        if layer is not None and imported_layer is not None and imported_layer > layer:
            bad.append(f"{module}:{line} imports {name}, a layer above {LOCAL_LAYERS[layer]}")
    return bad


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_module_imports_against_the_direction_of_dependencies(path):
    assert violations(path.read_text(), module_name(path), path.name == "__init__.py") == []


def test_every_package_is_covered():
    owners = {owner(module_name(p)) for p in MODULES}
    assert owners == {"core", *PLATFORMS}, owners
    layers = {local_layer(module_name(p)) for p in MODULES} - {None}
    assert layers == set(range(len(LOCAL_LAYERS))), layers


@pytest.mark.parametrize(
    "module, source",
    [
        ("rayslice.cli", "def f():\n    from rayslice.local import state\n"),
        ("rayslice.cli", "import rayslice.infra.cluster\n"),
        ("rayslice.spec", "from rayslice import workloads\n"),
        ("rayslice.cli", "import importlib\nimportlib.import_module('rayslice.startup_scripts')\n"),
        ("rayslice.workloads._submit", "from rayslice.local.simulation.state import default_state_dir\n"),
        ("rayslice.workloads.jax_train", "from ..local import simulator\n"),
        ("rayslice.infra.cluster", "from rayslice.workloads import _cluster\n"),
        ("rayslice.local.google.host_metadata", "from rayslice.local.host import netns\n"),
        ("rayslice.local.google.cloud_api.emulator", "from ...simulation import cloud_bridge\n"),
        ("rayslice.local.host.firewall", "from rayslice.local.simulation.state import RUN_ID\n"),
        ("rayslice.local.host.boot", "import rayslice.local.commands\n"),
        ("rayslice.local.simulation.status", "from rayslice.local import commands\n"),
    ],
)
def test_the_rule_catches_a_wrong_way_import(module, source):
    assert violations(source, module) != []


@pytest.mark.parametrize(
    "module, source",
    [
        ("rayslice.local.commands", "from rayslice.cli import spec_options\n"),
        ("rayslice.infra.cluster", "from rayslice.startup_scripts import render\n"),
        ("rayslice.workloads.jax_train", "from . import _cluster\nfrom rayslice import catalog\n"),
        ("rayslice.local.host.netns", "from rayslice.local.google.metadata_server import METADATA_IP\n"),
        ("rayslice.local.simulation.simulator", "from rayslice.local.host import netns\n"),
        ("rayslice.local.commands", "from rayslice.local.simulation.simulator import Simulation\n"),
    ],
)
def test_the_rule_allows_the_right_way(module, source):
    assert violations(source, module) == []
