"""The Pulumi engine's side of a component provider, without the Pulumi CLI.

`pulumi up` starts a plugin as a process (``python <package> <engine address>``), reads the port
it prints, and calls it over gRPC: ``GetSchema`` for `pulumi package add`, ``Construct`` for
each component a program declares. The provider then registers the component's resources with
the engine's resource monitor, whose address ``Construct`` carries. Here the engine is played by
two gRPC servers run in the test: a resource monitor that answers as rayslice's offline engine
does (`rayslice.infra.mocks`: Pulumi's mock monitor plus the fake GCP and its cloud twin,
recording every registration) and an engine service that keeps every log line the provider sends.

The fake GCP here hands out the same "random" values in every run (the token, random ids), so
a provider's run and the Python component's run can be compared resource by resource.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import ipaddress
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockResourceArgs
from pulumi.runtime.proto import (
    engine_pb2,
    engine_pb2_grpc,
    provider_pb2,
    provider_pb2_grpc,
    resource_pb2,
    resource_pb2_grpc,
)

from rayslice.cloud import bodies
from rayslice.infra.mocks import FakeGcp, OfflineEngine, Registration, _RecordingMonitor
from rayslice.infra.network import SUBNET_CIDR

REPO = Path(__file__).resolve().parents[3]
PROJECT = "rayslice"
STACK = "offline"
STACK_URN = f"urn:pulumi:{STACK}::{PROJECT}::pulumi:pulumi:Stack::{PROJECT}-{STACK}"
TOKEN = "steady-test-token-not-a-secret"


class SteadyGcp(FakeGcp):
    """The offline engine's fake GCP, with the same token and random ids in every run."""

    def __init__(self) -> None:
        super().__init__()
        self.token = TOKEN

    def new_resource(self, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        resource_id, state = super().new_resource(args)
        if args.typ == "random:index/randomId:RandomId":
            digest = hashlib.sha256(args.name.encode()).hexdigest()
            state["hex"] = digest[: 2 * int(args.inputs["byteLength"])]
        return resource_id, state


class _Monitor(_RecordingMonitor):
    """The recording mock monitor, naming URNs after this module's stack (a gRPC server's
    threads do not see the Pulumi settings a program run sets)."""

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        if parent:
            type_ = parent.split("::")[2].split("$")[-1] + "$" + type_
        return f"urn:pulumi:{STACK}::{PROJECT}::{type_}::{name}"


class MonitorService(resource_pb2_grpc.ResourceMonitorServicer):
    """The resource monitor a provider registers with, over gRPC."""

    def __init__(self) -> None:
        self.fake = SteadyGcp()
        self.monitor = _Monitor(self.fake)

    def SupportsFeature(self, request: Any, context: Any) -> Any:
        # As Pulumi's mock monitor: every feature but output values, so inputs arrive resolved.
        return resource_pb2.SupportsFeatureResponse(hasSupport=request.id != "outputValues")

    def GetDeploymentInfo(self, request: Any, context: Any) -> Any:
        return self.monitor.GetDeploymentInfo(request)

    def RegisterResource(self, request: Any, context: Any) -> Any:
        return self.monitor.RegisterResource(request)

    def RegisterResourceOutputs(self, request: Any, context: Any) -> Any:
        return self.monitor.RegisterResourceOutputs(request)

    def Invoke(self, request: Any, context: Any) -> Any:
        return self.monitor.Invoke(request)

    def ReadResource(self, request: Any, context: Any) -> Any:
        return self.monitor.ReadResource(request)

    def RegisterPackage(self, request: Any, context: Any) -> Any:
        return self.monitor.RegisterPackage(request)

    def SignalAndWaitForShutdown(self, request: Any, context: Any) -> Any:
        return empty_pb2.Empty()


class EngineService(engine_pb2_grpc.EngineServicer):
    """The engine's log, as `pulumi up` would show it, and the stack as the root resource."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def Log(self, request: Any, context: Any) -> Any:
        self.log.append(request.message)
        return empty_pb2.Empty()

    def GetRootResource(self, request: Any, context: Any) -> Any:
        return engine_pb2.GetRootResourceResponse(urn=STACK_URN)

    def SetRootResource(self, request: Any, context: Any) -> Any:
        return engine_pb2.SetRootResourceResponse()


@contextmanager
def _serving(add: Any, service: Any) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    add(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait()


@dataclass
class Provider:
    """The provider process and a client of it."""

    process: subprocess.Popen[bytes]
    stub: Any
    engine: EngineService
    stderr: Path

    def errors(self) -> str:
        """What the provider wrote on stderr so far (the engine shows it in its log)."""
        return self.stderr.read_text()


@contextmanager
def provider(workdir: Path) -> Iterator[Provider]:
    """Start the package's entry point as the CLI does, with an engine service to log to."""
    engine = EngineService()
    with _serving(engine_pb2_grpc.add_EngineServicer_to_server, engine) as engine_address:
        stderr = workdir / "provider.stderr"
        with stderr.open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, str(REPO), engine_address], stdout=subprocess.PIPE, stderr=err, cwd=workdir
            )
        try:
            assert process.stdout is not None
            port = process.stdout.readline().decode().strip()
            assert port.isdigit(), f"the provider printed {port!r}, not a port: {stderr.read_text()}"
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                yield Provider(process, provider_pb2_grpc.ResourceProviderStub(channel), engine, stderr)
        finally:
            process.terminate()
            process.wait(timeout=60)
            process.stdout.close()  # type: ignore[union-attr]


@dataclass(frozen=True)
class FromResources:
    """An input value that is another resource's output: the engine sends it to a provider that
    accepts outputs as an output value naming the resources it came from."""

    value: Any
    urns: tuple[str, ...]


def transformed(value: Any, change: Callable[[Any], Any]) -> Any:
    """`value` with `change` applied to every leaf (what is neither a dict nor a list)."""
    if isinstance(value, dict):
        return {k: transformed(v, change) for k, v in value.items()}
    if isinstance(value, list):
        return [transformed(v, change) for v in value]
    return change(value)


def leaves(value: Any) -> Iterator[Any]:
    """Every leaf of `value` (what is neither a dict nor a list)."""
    if isinstance(value, dict | list):
        for item in value.values() if isinstance(value, dict) else value:
            yield from leaves(item)
    else:
        yield value


def _output_value(leaf: Any) -> Any:
    """A `FromResources` as the output value the engine sends for it (the wire form the
    provider deserializes into a `pulumi.Output` that depends on those resources)."""
    if not isinstance(leaf, FromResources):
        return leaf
    return {
        rpc._special_sig_key: rpc._special_output_value_sig,
        "value": leaf.value,
        "dependencies": sorted(leaf.urns),
    }


@dataclass(frozen=True)
class Ref:
    """A program's reference to another of its resources' outputs (``${vpc.name}`` in YAML)."""

    resource: str
    property: str


@dataclass(frozen=True)
class Declared:
    """A resource the program declares before the component: its full type token, its name and
    its properties, which may hold `Ref`s to resources declared before it."""

    type: str
    name: str
    properties: dict[str, Any]


def _resolved(value: Any, outputs: dict[str, tuple[str, dict[str, Any]]]) -> Any:
    """`value` with each `Ref` as the output it names (`FromResources`)."""

    def resolve(leaf: Any) -> Any:
        if not isinstance(leaf, Ref):
            return leaf
        urn, state = outputs[leaf.resource]
        return FromResources(state[leaf.property], (urn,))

    return transformed(value, resolve)


def _declare(service: MonitorService, program: list[Declared]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Register the program's resources in order, as the engine does for the program; returns
    each one's URN and outputs (its id among them) by name."""
    outputs: dict[str, tuple[str, dict[str, Any]]] = {}
    for resource in program:
        properties = _resolved(resource.properties, outputs)
        urns = sorted(_urns(properties))
        response = service.monitor.RegisterResource(
            resource_pb2.RegisterResourceRequest(
                type=resource.type,
                name=resource.name,
                parent=STACK_URN,
                custom=True,
                object=_struct(_plain(properties)),
                dependencies=urns,
                propertyDependencies={
                    key: resource_pb2.RegisterResourceRequest.PropertyDependencies(urns=sorted(_urns(v)))
                    for key, v in properties.items()
                    if _urns(v)
                },
            )
        )
        state = rpc.deserialize_properties(response.object)
        outputs[resource.name] = (response.urn, {**state, "id": response.id})
    return outputs


def _plain(value: Any) -> Any:
    return transformed(value, lambda leaf: leaf.value if isinstance(leaf, FromResources) else leaf)


def _urns(value: Any) -> set[str]:
    return {urn for leaf in leaves(value) if isinstance(leaf, FromResources) for urn in leaf.urns}


def _struct(values: dict[str, Any]) -> struct_pb2.Struct:
    return asyncio.run(rpc.serialize_properties(transformed(values, _output_value), {}))


@dataclass
class Constructed:
    """One Construct call: its answer (or gRPC error) and what it registered."""

    registrations: list[Registration]
    fake: SteadyGcp
    outputs: dict[str, Any] = field(default_factory=dict)
    error: grpc.RpcError | None = None


def construct(
    client: Provider,
    type_: str,
    name: str,
    inputs: dict[str, Any],
    existing: dict[str, str] | None = None,
    program: list[Declared] | None = None,
    preview: bool = False,
) -> Constructed:
    """Call Construct as the engine does for `new <type_>(name, inputs)` in a program: values
    that are other resources' outputs (`FromResources`) as output values, and each input's
    dependencies beside it.

    `existing`: VPC name -> subnetwork name, created in the cloud beforehand (by the program,
    whose own resources this test does not register). `program`: the program's resources
    declared before the component, registered first; `inputs` may refer to them (`Ref`).
    `preview`: as `pulumi preview` asks (``dryRun``)."""
    service = MonitorService()
    for network, subnetwork in (existing or {}).items():
        _create_network(service.fake, network, subnetwork)
    inputs = _resolved(inputs, _declare(service, program or []))
    with _serving(resource_pb2_grpc.add_ResourceMonitorServicer_to_server, service) as monitor:
        request = provider_pb2.ConstructRequest(
            project=PROJECT,
            stack=STACK,
            organization="organization",
            dryRun=preview,
            parallel=8,
            monitorEndpoint=monitor,
            type=type_,
            name=name,
            parent=STACK_URN,
            inputs=_struct(inputs),
            inputDependencies={
                key: provider_pb2.ConstructRequest.PropertyDependencies(urns=sorted(_urns(value)))
                for key, value in inputs.items()
                if _urns(value)
            },
        )
        result = Constructed(service.monitor.registrations, service.fake)
        try:
            response = client.stub.Construct(request, timeout=300)
        except grpc.RpcError as error:
            result.error = error
            return result
        state = rpc.deserialize_properties(response.state)
        result.outputs = {k: rpc.unwrap_rpc_secret(v) for k, v in state.items()}
        return result


def _create_network(fake: FakeGcp, network: str, subnetwork: str) -> None:
    """A VPC and a subnet in the twin, as the calling program's resources would have made them."""
    fake.new_resource(
        MockResourceArgs(
            "gcp:compute/network:Network", network, {"name": network, "autoCreateSubnetworks": False}
        )
    )
    fake.new_resource(
        MockResourceArgs(
            "gcp:compute/subnetwork:Subnetwork",
            subnetwork,
            {"name": subnetwork, "network": network, "region": "us-east5", "ipCidrRange": "10.20.0.0/20"},
        )
    )


def python_run(
    program: Any, config: dict[str, str] | None = None
) -> tuple[list[Registration], SteadyGcp, Any]:
    """The same component declared by a Python program, under the offline engine."""
    fake = SteadyGcp()
    engine = OfflineEngine(fake=fake)
    value = engine.run(program, config, project=PROJECT, stack=STACK)
    return engine.registrations, fake, value


# Addresses the twin hands out from a subnet, in the order hosts are created: the same set in
# every run, not always to the same host. Every subnet of the examples (the created one,
# SUBNET_CIDR, and the platform team's) is in 10.0.0.0/8; a range (10.0.0.0/8 itself, in a
# firewall rule) is not an address and is kept.
_SUBNET = ipaddress.ip_network("10.0.0.0/8")
assert ipaddress.ip_network(SUBNET_CIDR).subnet_of(_SUBNET)
_IPV4 = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b(?!/)")


def _blank(match: re.Match[str]) -> str:
    try:
        inside = ipaddress.ip_address(match[0]) in _SUBNET
    except ValueError:  # not an address (a version number, say)
        inside = False
    return "<address>" if inside else match[0]


def steady(value: Any) -> str:
    """`value` as JSON with the subnets' addresses blanked out."""
    return _IPV4.sub(_blank, json.dumps(value, sort_keys=True))


def _body(registration: Registration) -> Any:
    request = bodies.request(registration.type, registration.inputs)
    return None if request is None else _unordered(dataclasses.asdict(request))


def _unordered(value: Any) -> Any:
    """A body with its metadata items in key order: the order of a mapping's keys is not kept
    across the wire, and GCE reads metadata items by key."""
    if isinstance(value, dict):
        return {k: _unordered(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [_unordered(v) for v in value]
        if items and all(isinstance(v, dict) and "key" in v for v in items):
            return sorted(items, key=lambda v: str(v["key"]))
        return items
    return value


def declared(registrations: list[Registration], skip: frozenset[str] = frozenset()) -> list[tuple[Any, ...]]:
    """Each resource as comparable values: type, name, parent's type and name, whether custom,
    its inputs (and the REST body the provider would send for them), which inputs are secrets,
    what it depends on, and its options (kept on destroy, replaced or left alone on changes,
    timeouts); resources of the types in `skip` are left out (a parent of that type
    reads as none)."""
    kept = [r for r in registrations if r.type not in skip]
    by_urn = {r.urn: r for r in kept}

    def ref(urn: str) -> tuple[str, str] | None:
        found = by_urn.get(urn)
        return (found.type, found.name) if found else None

    return sorted(
        (
            r.type,
            r.name,
            ref(r.parent),
            r.custom,
            steady(r.inputs),
            steady(_body(r)),
            sorted(r.secret_inputs),
            sorted(str(ref(u)) for u in r.dependencies),
            (r.retain_on_delete, r.replace_on_changes, r.ignore_changes, sorted(r.custom_timeouts.items())),
        )
        for r in kept
    )
