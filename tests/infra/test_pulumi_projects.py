"""The two kinds of Pulumi project that use rayslice, run the way Pulumi runs them.

Pulumi's Python host runs a project's ``main`` directory with `runpy.run_path`, which puts that
directory first on `sys.path`. This repository's project (``main: infra/``) must therefore not
let any module of ``rayslice/infra/`` be imported under a top-level name (``cluster``,
``network`` ...): it would be a second copy of the module, with its own classes and state. The
platform team's example (examples/platform-team/) is another team's program that declares its
own VPC and puts a rayslice cluster in it.
"""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rayslice import spec
from rayslice.errors import InvalidInput
from rayslice.infra import ExistingNetwork, TpuRayClusterArgs
from rayslice.infra import preview as preview_module
from rayslice.infra.mocks import OfflineEngine, run_offline
from rayslice.infra.program import main

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "infra"
STACK = PROGRAM / "Pulumi.example-v6e-4.yaml"
EXAMPLE = REPO / "examples" / "platform-team"

# Run in a fresh interpreter, so that sys.modules holds only what the program imported.
HARNESS = textwrap.dedent(
    """
    import importlib.util, json, runpy, sys
    from pathlib import Path

    import rayslice.infra
    from rayslice.infra import preview
    from rayslice.infra.mocks import OfflineEngine

    program_dir, stack_file = sys.argv[1], sys.argv[2]
    package = Path(rayslice.infra.__file__).resolve().parent


    def in_package(origin):
        return origin is not None and package in Path(origin).resolve().parents


    def program():
        runpy.run_path(program_dir, run_name="__main__")  # what Pulumi's Python host does


    engine = OfflineEngine()
    engine.run(program, preview.stack_config(stack_file, []))
    imported = sorted(
        name for name, module in list(sys.modules.items())
        if "." not in name and in_package(getattr(module, "__file__", None))
    )
    names = sorted(
        {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
        | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    )


    def shadowed(first):
        # What `import NAME` finds for each module name with `first` at the head of sys.path.
        sys.path.insert(0, first)
        try:
            return [n for n in names if in_package(getattr(importlib.util.find_spec(n), "origin", None))]
        finally:
            sys.path.remove(first)


    print(json.dumps({
        "registered": sorted([r.type, r.name] for r in engine.registrations),
        "imported_top_level": imported,
        "importable_top_level": shadowed(program_dir),
        "importable_with_old_main": shadowed(str(package)),
    }))
    """
)


@pytest.fixture(scope="module")
def pulumi_run(tmp_path_factory) -> dict:
    harness = tmp_path_factory.mktemp("harness") / "harness.py"
    harness.write_text(HARNESS)
    done = subprocess.run(
        [sys.executable, str(harness), str(PROGRAM), str(STACK)],
        cwd=PROGRAM,  # Pulumi runs the program in its main directory
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_project_program_declares_the_cluster_of_the_stack(pulumi_run):
    """infra/__main__.py run by runpy registers exactly what `rayslice.infra.program.main` does."""
    direct = run_offline(main, preview_module.stack_config(str(STACK), []))
    assert pulumi_run["registered"] == sorted([r.type, r.name] for r in direct.registrations)
    assert ["rayslice:infra:TpuRayCluster", "jax-v6e-4"] in pulumi_run["registered"]


def test_no_module_of_the_package_is_a_top_level_module(pulumi_run):
    assert pulumi_run["imported_top_level"] == []
    assert pulumi_run["importable_top_level"] == []
    # The check sees the trap it guards against: with the old `main: rayslice/infra/`, every
    # module of the package was importable under its bare name.
    assert {"cluster", "network", "metadata", "commands"} <= set(pulumi_run["importable_with_old_main"])


# ---- the platform team's example --------------------------------------------------------------

NETWORK = "gcp:compute/network:Network"
SUBNETWORK = "gcp:compute/subnetwork:Subnetwork"
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
INSTANCE = "gcp:compute/instance:Instance"
FIREWALL = "gcp:compute/firewall:Firewall"


@pytest.fixture(scope="module")
def example():
    engine = OfflineEngine()

    def program() -> None:
        runpy.run_path(str(EXAMPLE), run_name="__main__")

    engine.run(program, {"gcp:project": "acme-ml"}, project="ml-platform", stack="dev")
    return engine


def test_example_is_a_pulumi_project_of_its_own():
    project = (EXAMPLE / "Pulumi.yaml").read_text()
    assert "\nname: ml-platform\n" in project and "\n  name: python\n" in project
    assert (EXAMPLE / "requirements.txt").read_text().split() == ["rayslice"]


def test_example_creates_no_network_of_its_own_and_puts_the_slice_in_the_teams(example):
    registrations = example.registrations
    # The team's network resources are the only ones: rayslice created no VPC, subnet, router or NAT.
    for kind, name in (
        (NETWORK, "platform-vpc"),
        (SUBNETWORK, "platform-tpu"),
        ("gcp:compute/router:Router", "platform-router"),
        ("gcp:compute/routerNat:RouterNat", "platform-nat"),
    ):
        assert [r.name for r in registrations if r.type == kind] == [name], kind
    (template,) = [r for r in registrations if r.type == TEMPLATE]  # one v6e-16 slice on compute
    # Spot: the head runs on a CPU VM, and the recovery controller on its own.
    head, controller = sorted(
        (r for r in registrations if r.type == INSTANCE), key=lambda r: "controller" in r.name
    )
    for host in (template, head, controller):
        (nic,) = host.inputs["networkInterfaces"]
        assert (nic["network"], nic["subnetwork"]) == ("platform-vpc", "platform-tpu")
    rules = [r for r in registrations if r.type == FIREWALL]
    assert rules and {r.inputs["network"] for r in rules} == {"platform-vpc"}
    assert template.inputs["labels"]["team"] == "ml-platform"


def test_example_hosts_wait_for_the_teams_network(example):
    """The names are Pulumi outputs, so Pulumi creates the team's VPC and subnet first."""
    registrations = example.registrations
    (vpc,) = [r for r in registrations if r.type == NETWORK]
    (subnet,) = [r for r in registrations if r.type == SUBNETWORK]
    for r in registrations:
        if r.type in (TEMPLATE, INSTANCE):
            assert {vpc.urn, subnet.urn} <= r.dependencies, r.name
        if r.type == FIREWALL:
            assert vpc.urn in r.dependencies, r.name


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"network": "other-vpc"}, "network"),
        ({"platform": "gke", "gkeCluster": "team-cluster"}, "gkeCluster"),
    ],
)
def test_a_network_given_twice_is_refused(raw, named):
    cluster_spec = spec.load({"acceleratorType": "v6e-16", "zone": "us-east5-b", **raw})
    with pytest.raises(InvalidInput, match=f"the spec sets {named} too") as raised:
        TpuRayClusterArgs(spec=cluster_spec, network=ExistingNetwork("platform-vpc"))
    assert raised.value.exit_code == 2
