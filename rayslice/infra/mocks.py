"""Run a Pulumi program offline: Pulumi's mocks plus a fake GCP that answers like the real one.

`rayslice preview` and the tests use `run_offline` to execute the real program without the
Pulumi CLI, credentials or network. Every registered resource is recorded with its parent and
inputs, so callers can print a tree or check what would be created. The fake fills in the
outputs the program reads back (host IPs, service accounts' emails and names, custom roles'
names, the token, random IDs), keyed on the type token, as the real provider would after
creation.

Every Compute Engine and TPU resource is also applied to a cloud twin
(`rayslice.cloud.twin.CloudTwin`) as the REST call the provider makes for it
(`rayslice.cloud.bodies`): the twin keeps Google's documented behaviour and rules, and its
answers (self links, reserved and instance IPs from the declared subnetwork, a TPU node's
endpoints) are the outputs the program reads back. A request the twin refuses is kept in
``twin.refused`` and the run goes on with made-up outputs, so one run lists every refusal.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi.runtime
from pulumi.runtime import resource as pulumi_resource
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockCallArgs, MockMonitor, MockResourceArgs
from pulumi.runtime.proto import source_pb2

from rayslice.cloud import bodies
from rayslice.cloud.states import INSTANCE_TERMINATED
from rayslice.cloud.twin import CloudTwin
from rayslice.cloud.twin.state import CloudRuleError
from rayslice.errors import InvalidInput
from rayslice.infra.network import SUBNET_CIDR

STACK_TYPE = "pulumi:pulumi:Stack"
FAKE_PROJECT = "fake-project"
_FAKE_CA = base64.b64encode(b"fake CA").decode()


@dataclass(frozen=True)
class Registration:
    """One resource the program registered, as the engine would have seen it."""

    urn: str
    parent: str  # parent URN; "" for children of the stack
    type: str
    name: str
    custom: bool
    inputs: dict[str, Any]  # plain values, secrets unwrapped (the fake engine's view)
    secret_inputs: frozenset[str]  # top-level input keys whose value is (or holds) a secret
    replace_on_changes: tuple[str, ...] = ()  # inputs whose change replaces the resource
    ignore_changes: tuple[str, ...] = ()  # inputs Pulumi leaves as the cloud has them after creation
    custom_timeouts: Mapping[str, str] = field(default_factory=dict)  # create/update/delete
    dependencies: frozenset[str] = frozenset()  # URNs it waits for (depends_on and inputs)
    # input key -> URNs of the resources whose outputs that input was computed from
    property_dependencies: Mapping[str, frozenset[str]] = field(default_factory=dict)
    retain_on_delete: bool = False  # `pulumi destroy` leaves it in the cloud


@dataclass
class OfflineRun:
    registrations: list[Registration]
    value: Any  # the program's return value with every Output resolved
    fake: FakeGcp

    @property
    def twin(self) -> CloudTwin:
        return self.fake.twin

    def of_type(self, type_token: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == type_token]


class FakeGcp(pulumi.runtime.Mocks):
    """Outputs of created GCP resources: the twin's for Compute Engine and TPU resources (self
    links, addresses from the subnet, a node's endpoints), ids, the generated token."""

    def __init__(self, twin: CloudTwin | None = None) -> None:
        self.token = secrets.token_urlsafe(24)  # the fake "generated" Ray token
        # An existing subnetwork the program does not declare hands out SUBNET_CIDR's addresses.
        self.twin = twin if twin is not None else CloudTwin(default_range=SUBNET_CIDR)
        # The engine registers resources from several threads: one create call at a time reaches
        # the twin (a MIG's worker ids follow the order of its createInstances calls), and each
        # thread knows the URN of the resource it registers (`registering`), which the twin's
        # violations name.
        self._twin_lock = threading.Lock()
        self._registering = threading.local()

    @contextmanager
    def registering(self, urn: str) -> Iterator[None]:
        """`new_resource` calls in this block (on this thread) are for the resource `urn`."""
        self._registering.urn = urn
        try:
            yield
        finally:
            self._registering.urn = None

    def _apply(self, args: MockResourceArgs, inputs: dict[str, Any], project: str) -> dict[str, Any]:
        """The twin's outputs for a Compute Engine or TPU resource ({} for other types, or when
        the twin refused it: the refusal is in ``twin.refused``)."""
        request = bodies.request(args.typ, inputs)
        if request is None:
            return {}
        try:
            with self._twin_lock:
                return self.twin.apply(
                    args.typ,
                    args.name,
                    request,
                    project=project,
                    # A GKE node pool's location is its zone; its cluster is in its URL.
                    zone=inputs.get("zone") or inputs.get("location"),
                    region=inputs.get("region"),
                    target=inputs.get("instanceGroupManager")
                    or inputs.get("router")
                    or inputs.get("cluster"),
                    urn=getattr(self._registering, "urn", None),
                )
        except CloudRuleError:
            return {}
        except InvalidInput:
            if self.twin.refused:  # what refers to a refused resource finds nothing, as on Google
                return {}
            raise

    def new_resource(self, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        inputs = dict(args.inputs)
        project = inputs.get("project") or FAKE_PROJECT
        state: dict[str, Any] = {"project": project, **inputs}
        applied = self._apply(args, inputs, project)
        if args.typ == bodies.TPU_NODE:
            state["networkEndpoints"] = applied.get("networkEndpoints", [])
        elif args.typ == bodies.INSTANCE:
            ips = [nic["networkIp"] for nic in applied.get("networkInterfaces", [])]
            state["networkInterfaces"] = [
                {**nic, "networkIp": ips[i]} if i < len(ips) else dict(nic)
                for i, nic in enumerate(inputs["networkInterfaces"])
            ]
            if applied and inputs.get("desiredStatus") == INSTANCE_TERMINATED:  # stopped once created
                with self._twin_lock:
                    self.twin.stop_instance(project, str(inputs["zone"]), str(inputs["name"]))
        elif args.typ in _SELF_LINKED:
            if inputs.get("region"):
                scope = f"regions/{inputs['region']}"
            elif inputs.get("zone"):
                scope = f"zones/{inputs['zone']}"
            else:
                scope = "global"
            name = inputs.get("name", args.name)
            state["selfLink"] = f"projects/{project}/{scope}/{_SELF_LINKED[args.typ]}/{name}"
            state["selfLinkUnique"] = f"{state['selfLink']}?uniqueId=1"
            state.update(applied)
        elif args.typ == "gcp:serviceaccount/account:Account":
            state["email"] = f"{inputs['accountId']}@{project}.iam.gserviceaccount.com"
            state["member"] = f"serviceAccount:{state['email']}"
            state["name"] = f"projects/{project}/serviceAccounts/{state['email']}"
        elif args.typ == "gcp:projects/iAMCustomRole:IAMCustomRole":
            state["name"] = f"projects/{project}/roles/{inputs['roleId']}"
        elif args.typ == "gcp:container/cluster:Cluster":
            state["endpoint"] = "192.0.2.10"  # TEST-NET-1: never a real address
            if inputs.get("privateClusterConfig", {}).get("enablePrivateEndpoint"):
                state["privateClusterConfig"] = {
                    **inputs["privateClusterConfig"],
                    "privateEndpoint": "192.0.2.11",
                }
            state["masterAuth"] = {"clusterCaCertificate": _FAKE_CA}
        elif args.typ == "random:index/randomPassword:RandomPassword":
            state["result"] = self.token
        elif args.typ == "random:index/randomId:RandomId":
            state["hex"] = secrets.token_hex(int(inputs["byteLength"]))
        elif args.typ == "gcp:secretmanager/secret:Secret":
            state["name"] = f"projects/{project}/secrets/{inputs['secretId']}"
            return state["name"], state
        return f"{args.name}-id", state

    def call(self, args: MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        """Data sources: the caller's project and an existing GKE cluster (``gkeCluster``).

        Each answer comes with an empty list of check failures: the mock monitor iterates it.
        """
        if args.token == "gcp:organizations/getClientConfig:getClientConfig":
            return {"project": FAKE_PROJECT}, []
        if args.token == "gcp:container/getCluster:getCluster":
            # An existing cluster fit for rayslice: Workload Identity on, Dataplane V2.
            return {
                "endpoint": "192.0.2.20",
                "masterAuths": [{"clusterCaCertificate": _FAKE_CA}],
                "workloadIdentityConfigs": [{"workloadPool": f"{FAKE_PROJECT}.svc.id.goog"}],
                "datapathProvider": "ADVANCED_DATAPATH",
            }, []
        return {}, []


# Resources the program refers to by self link, and the collection their link names.
_SELF_LINKED = {
    "gcp:compute/address:Address": "addresses",
    "gcp:compute/resourcePolicy:ResourcePolicy": "resourcePolicies",
    "gcp:compute/instanceTemplate:InstanceTemplate": "instanceTemplates",
    "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate": "instanceTemplates",
    "gcp:compute/instanceGroupManager:InstanceGroupManager": "instanceGroupManagers",
    bodies.IMAGE: "images",
}


class _RecordingMonitor(MockMonitor):
    """Pulumi's mock monitor, also keeping each registration's parent and inputs."""

    def __init__(self, mocks: FakeGcp) -> None:
        super().__init__(mocks)
        self.mocks: FakeGcp = mocks
        self.registrations: list[Registration] = []

    def RegisterResource(self, request):
        with self.mocks.registering(self.make_urn(request.parent, request.type, request.name)):
            response = super().RegisterResource(request)
        if request.type != STACK_TYPE:
            raw = rpc.deserialize_properties(request.object)
            self.registrations.append(
                Registration(
                    urn=response.urn,
                    parent=request.parent,
                    type=request.type,
                    name=request.name,
                    custom=bool(request.custom),
                    inputs=_unwrap(raw),
                    secret_inputs=frozenset(k for k, v in raw.items() if _holds_secret(v)),
                    replace_on_changes=tuple(request.replaceOnChanges),
                    ignore_changes=tuple(request.ignoreChanges),
                    custom_timeouts=_timeouts(request),
                    dependencies=frozenset(request.dependencies),
                    property_dependencies={
                        key: frozenset(deps.urns) for key, deps in request.propertyDependencies.items()
                    },
                    retain_on_delete=bool(request.retainOnDelete),
                )
            )
        return response


def _timeouts(request: Any) -> dict[str, str]:
    if not request.HasField("customTimeouts"):
        return {}
    timeouts = request.customTimeouts
    return {
        k: v
        for k, v in (("create", timeouts.create), ("update", timeouts.update), ("delete", timeouts.delete))
        if v
    }


def _holds_secret(value: Any) -> bool:
    if rpc.is_rpc_secret(value):
        return True
    if isinstance(value, dict):
        return any(_holds_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_secret(v) for v in value)
    return False


def _unwrap(value: Any) -> Any:
    value = rpc.unwrap_rpc_secret(value)
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def install_mocks(
    mocks: pulumi.runtime.Mocks,
    *,
    project: str,
    stack: str,
    monitor: MockMonitor | None = None,
) -> asyncio.AbstractEventLoop:
    """Make `mocks` the engine for the next Pulumi program run in this thread; returns the run's
    event loop (`finish_run` ends it, or the next call here does).

    Pulumi's mocks run on the thread's current event loop, which an earlier asyncio.run() in
    the same process leaves unset (the Jobs client's log streaming does): each run gets its
    own, or it fails with "There is no current event loop" depending on what ran before it.
    """
    global _mocks_loop
    if _mocks_loop is not None:
        finish_run(_mocks_loop)
    _mocks_loop = asyncio.new_event_loop()
    _mocks_loop.set_default_executor(_Workers())
    asyncio.set_event_loop(_mocks_loop)
    pulumi_resource._get_stack_trace = _no_stack_trace
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor)
    return _mocks_loop


# Pulumi's own, which every run replaces with `_no_stack_trace`: bench/offline_run.py's baseline.
PULUMIS_STACK_TRACE = pulumi_resource._get_stack_trace


def _no_stack_trace() -> source_pb2.StackTrace:
    """What the offline engine's runs send as each resource's stack trace: none. Pulumi walks
    the Python stack at every registration (`traceback.extract_stack`, which stats the source file
    of every frame) so that a real engine can point its diagnostics at the user's line; the mocks
    never read it. The walk grows with the caller's stack: bench/offline_run.py measures it."""
    return source_pb2.StackTrace()


_mocks_loop: asyncio.AbstractEventLoop | None = None


class _Workers(ThreadPoolExecutor):
    """The threads Pulumi hands each call to the mocks: each makes an event loop of its own
    (Pulumi's `_sync_await`), which this executor closes once its threads have ended."""

    def __init__(self) -> None:
        self.loops: list[asyncio.AbstractEventLoop] = []
        super().__init__(thread_name_prefix="pulumi-mocks", initializer=self._own_loop)

    def _own_loop(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loops.append(loop)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait, cancel_futures=cancel_futures)
        if wait:
            for loop in self.loops:
                loop.close()


def finish_run(loop: asyncio.AbstractEventLoop) -> None:
    """Let the calls a run handed to its worker threads finish, then close the run's loop.

    Pulumi sends each registration to the mocks on the loop's default executor (`_Workers`) and
    leaves Outputs nobody awaited as pending tasks. Left as they are, a process running many
    programs keeps every run's threads and loops, about 20 file descriptors a run, until
    `select()` fails past descriptor 1023; and a create still under way after an interrupted run
    would change the state it is read from.
    """
    if loop.is_closed():
        return
    loop.run_until_complete(loop.shutdown_default_executor())
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


class OfflineEngine:
    """One offline deployment: the fake cloud and what the program registered with it."""

    def __init__(self, twin: CloudTwin | None = None, fake: FakeGcp | None = None) -> None:
        """`fake`: the fake cloud to run against (one that fails a create, say); a `FakeGcp` on
        `twin` if None."""
        self.fake = fake if fake is not None else FakeGcp(twin)
        self._monitor = _RecordingMonitor(self.fake)

    @property
    def registrations(self) -> list[Registration]:
        return list(self._monitor.registrations)

    def run(
        self,
        program: Callable[[], Any],
        config: Mapping[str, str] | None = None,
        project: str = "rayslice",
        stack: str = "offline",
    ) -> Any:
        """Run `program` with `config` (``namespace:key`` -> string) as the stack's config.

        Returns the program's return value with every Output resolved. Exceptions from the
        program (a `SpecError`, for one) propagate unchanged.
        """
        loop = install_mocks(self.fake, project=project, stack=stack, monitor=self._monitor)
        pulumi.runtime.set_all_config(dict(config or {}))
        result: dict[str, Any] = {}

        @pulumi.runtime.test
        def _run() -> pulumi.Output[Any]:
            return pulumi.Output.from_input(program()).apply(lambda value: result.update(value=value))

        try:
            _run()
        except BaseException:
            # The failure goes to the caller; the Outputs that waited on it failed with it, and
            # nobody reads them: asyncio would log each as "never retrieved" when it is freed.
            loop.set_exception_handler(_unless_unread)
            raise
        finally:
            finish_run(loop)
        return result.get("value")


# What asyncio says when it frees a failed Future or Task (an `Output.all`'s gather, say) whose
# exception nobody read (CPython 3.11 asyncio/futures.py: "{class name} exception was never retrieved").
_UNREAD = frozenset({"Future exception was never retrieved", "Task exception was never retrieved"})


def _unless_unread(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's handler, less the failures of a failed run that no one was left to read."""
    if context.get("message") not in _UNREAD:
        loop.default_exception_handler(context)


def run_offline(
    program: Callable[[], Any], config: Mapping[str, str] | None = None, twin: CloudTwin | None = None
) -> OfflineRun:
    """Run `program` once in a fresh `OfflineEngine`, applying its resources to `twin` (a fresh
    one if None)."""
    engine = OfflineEngine(twin)
    value = engine.run(program, config)
    return OfflineRun(registrations=engine.registrations, value=value, fake=engine.fake)
