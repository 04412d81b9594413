"""The host-image program (`rayslice.infra.image`) under Pulumi's mocks and the cloud twin, and the
compute stack that boots from what it makes."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from rayslice import cli
from rayslice import spec as spec_module
from rayslice.cloud import bodies
from rayslice.cloud.twin import CloudTwin
from rayslice.errors import EXIT_INVALID
from rayslice.infra import image
from rayslice.infra.compute.template import base_image
from rayslice.infra.mocks import run_offline
from rayslice.infra.network import SUBNET_CIDR
from rayslice.infra.preview import deploy, preview, stack_config
from rayslice.startup_scripts.options import PackageSource
from rayslice.startup_scripts.variables import install_fingerprint

PROJECT_DIR = Path(__file__).resolve().parents[2] / "infra-image"
STACK = ["acceleratorType=v6e-16", "zone=us-east5-b", "project=img-project"]


def _config(phase: str, *extra: str) -> dict[str, str]:
    return {**stack_config(None, [*STACK, *extra]), f"{image.PHASE_NAMESPACE}:{image.PHASE_KEY}": phase}


def _spec(*extra: str) -> spec_module.ClusterSpec:
    return spec_module.load_cli(None, [*STACK, *extra])


@pytest.mark.parametrize(
    ("phase", "types"),
    [
        ("build", [bodies.INSTANCE]),
        ("image", [bodies.INSTANCE, bodies.IMAGE]),
        ("done", [bodies.IMAGE]),
    ],
)
def test_each_phase_passes_every_rule(phase, types):
    found = preview(_config(phase), image.main)
    assert found.violations == []
    assert sorted(r.type for r in found.registrations if r.custom) == sorted(types)


def test_the_builder_boots_the_tpu_os_image_and_runs_the_hosts_boot_script_as_builder():
    run = run_offline(image.main, _config("build"))
    [builder] = run.of_type(bodies.INSTANCE)
    spec = _spec()
    assert builder.inputs["bootDisk"]["initializeParams"]["image"] == base_image(spec)
    assert builder.inputs["metadata"]["rayslice-role"] == "image-builder"
    assert builder.inputs["desiredStatus"] == "RUNNING"
    assert "build_image" in builder.inputs["metadata"]["startup-script"]
    [vm] = run.twin.vms.values()
    assert vm.status == "RUNNING"


def test_the_image_is_taken_of_the_stopped_builders_disk_and_named_after_the_install():
    run = run_offline(image.main, _config("image"))
    [builder] = run.of_type(bodies.INSTANCE)
    [made] = run.of_type(bodies.IMAGE)
    spec = _spec()
    assert builder.inputs["desiredStatus"] == "TERMINATED"
    assert made.inputs["name"] == f"rayslice-host-{install_fingerprint(spec, PackageSource('pypi'))}"
    assert made.inputs["sourceDisk"] == f"zones/us-east5-b/disks/{builder.inputs['name']}"
    assert builder.urn in made.dependencies  # created after the stop
    [vm] = run.twin.vms.values()
    assert vm.status == "TERMINATED"


def test_imaging_the_disk_of_a_running_builder_is_refused(monkeypatch):
    monkeypatch.setattr(image, "STOPPED", "RUNNING")  # a program that forgot to stop it
    found = preview(_config("image"), image.main)
    assert [v.rule for v in found.violations] == ["image-source-disk-in-use"]
    assert "compute-images-create" in found.violations[0].source


def test_other_requirements_make_another_image():
    assert image.image_name(_spec()) != image.image_name(_spec('requirements=["six"]'))
    assert image.image_name(_spec()) == image.image_name(_spec("slices=2", "capacity=spot"))


def test_the_image_made_is_what_a_compute_stack_then_boots():
    twin = CloudTwin(default_range=SUBNET_CIDR)
    run_offline(image.main, _config("image"), twin)
    [made] = [link for link, r in twin.resources.items() if r.type == bodies.IMAGE]
    name = image.image_name(_spec())
    deploy(stack_config(None, [*STACK, f"hostImage={name}"]), twin)
    hosts = [vm for vm in twin.vms.values() if vm.group is not None]
    assert len(hosts) == _spec().tpu.hosts
    for vm in hosts:
        [disk] = vm.properties["disks"]
        assert disk["initializeParams"]["sourceImage"] == f"global/images/{name}"
        assert twin._link(disk["initializeParams"]["sourceImage"]) == made


def test_preview_of_a_stack_naming_the_image_shows_it(capsys):
    name = image.image_name(_spec())
    assert cli.main(["preview", *(f"--set={s}" for s in STACK), f"--set=hostImage={name}"]) == 0
    assert f'"sourceImage": "global/images/{name}"' in capsys.readouterr().out


def test_the_project_directory_runs_the_program(monkeypatch):
    def program() -> None:
        runpy.run_path(str(PROJECT_DIR), run_name="__main__")  # what Pulumi's Python host does

    run = run_offline(program, _config("done"))
    assert [r.type for r in run.registrations if r.custom] == [bodies.IMAGE]


def test_cli_name_prints_what_hostimage_takes(capsys):
    assert cli.main(["image", "name", *(f"--set={s}" for s in STACK)]) == 0
    assert capsys.readouterr().out.strip() == image.image_name(_spec())


def test_cli_preview_shows_each_phase(capsys):
    assert cli.main(["image", "preview", *(f"--set={s}" for s in STACK)]) == 0
    out = capsys.readouterr().out
    for phase in image.PHASES:
        assert f"# phase {phase}:" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["platform=tpu-vm", "acceleratorType=v6e-4"], "for platform=compute"),
        (
            [
                "packageIndex=https://pypi.internal.example/simple",
                "packageIndexCredentialsSecret=creds",
                "allowForeignPackageIndexSecret=true",
            ],
            "not supported yet",
        ),
    ],
)
def test_cli_refuses_what_it_cannot_build(capsys, extra, message):
    assert cli.main(["image", "preview", *(f"--set={s}" for s in [*STACK, *extra])]) == EXIT_INVALID
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_an_unknown_phase_is_refused():
    with pytest.raises(Exception, match="is not a phase"):
        run_offline(image.main, _config("bake"))


@pytest.mark.parametrize("phase", image.PHASES)
def test_every_input_of_the_image_program_reaches_the_request_or_the_provider(phase):
    run = run_offline(image.main, _config(phase))
    for registration in (r for r in run.registrations if r.custom):
        unknown = set(registration.inputs) - bodies.consumed(registration.type) - bodies.PROVIDER_ONLY
        assert unknown == set(), (registration.type, unknown)


def test_preview_warns_when_the_image_holds_another_install(capsys):
    other = image.image_name(_spec('requirements=["six"]'))
    assert cli.main(["preview", *(f"--set={s}" for s in STACK), f"--set=hostImage={other}"]) == 0
    err = capsys.readouterr().err
    assert f"hostImage {other} holds another install than this stack's ({image.image_name(_spec())})" in err
    # The stack's own image, or an image named some other way: nothing to say.
    for fine in (image.image_name(_spec()), "team-golden-image"):
        assert cli.main(["preview", *(f"--set={s}" for s in STACK), f"--set=hostImage={fine}"]) == 0
        assert "warning" not in capsys.readouterr().err
