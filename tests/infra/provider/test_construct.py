"""The component package over Pulumi's own protocol, without the CLI.

The provider runs as `pulumi up` runs it (the package's __main__.py as a process, a real gRPC
server on a loopback port); the test plays the engine (tests/infra/provider/engine.py). For an
example stack of each platform, ``Construct`` must register exactly what the Python component
registers for the same keys under the offline engine: the same types, names, parents, inputs,
REST request bodies, secrets and dependencies, with the cloud twin refusing nothing. Bad input
must come back as the spec's one-line message, with no traceback anywhere the engine shows.
"""

from __future__ import annotations

import functools
from typing import Any

import grpc
import pulumi_gcp as gcp
import pytest
import yaml
from google.protobuf import empty_pb2
from pulumi.runtime.proto import provider_pb2

from rayslice import spec
from rayslice.errors import InvalidInput
from rayslice.infra import ExistingNetwork, TpuRayCluster, TpuRayClusterArgs, provider, record_bucket
from tests.infra.provider import engine

EXAMPLES = {
    "compute": "Pulumi.example-compute-v6e-16.yaml",
    "tpu-vm": "Pulumi.example-multislice.yaml",  # 2 slices, a list and a map: every wire type
    "gke": "Pulumi.example-gke-v6e-16.yaml",
}
OUTER = "rayslice:index:TpuRayCluster"  # the package's component, which holds the Python one
INNER = "rayslice:infra:TpuRayCluster"


def _keys(stack_file: str) -> dict[str, Any]:
    """An example stack's keys as a YAML or TypeScript program writes them (native values)."""
    config = yaml.safe_load((engine.REPO / "infra" / stack_file).read_text())["config"]
    keys = {k.split(":", 1)[1]: v for k, v in config.items() if k.startswith("rayslice:")}
    return {"project": config["gcp:project"], **keys}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with engine.provider(tmp_path_factory.mktemp("provider")) as running:
        yield running


@functools.cache
def _python(stack_file: str) -> tuple[list[Any], Any, dict[str, Any]]:
    keys = _keys(stack_file)
    return engine.python_run(
        lambda: TpuRayCluster(keys["name"], TpuRayClusterArgs(spec=spec.load(keys))).exports
    )


_constructed: dict[str, engine.Constructed] = {}


def _construct(client: engine.Provider, stack_file: str) -> engine.Constructed:
    if stack_file not in _constructed:
        keys = _keys(stack_file)
        _constructed[stack_file] = engine.construct(client, OUTER, keys["name"], keys)
    return _constructed[stack_file]


def test_get_schema_answers_the_checked_in_schema(client):
    answer = client.stub.GetSchema(provider_pb2.GetSchemaRequest(version=0))
    assert answer.schema == (engine.REPO / provider.SCHEMA_FILE).read_text()
    assert client.stub.GetPluginInfo(empty_pb2.Empty()).version == "0.1.0"


@pytest.mark.parametrize("platform", sorted(EXAMPLES))
def test_construct_registers_what_the_python_component_registers(client, platform):
    stack_file = EXAMPLES[platform]
    constructed = _construct(client, stack_file)
    assert constructed.error is None, constructed.error
    registrations, fake, _ = _python(stack_file)
    assert {r.type for r in registrations} >= {INNER}
    # One more resource: the package's component, under the stack, holding the Python one.
    (outer,) = [r for r in constructed.registrations if r.type == OUTER]
    assert outer.parent == engine.STACK_URN and outer.name == _keys(stack_file)["name"]
    (inner,) = [r for r in constructed.registrations if r.type == INNER]
    assert inner.parent == outer.urn
    assert engine.declared(constructed.registrations, frozenset({OUTER})) == engine.declared(registrations)
    assert len(constructed.registrations) == len(registrations) + 1
    assert constructed.fake.twin.refused == [] and fake.twin.refused == []
    platforms = {"compute": "ComputeCluster", "tpu-vm": "TpuVmCluster", "gke": "GkeTpuCluster"}
    assert any(r.type == f"rayslice:infra:{platforms[platform]}" for r in constructed.registrations)


def test_preview_declares_the_same(client):
    """`pulumi preview` calls Construct with dryRun: the same resources are declared."""
    keys = _keys(EXAMPLES["compute"])
    previewed = engine.construct(client, OUTER, keys["name"], keys, preview=True)
    assert previewed.error is None, previewed.error
    registrations, _, _ = _python(EXAMPLES["compute"])
    assert engine.declared(previewed.registrations, frozenset({OUTER})) == engine.declared(registrations)


@pytest.mark.parametrize("platform", sorted(EXAMPLES))
def test_construct_outputs_are_the_python_exports(client, platform):
    stack_file = EXAMPLES[platform]
    constructed = _construct(client, stack_file)
    _, _, exports = _python(stack_file)
    assert set(exports) <= set(provider.OUTPUTS)  # the schema declares every export
    expected = {provider.camel(k): v for k, v in exports.items() if v is not None}
    assert engine.steady(constructed.outputs) == engine.steady(expected)


def test_outputs_are_exactly_the_platforms_exports(client):
    exported = set().union(*(_python(stack_file)[2] for stack_file in EXAMPLES.values()))
    assert exported == set(provider.OUTPUTS)


BAD = {
    "unknown accelerator type": {"acceleratorType": "v9z-16"},
    "public dashboard range": {"dashboardSourceRanges": ["0.0.0.0/0"]},
    "fractional slice count": {"slices": 1.5},
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_fails_with_the_spec_message(client, case):
    keys = {**_keys(EXAMPLES["compute"]), **BAD[case]}
    with pytest.raises(spec.SpecError) as python_error:
        spec.load(keys)
    message = str(python_error.value)
    assert "\n" not in message
    constructed = engine.construct(client, OUTER, keys["name"], keys)
    assert constructed.error is not None
    assert constructed.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert constructed.error.details() == message
    assert constructed.registrations == []  # refused before anything was declared
    assert "Traceback" not in client.errors()
    assert not [line for line in client.engine.log if "Traceback" in line or 'File "' in line]


def test_existing_network_waits_for_the_program_vpc(client):
    """A VPC declared by the calling program arrives as names that depend on its resources:
    rayslice creates no network, and every host and firewall rule waits for the VPC."""
    keys = {k: v for k, v in _keys(EXAMPLES["compute"]).items()}
    vpc = f"urn:pulumi:{engine.STACK}::{engine.PROJECT}::gcp:compute/network:Network::platform-vpc"
    subnet = f"urn:pulumi:{engine.STACK}::{engine.PROJECT}::gcp:compute/subnetwork:Subnetwork::platform-tpu"
    constructed = engine.construct(
        client,
        OUTER,
        keys["name"],
        {
            **keys,
            "existingNetwork": {
                "network": engine.FromResources("platform-vpc", (vpc,)),
                "subnetwork": engine.FromResources("platform-tpu", (subnet,)),
            },
        },
        existing={"platform-vpc": "platform-tpu"},
    )
    assert constructed.error is None, constructed.error
    types = {r.type for r in constructed.registrations}
    assert "gcp:compute/network:Network" not in types and "gcp:compute/subnetwork:Subnetwork" not in types
    waiting = [
        r
        for r in constructed.registrations
        if r.type
        in (
            "gcp:compute/firewall:Firewall",
            "gcp:compute/instance:Instance",
            "gcp:compute/instanceTemplate:InstanceTemplate",
        )
    ]
    assert waiting
    for r in waiting:
        assert vpc in r.dependencies, r.name
    templates = [r for r in waiting if r.type == "gcp:compute/instanceTemplate:InstanceTemplate"]
    assert all(t.inputs["networkInterfaces"][0]["subnetwork"] == "platform-tpu" for t in templates)
    assert constructed.fake.twin.refused == []


def test_record_bucket_registers_what_the_python_component_registers(client):
    """The package's other component: a record bucket for many clusters, writable by a service
    account the program declares (an output in a list of plain members)."""
    account = engine.Declared("gcp:serviceaccount/account:Account", "runner", {"accountId": "runner"})
    constructed = engine.construct(
        client,
        provider.RECORD_BUCKET_TYPE,
        "record",
        {
            "name": "my-org-rayslice-record",
            "project": "my-gcp-project",
            "location": "us-east5",
            "keepDays": 30,
            "lockedDays": 7,
            "writers": ["user:ml-team@example.com", engine.Ref("runner", "member")],
            "readers": ["group:ops@example.com"],
            "labels": {"team": "ml-platform"},
        },
        program=[account],
    )
    assert constructed.error is None, constructed.error

    def python_program() -> Any:
        runner = gcp.serviceaccount.Account("runner", account_id="runner")
        bucket = record_bucket.RecordBucket(
            "record",
            record_bucket.RecordBucketArgs(
                name="my-org-rayslice-record",
                project="my-gcp-project",
                location="us-east5",
                keep_days=30,
                locked_days=7,
                writers=["user:ml-team@example.com", runner.member],
                readers=["group:ops@example.com"],
                labels={"team": "ml-platform"},
            ),
        )
        return bucket.url

    registrations, _, url = engine.python_run(python_program)
    # No wrapper here: the package serves the Python component under its own type.
    assert engine.declared(constructed.registrations) == engine.declared(registrations)
    (bucket,) = [r for r in constructed.registrations if r.type == "gcp:storage/bucket:Bucket"]
    assert bucket.retain_on_delete and bucket.inputs["lifecycleRules"][0]["condition"]["age"] == 30
    member = "gcp:storage/bucketIAMMember:BucketIAMMember"
    assert len([r for r in constructed.registrations if r.type == member]) == 3
    assert constructed.outputs == {"url": url} and url == "gs://my-org-rayslice-record"


def test_record_bucket_bad_input_fails_with_the_component_message(client):
    with pytest.raises(InvalidInput) as python_error:
        record_bucket.RecordBucketArgs(name="b", project=None, location="us-east5", keep_days=0)
    constructed = engine.construct(
        client, provider.RECORD_BUCKET_TYPE, "record", {"name": "b", "location": "us-east5", "keepDays": 0}
    )
    assert constructed.error is not None and constructed.error.details() == str(python_error.value)
    assert constructed.registrations == []
    assert "Traceback" not in client.errors()


def test_network_named_twice_fails_with_the_component_message(client):
    """The Python component's own rule (not the spec's): one way to name the network."""
    keys = {**_keys(EXAMPLES["compute"]), "network": "platform-vpc"}
    with pytest.raises(InvalidInput) as python_error:
        TpuRayClusterArgs(spec=spec.load(keys), network=ExistingNetwork("platform-vpc"))
    constructed = engine.construct(
        client, OUTER, keys["name"], {**keys, "existingNetwork": {"network": "platform-vpc"}}
    )
    assert constructed.error is not None and constructed.error.details() == str(python_error.value)
    assert "\n" not in str(python_error.value)
    assert constructed.registrations == []
