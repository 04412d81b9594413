"""The cloud API emulation on its own: its token endpoint checks what Google checks, unknown
calls are not answered, operations finish only after being polled, every call is recorded."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from google.auth import crypt, jwt
from google.auth.transport.requests import Request
from google.oauth2 import service_account

from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.cloud_api.oauth import GOOGLE_TOKEN_AUDIENCE
from tests import serving


@pytest.fixture
def cloud() -> Iterator[CloudApiEmulator]:
    server = CloudApiEmulator(op_polls=2)
    serving.start(server)
    yield server
    serving.stop(server)


def _assertion(info: dict[str, str], audience: str = GOOGLE_TOKEN_AUDIENCE) -> str:
    signer = crypt.RSASigner.from_service_account_info(info)
    now = int(time.time())
    payload = {"iss": info["client_email"], "aud": audience, "scope": "x", "iat": now, "exp": now + 600}
    return jwt.encode(signer, payload).decode()


def test_a_token_is_issued_only_for_an_assertion_signed_with_its_key(cloud: CloudApiEmulator) -> None:
    credentials = service_account.Credentials.from_service_account_info(
        cloud.service_account_info(), scopes=["https://www.googleapis.com/auth/cloud-platform"]
    )
    credentials.refresh(google_request())
    assert credentials.token in cloud.tokens

    other = CloudApiEmulator()  # another key pair
    try:
        forged = _assertion(other.service_account_info())
    finally:
        other.server_close()
    grant = "urn:ietf:params:oauth:grant-type:jwt-bearer"
    answer = requests.post(f"{cloud.url}/token", data={"grant_type": grant, "assertion": forged}, timeout=10)
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_grant"
    wrong_audience = _assertion(cloud.service_account_info(), audience=f"{cloud.url}/token")
    answer = requests.post(
        f"{cloud.url}/token", data={"grant_type": grant, "assertion": wrong_audience}, timeout=10
    )
    assert answer.status_code == 400


def google_request() -> Request:
    return Request()


def test_calls_without_a_valid_token_or_outside_the_emulated_methods_are_refused(
    cloud: CloudApiEmulator,
) -> None:
    cloud.add_node("p", "z", "n")
    url = f"{cloud.url}/v2/projects/p/locations/z/nodes/n"
    assert requests.get(url, timeout=10).status_code == 401
    assert requests.get(url, headers={"Authorization": "Bearer made-up"}, timeout=10).status_code == 401
    cloud.tokens.add("t")
    auth = {"Authorization": "Bearer t"}
    assert requests.get(url, headers=auth, timeout=10).json()["state"] == "READY"
    stop = requests.post(url + ":stop", headers=auth, json={}, timeout=10)  # real, but not emulated
    assert stop.status_code == 404 and stop.json()["error"]["status"] == "NOT_FOUND"
    assert [c.status for c in cloud.calls] == [401, 401, 200, 404]


def test_an_operation_is_done_only_after_it_was_polled(cloud: CloudApiEmulator) -> None:
    cloud.add_node("p", "z", "n")
    cloud.tokens.add("t")
    auth = {"Authorization": "Bearer t"}
    base = f"{cloud.url}/v2/projects/p/locations/z"
    operation = requests.delete(f"{base}/nodes/n", headers=auth, timeout=10).json()
    assert operation["done"] is False
    assert requests.get(f"{base}/nodes/n", headers=auth, timeout=10).json()["state"] == "DELETING"
    polls = [
        requests.get(f"{cloud.url}/v2/{operation['name']}", headers=auth, timeout=10).json() for _ in range(2)
    ]
    assert [p["done"] for p in polls] == [False, True]
    assert requests.get(f"{base}/nodes/n", headers=auth, timeout=10).status_code == 404
    assert json.dumps(polls[1]).count("error") == 0


@pytest.mark.parametrize("platform", ["tpu-vm", "compute"])
def test_the_simulator_hooks_fire_once_per_slice_when_deletion_and_recreation_finish(
    cloud: CloudApiEmulator, platform: str
) -> None:
    seen: list[tuple[str, str]] = []
    cloud.on_slice_down = lambda name: seen.append(("down", name))
    cloud.on_slice_up = lambda name: seen.append(("up", name))
    cloud.tokens.add("t")
    auth = {"Authorization": "Bearer t"}
    steps: list[tuple[str, str, dict[str, Any] | None]]
    if platform == "tpu-vm":
        cloud.add_node("p", "z", "s")
        base = f"{cloud.url}/v2/projects/p/locations/z"
        steps = [
            ("DELETE", f"{base}/nodes/s", None),
            ("POST", f"{base}/nodes?nodeId=s", {"acceleratorType": "v6e-16"}),
        ]
    else:
        cloud.add_mig("p", "z", "s", ["s-w0"])
        base = f"{cloud.url}/compute/v1/projects/p/zones/z/instanceGroupManagers"
        steps = [
            ("DELETE", f"{base}/s", None),
            ("POST", base, {"name": "s", "targetSize": 0}),
            ("POST", f"{base}/s/createInstances", {"instances": [{"name": "s-w0"}]}),
        ]
    for method, url, body in steps:
        before = list(seen)
        operation = requests.request(method, url, json=body, headers=auth, timeout=10).json()
        assert seen == before  # nothing happens to the hosts before the operation finishes
        poll = (
            f"{cloud.url}/v2/{operation['name']}"
            if platform == "tpu-vm"
            else f"{base.rsplit('/', 1)[0]}/operations/{operation['name']}"
        )
        for _ in range(2):
            requests.get(poll, headers=auth, timeout=10)
    assert seen == [("down", "s"), ("up", "s")]


@pytest.mark.parametrize(
    "pair",
    [
        {"networkConfig": {"network": "n"}, "networkConfigs": [{"network": "n"}]},
        {"acceleratorType": "v6e-16", "acceleratorConfig": {"type": "V6E", "topology": "4x4"}},
    ],
    ids=["networkConfig", "acceleratorConfig"],
)
def test_a_node_with_both_of_an_exclusive_pair_is_refused_as_google_refuses_it(
    cloud: CloudApiEmulator, pair: dict[str, Any]
) -> None:
    """tpu v2 discovery document, Node.networkConfig: "network_config and network_configs are
    mutually exclusive ... If both are specified, an error will be returned"; the emulation
    calls the rule that `rayslice preview` and the policy pack run (tpu-node-exclusive-fields)."""
    cloud.tokens.add("t")
    auth = {"Authorization": "Bearer t"}
    url = f"{cloud.url}/v2/projects/p/locations/z/nodes"
    body = {"runtimeVersion": "v2-alpha-tpuv6e", **pair}
    answer = requests.post(url, params={"nodeId": "n"}, json=body, headers=auth, timeout=10)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and error["code"] == 400
    first, second = pair
    assert f"sets both {first} and {second}; they are mutually exclusive" in error["message"]
    assert "rule tpu-node-exclusive-fields" in error["message"]
    assert "tpu v2 discovery document" in error["message"]
    assert ("p", "z", "n") not in cloud.state.nodes
    one = {k: v for k, v in body.items() if k != second}
    assert requests.post(url, params={"nodeId": "n"}, json=one, headers=auth, timeout=10).status_code == 200
