"""The CLI as a user runs it: exit codes, JSON shape, messages on stderr, help, registered commands."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from rayslice import cli, errors
from tests.conftest import REPO

JSON_KEYS = [
    "accelerator_type",
    "generation",
    "platform",
    "chips",
    "tensorcores",
    "hosts",
    "chips_per_host",
    "topology",
    "runtime_version",
    "machine_type",
    "gke_accelerator",
    "placement",
    "zones",
    "multislice",
    "price_per_hour",
    "price_source",
]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rayslice", *args], capture_output=True, text=True, timeout=120
    )


def test_catalog_json_v5p_16():
    result = run("catalog", "v5p-16", "--platform", "tpu-vm", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert list(data) == JSON_KEYS
    assert (data["hosts"], data["chips_per_host"], data["topology"], data["runtime_version"]) == (
        2,
        4,
        "2x2x2",
        "v2-alpha-tpuv5",
    )
    assert data["machine_type"] is None and data["placement"] is None


def test_catalog_json_v6e_8_is_one_host_on_tpu_vm(capsys):
    assert cli.main(["catalog", "v6e-8", "--platform", "tpu-vm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["hosts"], data["chips_per_host"]) == (1, 8)


def test_catalog_json_gke(capsys):
    assert cli.main(["catalog", "tpu-v6e-slice-16", "--platform", "gke", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["machine_type"], data["gke_accelerator"], data["placement"], data["runtime_version"]) == (
        "ct6e-standard-4t",
        "tpu-v6e-slice",
        "COMPACT",
        None,
    )


def test_catalog_table_lists_generations(capsys):
    assert cli.main(["catalog"]) == 0
    out = capsys.readouterr().out
    for gen in ("v2", "v3", "v4", "v5litepod", "v5p", "v6e"):
        assert f"\n{gen} " in out
    assert "\ntpu7x " not in out
    assert cli.main(["catalog", "--platform", "gke"]) == 0
    assert "\ntpu7x " in capsys.readouterr().out


def test_catalog_readable_one_type(capsys):
    assert cli.main(["catalog", "v6e-16"]) == 0
    assert "topology" in capsys.readouterr().out


def test_catalog_shows_the_price_per_capacity(capsys):
    assert cli.main(["catalog", "v6e-16", "--platform", "compute"]) == 0
    out = capsys.readouterr().out
    assert "region        on-demand  spot      reserved            flex-start" in out
    assert "us-east5      $43.20/h   $19.44/h  no published price  no published price" in out
    assert "read 2026-12-03" in out
    assert cli.main(["catalog", "v6e-16", "--json"]) == 0
    prices = json.loads(capsys.readouterr().out)["price_per_hour"]
    assert prices["us-east5"] == {"on-demand": 43.2, "spot": 19.44, "reserved": None, "flex-start": None}


def test_catalog_unknown_type_exits_2(capsys):
    assert cli.main(["catalog", "v6e-12"]) == 2
    assert "closest valid types: v6e-8, v6e-16" in capsys.readouterr().err


def test_validate_unknown_type_exits_2_with_neighbours():
    result = run("validate", "--set", "acceleratorType=v5p-7")
    assert result.returncode == 2
    assert "v5p-8, v5p-16, v5p-32" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_validate_ok(tmp_path, capsys):
    stack = tmp_path / "Pulumi.dev.yaml"
    stack.write_text("config:\n  rayslice:acceleratorType: v5p-16\n  gcp:zone: us-east5-a\n")
    assert cli.main(["validate", "--stack-file", str(stack), "--set", "slices=2"]) == 0
    out = capsys.readouterr().out
    assert "2 x v5p-16" in out and "head=vm" in out


def test_validate_says_where_the_head_runs_on_gke(capsys):
    """On gke the Ray head is KubeRay's head pod whatever `head` would be on VMs, and head=slice
    is refused (exit 2) rather than ignored."""
    stack = str(REPO / "infra/Pulumi.example-gke-v6e-16.yaml")
    assert cli.main(["validate", "--stack-file", stack]) == 0
    out = capsys.readouterr().out
    assert "KubeRay head pod on the CPU pool" in out and "head=" not in out
    result = run("validate", "--stack-file", stack, "--set", "head=slice")
    assert result.returncode == 2 and "head=slice on gke" in result.stderr
    assert "Traceback" not in result.stderr


def test_render_prints_the_script(capsys):
    assert cli.main(["render", "--set", "acceleratorType=v6e-4"]) == 0
    assert capsys.readouterr().out.startswith("#!/bin/bash")


@pytest.mark.parametrize(
    "argv", [["validate", "--set", "nokey"], ["validate", "--stack-file", "/nonexistent"]]
)
def test_bad_arguments_exit_2(argv, capsys):
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.startswith("rayslice: ")


# ---- commands registered by entry point, help, and the one exit-code table ------------------------

REGISTERED = {"render", "preview", "image", "local", "run", "status", "history", "goodput"}


def test_every_registered_command_loads_under_its_own_name():
    from importlib.metadata import entry_points

    found = {ep.name: ep.load() for ep in entry_points(group=cli.COMMANDS_GROUP)}
    assert set(found) == REGISTERED
    for name, command in found.items():
        assert isinstance(command, click.Command) and command.name == name


def test_top_level_help_lists_every_command_with_its_summary():
    result = run("--help")
    assert result.returncode == 0, result.stderr
    commands = result.stdout.split("Commands:")[1].split("\n\n")[0].splitlines()
    listed = {line.split()[0] for line in commands if line.startswith("  ") and not line.startswith("    ")}
    assert listed >= {"catalog", "validate", *REGISTERED}
    assert "unavailable" not in result.stdout
    assert "Exit status: 0 success, 1" in result.stdout


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["catalog", "--help"], ["--platform", "tpu-vm", "--json", "[TYPE]"]),
        (["validate", "--help"], ["--stack-file", "--set KEY=VALUE"]),
        (
            ["run", "--help"],
            ["--address", "--token-file", "--working-dir", "--list", "-- JOB ARGS", "Exit status"],
        ),
        (["local", "--help"], ["up", "status", "down", "reboot", "restart-head"]),
        (["local", "up", "--help"], ["--stack-file", "--set", "--wheelhouse", "--timeout", "--state-dir"]),
        (["local", "status", "--help"], ["--json", "--state-dir", "no root"]),
        (["local", "reboot", "--help"], ["HOST"]),
        (["image", "--help"], ["name", "preview"]),
        (["image", "preview", "--help"], ["--phase", "build", "image", "done", "--stack-file"]),
    ],
)
def test_each_help_page_names_its_options(argv, expected, capsys):
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    for text in expected:
        assert text in out, (text, out)


@pytest.mark.parametrize(
    "error, code",
    [
        (errors.InvalidInput("bad value"), 2),
        (errors.SpecError(["acceleratorType: no such type"]), 2),
        (errors.CatalogError("unknown type"), 2),
        (errors.SimulatorError("needs root"), 2),
        (errors.JobFailed("job FAILED"), 1),
        (errors.NoCluster("nothing at http://h:8265"), 3),
        (errors.NoCredentials("no ADC"), 3),
    ],
)
def test_an_expected_failure_ends_as_one_line_and_its_exit_code(error, code, monkeypatch, capsys):
    @click.command("boom")
    def boom() -> int:
        raise error

    monkeypatch.setitem(cli.app.commands, "boom", boom)
    assert cli.main(["boom"]) == code
    err = capsys.readouterr().err
    assert err.startswith("rayslice: ") and "Traceback" not in err


def test_a_usage_error_exits_2_and_an_unknown_command_names_the_choices(capsys):
    assert cli.main(["nosuch"]) == 2
    assert "No such command 'nosuch'" in capsys.readouterr().err


def test_python_dash_m_rayslice_is_the_same_command():
    result = run("catalog", "v6e-16", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["hosts"] == 4
