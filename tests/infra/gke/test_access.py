"""The GKE access commands, run the way docs/deploy-gke.md tells users to run them: through
real bash, against a stub `kubectl` (and `pulumi`) on PATH that checks the arguments it gets
and prints what the real one prints.
"""

from __future__ import annotations

import base64
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from rayslice import spec as specs
from rayslice.infra.gke import access

TOKEN = "tok-3f9a/Zq+8=="  # base64 would need padding and has '/' and '+': all must survive
# What `kubectl get secret demo -o jsonpath={.data.auth_token}` prints: the value as stored in
# the Secret (base64), with no newline after it.
KUBECTL_STUB = """#!/bin/bash
expected=(get secret --namespace=rayslice-demo demo '--output=jsonpath={.data.auth_token}')
got=("$@")
if [ "${got[*]@Q}" != "${expected[*]@Q}" ]; then
  echo "kubectl stub: got ${got[*]@Q}, want ${expected[*]@Q}" >&2; exit 1
fi
printf %s "$STUB_SECRET_B64"
"""
# `pulumi stack output ray_token_command` prints the output's value and a newline.
PULUMI_STUB = """#!/bin/bash
[ "$*" = "stack output ray_token_command" ] || { echo "pulumi stub: $*" >&2; exit 1; }
printf '%s\\n' "$STUB_COMMAND"
"""


def gke_spec(**extra) -> specs.ClusterSpec:
    return specs.load(
        {"platform": "gke", "acceleratorType": "v6e-16", "zone": "us-east5-b", "name": "demo", **extra}
    )


@pytest.fixture
def shell_env(tmp_path: Path) -> dict[str, str]:
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in (("kubectl", KUBECTL_STUB), ("pulumi", PULUMI_STUB)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    command = access.token_command(gke_spec())
    assert command is not None
    return {
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "STUB_SECRET_B64": base64.b64encode(TOKEN.encode()).decode(),
        "STUB_COMMAND": command,
    }


def bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)


def test_token_command_pasted_inside_command_substitution(shell_env):
    """docs/deploy-gke.md: export RAY_AUTH_TOKEN="$(<the command>)"."""
    script = f'export RAY_AUTH_TOKEN="$({shell_env["STUB_COMMAND"]})"; printf %s "$RAY_AUTH_TOKEN"'
    result = bash(script, shell_env)
    assert (result.returncode, result.stdout, result.stderr) == (0, TOKEN, "")


def test_token_command_from_the_stack_output_through_sh(shell_env):
    """docs/deploy-gke.md: export RAY_AUTH_TOKEN="$(sh -c "$(pulumi stack output ray_token_command)")"."""
    script = (
        'export RAY_AUTH_TOKEN="$(sh -c "$(pulumi stack output ray_token_command)")"; '
        'printf %s "$RAY_AUTH_TOKEN"'
    )
    result = bash(script, shell_env)
    assert (result.returncode, result.stdout, result.stderr) == (0, TOKEN, "")


def test_the_stub_refuses_what_the_old_command_sent(shell_env):
    """The stub can fail: the unquoted word-split form hands kubectl the quotes and the pipe."""
    result = bash('x="$($(pulumi stack output ray_token_command))"', shell_env)
    assert result.returncode != 0 and "kubectl stub" in result.stderr


def test_token_command_is_absent_without_token_auth():
    assert access.token_command(gke_spec(rayAuth="none")) is None


def test_commands_are_literal_lines():
    cluster_spec = gke_spec(project="my-proj")
    assert access.token_command(cluster_spec) == (
        "kubectl get secret --namespace=rayslice-demo demo '--output=jsonpath={.data.auth_token}'"
        " | base64 --decode"
    )
    assert access.dashboard_tunnel_command(cluster_spec) == (
        "kubectl port-forward --namespace rayslice-demo service/demo-head-svc 8265:8265"
    )
    assert access.get_credentials_command(cluster_spec, "demo") == (
        "gcloud container clusters get-credentials demo --zone=us-east5-b --project=my-proj --internal-ip"
    )
    assert shlex.split(access.jobs_api_address(cluster_spec)) == [
        "http://demo-head-svc.rayslice-demo.svc.cluster.local:8265"
    ]
