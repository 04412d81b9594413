"""Dependencies point one way: the core never imports a platform package, and platform packages
import each other only where the design allows.

Every module under rayslice/ is parsed with `ast` (tests/imports.py), so an import inside a
function counts as much as one at the top. Commands reach the core's CLI through the
``rayslice.commands`` entry points instead.
"""

from __future__ import annotations

import pytest

from tests.imports import PACKAGE, imported_modules, module_name

PLATFORMS = ("infra", "local", "workloads", "jobs", "startup_scripts", "recovery", "fit")
# Packages that are part of the core: their modules follow the core's rules. (compilation_cache:
# JAX's cache settings, which the boot script, infra and the simulator read, and `fill`;
# observability: the record and goodput, which the client `rayslice run` and the simulator both
# write.)
CORE_PACKAGES = ("spec", "cloud", "compilation_cache", "observability")
# rayslice.cloud (Google's rules, run by `rayslice preview` and by the policy pack in policy/,
# which imports it alone) may import only these of rayslice's modules.
CLOUD_ALLOWED = (
    "rayslice.catalog",
    "rayslice.errors",
    "rayslice.platforms",
    "rayslice.capacity_table",
    "rayslice.names",
    "rayslice.cloud",
)
# rayslice.spec's modules in dependency order: each imports only the ones before it, and never the
# package itself (its __init__ imports them all to re-export their names, so that is a cycle).
SPEC_LAYERS = ("model", "draft", "rules", "sources")

# importer (a platform package, or "core" for rayslice/*.py) -> packages it must never import.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "core": PLATFORMS,
    # jobs run on cluster hosts: no simulator there, and not the client that submitted them
    "workloads": ("local", "infra", "startup_scripts", "jobs", "recovery"),
    "jobs": ("local", "infra", "startup_scripts", "recovery"),  # the client: core and the jobs it ships
    # compiles the jobs' steps on the deployer's machine (`rayslice fit`, `preview --fit`)
    "fit": ("local", "infra", "startup_scripts", "jobs", "recovery"),
    "infra": ("local", "workloads", "jobs"),
    "startup_scripts": ("infra", "local", "workloads", "jobs"),
    "recovery": (
        "infra",
        "local",
        "workloads",
        "jobs",
        "startup_scripts",
    ),  # runs on the head VM from core alone
}
# Inside rayslice.local, from the bottom up: the fakes of Google's services (no root, no Linux
# namespaces, so tests run them in-process), the Linux machinery of a host (which may read a
# fake's address, e.g. the metadata server's IP), the simulation built from both, and the
# ``rayslice local`` commands. A layer imports only the layers below it.
LOCAL_LAYERS = ("google", "host", "simulation", "commands")


def owner(module: str) -> str:
    """ "core" for rayslice.<module> and the core's packages, else the platform package's short name."""
    parts = module.split(".")
    package = parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in PLATFORMS) else "core"
    return "core" if package in CORE_PACKAGES else package


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
        elif not cloud_allows(module, name):
            bad.append(
                f"{module}:{line} imports {name} (rayslice.cloud imports only {', '.join(CLOUD_ALLOWED)})"
            )
        elif not spec_layer_allows(module, parts):
            bad.append(f"{module}:{line} imports {name} (rayslice.spec's order: {' <- '.join(SPEC_LAYERS)})")
        imported_layer = local_layer(name)
        if layer is not None and imported_layer is not None and imported_layer > layer:
            bad.append(f"{module}:{line} imports {name}, a layer above {LOCAL_LAYERS[layer]}")
    return bad


def cloud_allows(module: str, imported: str) -> bool:
    """Whether a module of rayslice.cloud may import `imported` (true for every other module)."""
    if (
        not module.startswith("rayslice.cloud")
        or imported.split(".")[0] != "rayslice"
        or imported == "rayslice"
    ):
        return True
    return any(imported == allowed or imported.startswith(f"{allowed}.") for allowed in CLOUD_ALLOWED)


def spec_layer_allows(module: str, imported: list[str]) -> bool:
    """Whether a module of rayslice.spec may import `imported` (true for every other module, and
    for the package's __init__, which re-exports them all)."""
    importer = module.split(".")
    if len(importer) != 3 or importer[:2] != ["rayslice", "spec"] or imported[:2] != ["rayslice", "spec"]:
        return True
    earlier = SPEC_LAYERS[: SPEC_LAYERS.index(importer[2])]
    return len(imported) > 2 and imported[2] in earlier


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_module_imports_against_the_direction_of_dependencies(path):
    assert violations(path.read_text(), module_name(path), path.name == "__init__.py") == []


def test_every_package_is_covered():
    owners = {owner(module_name(p)) for p in MODULES}
    assert owners == {"core", *PLATFORMS}, owners
    layers = {local_layer(module_name(p)) for p in MODULES} - {None}
    assert layers == set(range(len(LOCAL_LAYERS))), layers


def test_every_spec_module_has_a_layer():
    modules = {p.stem for p in (PACKAGE / "spec").glob("*.py")} - {"__init__"}
    assert modules == set(SPEC_LAYERS)


@pytest.mark.parametrize(
    "module, source",
    [
        ("rayslice.cli", "def f():\n    from rayslice.local import state\n"),
        ("rayslice.cli", "import rayslice.infra.cluster\n"),
        ("rayslice.spec", "from rayslice import workloads\n"),
        ("rayslice.cli", "import importlib\nimportlib.import_module('rayslice.startup_scripts')\n"),
        ("rayslice.jobs.connection", "from rayslice.local.simulation.state import default_state_dir\n"),
        ("rayslice.workloads.jax_train", "from rayslice.jobs import upload\n"),
        ("rayslice.recovery.cloud", "from rayslice.jobs.connection import Target\n"),
        ("rayslice.workloads.jax_train", "from ..local import simulator\n"),
        ("rayslice.infra.cluster", "from rayslice.workloads import _cluster\n"),
        ("rayslice.spec.rules", "from rayslice.infra import cluster\n"),
        ("rayslice.spec.model", "from rayslice.spec.rules import load\n"),
        ("rayslice.spec.rules", "from rayslice.spec.sources import NAMESPACE\n"),
        ("rayslice.spec.draft", "from rayslice.spec import KEYS\n"),
        ("rayslice.local.google.host_metadata", "from rayslice.local.host import netns\n"),
        ("rayslice.local.google.cloud_api.emulator", "from ...simulation import cloud_bridge\n"),
        ("rayslice.local.host.firewall", "from rayslice.local.simulation.state import RUN_ID\n"),
        ("rayslice.local.host.boot", "import rayslice.local.commands\n"),
        ("rayslice.local.simulation.status", "from rayslice.local import commands\n"),
        ("rayslice.cloud.rules", "from rayslice.infra.compute import template\n"),
        ("rayslice.cloud.rules", "from rayslice.spec import ClusterSpec\n"),
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
        ("rayslice.spec.sources", "from rayslice.spec.rules import load\nfrom rayslice import catalog\n"),
        ("rayslice.spec.rules", "from rayslice.spec.draft import Draft\n"),
        ("rayslice.cli", "from rayslice import spec\nfrom rayslice.spec import model\n"),
        (
            "rayslice.jobs.restarts",
            "from rayslice.workloads import _cluster\nfrom rayslice import shipping\n",
        ),
        ("rayslice.local.host.netns", "from rayslice.local.google.metadata_server import METADATA_IP\n"),
        ("rayslice.local.simulation.simulator", "from rayslice.local.host import netns\n"),
        ("rayslice.local.commands", "from rayslice.local.simulation.simulator import Simulation\n"),
        ("rayslice.cloud.rules", "from rayslice import catalog\nfrom rayslice.cloud.bodies import MIG\n"),
        ("rayslice.infra.compute.template", "from rayslice.cloud import rules\n"),
    ],
)
def test_the_rule_allows_the_right_way(module, source):
    assert violations(source, module) == []
