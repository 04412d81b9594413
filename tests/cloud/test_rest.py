"""The REST plumbing the controller, `rayslice status` and the providers share: endpoint
overrides, and failures that leave as rayslice errors (the CLI's exit 3), translated once."""

from __future__ import annotations

import ast
import socket
from pathlib import Path

import pytest
import requests

from rayslice.cloud import rest
from rayslice.cloud.rest import (
    COMPUTE_DEFAULT,
    COMPUTE_ENDPOINT_ENV,
    TPU_DEFAULT,
    TPU_ENDPOINT_ENV,
    RestClient,
    endpoint,
)
from rayslice.errors import EXIT_NO_CLUSTER, CloudError, InvalidInput, RaysliceError
from tests.conftest import REPO


def test_endpoints_default_to_googles_and_follow_gclouds_override_variables() -> None:
    assert endpoint(TPU_ENDPOINT_ENV, TPU_DEFAULT, {}) == "https://tpu.googleapis.com/"
    assert endpoint(COMPUTE_ENDPOINT_ENV, COMPUTE_DEFAULT, {}) == "https://compute.googleapis.com/compute/v1/"
    env = {COMPUTE_ENDPOINT_ENV: "https://compute.example.internal/compute/v1"}
    assert (
        endpoint(COMPUTE_ENDPOINT_ENV, COMPUTE_DEFAULT, env) == "https://compute.example.internal/compute/v1/"
    )
    for allowed in ("http://127.0.0.1:9000/", "http://10.88.0.1:8080/", "http://100.71.76.1:8780/"):
        assert endpoint(TPU_ENDPOINT_ENV, TPU_DEFAULT, {TPU_ENDPOINT_ENV: allowed}) == allowed


@pytest.mark.parametrize(
    "value", ["http://tpu.example.com/", "http://8.8.8.8/", "http://100.128.0.1/", "ftp://10.0.0.1/", "tpu"]
)
def test_an_override_that_would_send_the_token_in_clear_over_the_internet_is_refused(value: str) -> None:
    with pytest.raises(InvalidInput, match=TPU_ENDPOINT_ENV):
        endpoint(TPU_ENDPOINT_ENV, TPU_DEFAULT, {TPU_ENDPOINT_ENV: value})


def test_a_call_that_gets_no_answer_in_time_is_a_cloud_error_naming_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rest, "REQUEST_TIMEOUT_S", 0.3)
    with socket.socket() as silent:  # accepts the connection (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v2/projects/p/locations/z/nodes"
        with pytest.raises(CloudError) as caught:
            RestClient(requests.Session()).pages("GET", url, "nodes")
    error = caught.value
    assert isinstance(error, RaysliceError) and error.exit_code == EXIT_NO_CLUSTER
    assert error.status is None and error.call == f"GET {url}"
    assert str(error) == f"{error.call} failed: no answer: no answer within 0.3 s"


# Who else may build a session: the clients of Google's other APIs (Cloud Storage and Monitoring),
# which import google-auth only when called, for readers of a record that may lack it.
OTHER_APIS = ("rayslice/observability/gcs.py", "rayslice/observability/monitoring.py")
SESSION_MAKERS = ("AuthorizedSession", "from_service_account_file", "from_service_account_info")


def _session_calls(path: Path) -> list[int]:
    """The lines of `path` that build a session or load credentials."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            called = ast.unparse(node.func)
            if called.rsplit(".", 1)[-1] in SESSION_MAKERS or called == "google.auth.default":
                found.append(node.lineno)
    return found


def test_the_tpu_compute_and_gke_clients_get_their_sessions_here_only() -> None:
    """The controller, `rayslice status` and the providers share one way to authenticate (this
    module): none of rayslice's other modules builds a session or loads credentials."""
    package = REPO / "rayslice"
    made = {
        str(path.relative_to(REPO)): lines
        for path in sorted(package.rglob("*.py"))
        if (lines := _session_calls(path))
    }
    assert set(made) - set(OTHER_APIS) == {"rayslice/cloud/rest.py"}, made
