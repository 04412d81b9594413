"""Pulumi.yaml and docs/configuration.md are generated from the spec model and kept current."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import Field

from rayslice import config_reference, spec
from rayslice.spec import model

REPO = Path(__file__).resolve().parents[2]
PROJECT = REPO / "Pulumi.yaml"
WRITER = REPO / "scripts" / "write_config_reference.py"


def test_project_runs_the_infra_program():
    project = yaml.safe_load(PROJECT.read_text())
    assert project["name"] == spec.NAMESPACE
    assert project["runtime"]["name"] == "python"
    assert project["runtime"]["options"]["virtualenv"] == ".venv"
    assert project["main"] == "infra/"
    assert (REPO / "infra" / "__main__.py").is_file()
    # The stacks live beside the program, so the root holds no Pulumi.<stack>.yaml.
    assert project["stackConfigDir"] == "infra/"
    assert sorted(REPO.glob("Pulumi.*.yaml")) == []
    assert len(sorted((REPO / "infra").glob("Pulumi.example-*.yaml"))) == 12


def test_generated_files_are_current():
    """Fails when a key changed in the model and the writer script has not been run."""
    assert config_reference.stale(REPO) == [], f"run: python {WRITER.relative_to(REPO)}"


def test_declared_keys_are_exactly_the_declarable_ones():
    declared = yaml.safe_load(PROJECT.read_text())["config"]
    # Written out, so a wrong rule in the generator cannot hide behind itself.
    assert set(declared) == {
        f"rayslice:{k}"
        for k in (
            "name",
            "acceleratorType",
            "slices",
            "idleTimeoutSeconds",
            "capacity",
            "calendarMode",
            "capacityMode",
            "queued",
            "headMachineType",
            "externalIps",
            "dashboardSourceRanges",
            "allowWideDashboardRanges",
            "preset",
            "requirements",
            "allowInsecurePackageIndex",
            "allowForeignPackageIndexSecret",
            "packageCache",
            "rayVersion",
            "allowForeignRecordBucket",
            "rayAuth",
            "recovery",
            "kuberay",
            "gkeAuthorizedNetworks",
            "allowWideGkeAuthorizedNetworks",
        )
    }
    assert declared["rayslice:headMachineType"]["default"] == "n2-standard-16"
    assert declared["rayslice:recovery"] == {
        "type": "boolean",
        "default": True,
        "description": spec.ClusterSpec.__pydantic_fields__["recovery"].description,
    }
    assert declared["rayslice:gkeAuthorizedNetworks"]["items"] == {"type": "string"}
    assert declared["rayslice:gkeAuthorizedNetworks"]["default"] == []


def test_undeclared_keys_are_listed_in_a_comment():
    text = PROJECT.read_text()
    for name in (
        "project",
        "platform",
        "zone",
        "head",
        "runtimeVersion",
        "labels",
        "packageIndexCredentialsSecret",
    ):
        assert f"#   rayslice:{name} (" in text, name


def test_docs_list_every_key_with_its_default():
    text = (REPO / "docs" / "configuration.md").read_text()
    for key in spec.KEYS:
        assert f"| `{key.name}` |" in text, key.name
    assert '| `headMachineType` | string | `"n2-standard-16"` |' in text
    assert "| `platform` | `compute` \\| `tpu-vm` \\| `gke` | derived (see description) |" in text
    assert "| us-east5-a | c3, c4, e2, n2, n2d |" in text
    assert "| asia-east1-c | c4, e2, n1, n2, n2d |" in text
    assert "| us-central2-b | not settled by a source" in text


@pytest.fixture
def model_with_an_extra_key(monkeypatch):
    """ClusterSpec plus one new field, as a developer would add it: nothing else edited."""

    @model.dataclass(frozen=True, kw_only=True, config=model.ClusterSpec.__pydantic_config__)
    class Extended(model.ClusterSpec):
        max_restarts: model.Int = Field(3, description="How often a job is resubmitted after a node loss.")

    monkeypatch.setattr(model, "ClusterSpec", Extended)
    monkeypatch.setattr(spec, "KEYS", model._keys())
    return Extended


def test_a_new_model_field_reaches_both_files(model_with_an_extra_key):
    assert "maxRestarts" in {k.name for k in spec.KEYS}
    config = yaml.safe_load(config_reference.pulumi_yaml(PROJECT.read_text()))["config"]
    assert config["rayslice:maxRestarts"] == {
        "type": "integer",
        "default": 3,
        "description": "How often a job is resubmitted after a node loss.",
    }
    assert (
        "| `maxRestarts` | integer | `3` | How often a job is resubmitted"
        in config_reference.configuration_md()
    )


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A copy of the generated files, as a checkout holds them."""
    (tmp_path / "docs").mkdir()
    shutil.copy(PROJECT, tmp_path / "Pulumi.yaml")
    shutil.copy(REPO / "docs" / "configuration.md", tmp_path / "docs" / "configuration.md")
    return tmp_path


def test_stale_file_is_reported(checkout):
    copy = checkout / "Pulumi.yaml"
    copy.write_text(PROJECT.read_text().replace("n2-standard-16", "n1-standard-16"))
    assert config_reference.stale(checkout) == [copy]


def test_the_writer_script_rewrites_what_is_stale(checkout):
    """The developer's writer fixes exactly the stale files, and keeps Pulumi.yaml's head."""
    (checkout / "Pulumi.yaml").write_text(PROJECT.read_text().replace("n2-standard-16", "n1-standard-16"))
    (checkout / "docs" / "configuration.md").unlink()
    done = subprocess.run(
        [sys.executable, str(WRITER), "--root", str(checkout)], capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == ["wrote Pulumi.yaml", f"wrote {Path('docs', 'configuration.md')}"]
    assert config_reference.stale(checkout) == []
    assert (checkout / "Pulumi.yaml").read_text() == PROJECT.read_text()


def test_the_package_has_no_writer():
    """From a wheel, a path beside the module is site-packages: the package only renders text."""
    source = Path(config_reference.__file__).read_text()
    assert "write_text" not in source and "__main__" not in source


def test_spec_fields_are_dataclass_fields():
    assert "recovery" in {f.name for f in dataclasses.fields(spec.ClusterSpec)}
