"""The rayslice component package: `TpuRayCluster` (and `RecordBucket`) for TypeScript, Go, C#,
Java and YAML programs.

Pulumi runs a source-based component package (PulumiPlugin.yaml at the repository root, runtime
python) by starting its ``__main__.py``, which calls `serve`: a gRPC provider that answers the
engine's ``GetSchema`` (what ``pulumi package add`` turns into an SDK for the user's language) and
``Construct`` (a program's ``new rayslice.TpuRayCluster(...)``). Pulumi's Python SDK does the
protocol (`pulumi.provider.experimental`): its analyzer infers the schema from the annotations
below, and its `ComponentProvider` maps the engine's inputs onto them.

The cluster's component here is a thin wrapper. Its inputs are the stack config keys
(`rayslice.spec.KEYS`, camelCase as in a stack file), read by `spec.load` exactly as rayslice's
own program reads them, plus ``existingNetwork``: the schema-friendly form of
`rayslice.infra.ExistingNetwork` (names that may be other resources' outputs). It then declares
the Python `rayslice.infra.TpuRayCluster` as its only child, so every resource, name and request
body is the Python component's, and re-exports its `exports` as typed outputs. The record
bucket's is the Python `RecordBucket` itself, taking camelCase inputs.

The analyzer knows only types; descriptions, defaults, integer ranges and allowed values of the
config keys come from the spec (`with_spec` adds them), so the spec stays the one declaration
of every key. A key whose value is wrong fails ``Construct`` with the spec's own one-line
message, and any other input the components refuse with theirs; never a traceback
(`RaysliceProvider.construct`).

No ``from __future__ import annotations`` here: the analyzer reads the annotations as types.
"""

import inspect
import json
import sys
from enum import Enum
from importlib import metadata
from typing import Any, NotRequired, TypedDict, cast

import pulumi
import pulumi.provider
from pulumi.errors import InputPropertiesError
from pulumi.provider.experimental.analyzer import ComponentDefinition
from pulumi.provider.experimental.component import ComponentProvider
from pulumi.provider.experimental.util import camel_case
from pulumi.provider.provider import ConstructResult
from pulumi.provider.server import ComponentInitError

from rayslice import spec
from rayslice.errors import RaysliceError
from rayslice.infra import cluster, record_bucket
from rayslice.infra.network import ExistingNetwork as PythonExistingNetwork

# The package name users add (`pulumi package add`) and the component's type token: the SDK's
# ComponentProvider serves components in the "index" module only.
PACKAGE = "rayslice"
COMPONENT = "TpuRayCluster"
COMPONENT_TYPE = f"{PACKAGE}:index:{COMPONENT}"
# The Python component's own type token, which the package serves as it is.
RECORD_BUCKET_TYPE = f"{PACKAGE}:index:RecordBucket"
# The checked-in schema, relative to the root of a checkout (scripts/write_provider_schema.py).
SCHEMA_FILE = "schema.json"
# An input that is not a config key: the Python API's `TpuRayClusterArgs.network`.
EXISTING_NETWORK = "existingNetwork"


def _version() -> str:
    return metadata.version(PACKAGE)


# ---- the inputs: one per config key, typed as the spec types it --------------------------------


def _pascal(key_name: str) -> str:
    return key_name[0].upper() + key_name[1:]


def _choices(key: spec.Key) -> type[Enum]:
    """A Literal key's allowed values as an enum, which the schema turns into an enum type."""
    members = {value.upper().replace("-", "_"): value for value in key.choices}
    return Enum(_pascal(key.name), members, module=__name__)  # type: ignore[return-value]


# Config key -> the enum of its allowed values (keys with `choices` only).
CHOICES: dict[str, type[Enum]] = {key.name: _choices(key) for key in spec.KEYS if key.choices}

# Pulumi config type (`spec.Key.type`) -> the annotation the analyzer maps back to it. Every
# config key is plain: `spec.load` needs its value before any resource is declared.
_ANNOTATIONS: dict[str, Any] = {
    "string": str,
    "integer": int,
    "boolean": bool,
    "array": list[str],
    "object": dict[str, str],
}

# The config keys as a TypedDict, all optional as in a stack file (`spec.load` fills defaults).
ConfigKeys: Any = TypedDict(  # type: ignore[misc]  # built from the spec, not written out
    "ConfigKeys",
    {key.name: CHOICES.get(key.name, _ANNOTATIONS[key.type]) for key in spec.KEYS},
    total=False,
)


class ExistingNetwork(TypedDict):
    """A VPC, and optionally a subnetwork of it, that the cluster joins instead of creating its
    own network. rayslice adds its firewall rules to it and changes nothing else."""

    network: pulumi.Input[str]
    """Name of the VPC network; pass the network resource's name output, so that every host and
    firewall rule waits for it."""
    subnetwork: NotRequired[pulumi.Input[str]]
    """Name of a subnetwork of that network for the hosts; absent: the network's own."""


class TpuRayClusterArgs(ConfigKeys, total=False):
    """Every config key of a stack file (camelCase, docs/configuration.md), and the network."""

    existingNetwork: ExistingNetwork  # camelCase: the schema's name, as users write it
    """A VPC your program declares (or looks up): the cluster joins it and creates no network.
    Set this, or the network and subnetwork keys, or neither."""


def _whole(value: Any) -> Any:
    """An integer input as Pulumi sends it (a double) back to an int when it is whole."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def spec_config(args: dict[str, Any]) -> dict[str, Any]:
    """The config keys among a component's inputs, as `spec.load` reads them.

    Pulumi sends every number as a double (2 arrives as 2.0); an integer key's whole value goes
    back to an int, anything else reaches the spec as it came (an enum key's value as a string:
    `RaysliceProvider.map_inputs`) and is refused there."""
    integers = {key.name for key in spec.KEYS if key.type == "integer"}
    config = {}
    for name, value in args.items():
        if name not in spec.KEY_NAMES:
            continue
        config[name] = _whole(value) if name in integers else value
    return config


# ---- the component -----------------------------------------------------------------------------


class TpuRayCluster(pulumi.ComponentResource):
    """A Ray cluster on Cloud TPU slices (Compute Engine, Cloud TPU VMs or GKE), with the
    outputs a user needs to reach it. Its inputs are the keys of a rayslice stack file."""

    jobs_api_address: pulumi.Output[str]
    """Address of the Ray Jobs API and dashboard inside the VPC (http://HEAD:8265)."""
    local_jobs_api_address: pulumi.Output[str]
    """The Jobs API's address on this machine once the dashboard tunnel is open."""
    dashboard_tunnel_command: pulumi.Output[str]
    """The command that opens a tunnel to the dashboard (IAP on VMs, kubectl port-forward on GKE)."""
    slice_names: pulumi.Output[list[str]]
    """The slices' names, in order."""
    ray_token_command: pulumi.Output[str] | None
    """The command that prints the Ray token; absent with rayAuth none."""
    head_internal_ip: pulumi.Output[str] | None
    """VM platforms: the Ray head's internal IP address."""
    slice_host_ips: pulumi.Output[dict[str, list[str]]] | None
    """VM platforms: each slice's hosts' internal IP addresses, by slice name."""
    ssh_commands: pulumi.Output[dict[str, str]] | None
    """VM platforms: the command that opens a shell on each slice (and the head VM), by name."""
    service_account_email: pulumi.Output[str] | None
    """VM platforms: the hosts' service account."""
    compilation_cache: pulumi.Output[str] | None
    """VM platforms: where the hosts keep JAX's compilation cache (gs://...); absent without one."""
    record: pulumi.Output[str] | None
    """VM platforms: the cluster's record (gs://BUCKET/clusters/NAME/RUN) for `rayslice history`;
    absent with recordBucket none."""
    gke_cluster_name: pulumi.Output[str] | None
    """GKE: the cluster that holds the node pools."""
    kubeconfig: pulumi.Output[str] | None
    """GKE: a kubeconfig for the cluster (a secret)."""
    get_credentials_command: pulumi.Output[str] | None
    """GKE: the gcloud command that adds the cluster to your kubeconfig."""
    ray_cluster_name: pulumi.Output[str] | None
    """GKE: the name of the KubeRay RayCluster."""
    node_service_account: pulumi.Output[str] | None
    """GKE: the node pools' service account."""
    node_pools: pulumi.Output[list[str]] | None
    """GKE: the node pools' names, the head's first."""

    def __init__(self, name: str, args: TpuRayClusterArgs, opts: pulumi.ResourceOptions | None = None):
        # Every input is checked before anything is registered: a bad one registers nothing.
        cluster_spec = spec.load(spec_config(dict(args)))
        network = cast(ExistingNetwork | None, args.get(EXISTING_NETWORK))
        cluster_args = cluster.TpuRayClusterArgs(
            spec=cluster_spec,
            network=PythonExistingNetwork(network["network"], network.get("subnetwork")) if network else None,
        )
        super().__init__(COMPONENT_TYPE, name, None, opts)
        self.cluster = cluster.TpuRayCluster(name, cluster_args, pulumi.ResourceOptions(parent=self))
        for output in OUTPUTS:
            setattr(self, output, self.cluster.exports.get(output))
        self.register_outputs(self.cluster.exports)


# The component's outputs: the exports of every platform (`TpuRayCluster.exports`).
OUTPUTS = tuple(inspect.get_annotations(TpuRayCluster))


def camel(name: str) -> str:
    """A Python name as the schema (and every SDK but Python's) spells it."""
    return camel_case(name)


# ---- the record bucket ---------------------------------------------------------------------------


class RecordBucketArgs(TypedDict):
    """The record bucket's inputs: `rayslice.infra.record_bucket.RecordBucketArgs`, camelCase."""

    name: pulumi.Input[str]
    """The bucket's name, globally unique."""
    location: str
    """Where the bucket is: a region, such as us-east5 (the clusters' region)."""
    project: NotRequired[str]
    """The GCP project; absent: the provider's."""
    keepDays: NotRequired[int]  # camelCase: the schema's name
    """Days each record object is kept before a lifecycle rule deletes it."""
    lockedDays: NotRequired[int]
    """A retention policy: no object can be deleted before this many days (1 to keepDays)."""
    writers: NotRequired[list[pulumi.Input[str]]]
    """IAM members (user:EMAIL, group:EMAIL, serviceAccount:EMAIL) who run `rayslice run`: they
    may create objects (roles/storage.objectCreator), anywhere in the bucket."""
    readers: NotRequired[list[pulumi.Input[str]]]
    """IAM members who run `rayslice history`: they may list and read (roles/storage.objectViewer)."""
    labels: NotRequired[dict[str, str]]
    """GCP labels on the bucket."""


class RecordBucket(record_bucket.RecordBucket):
    """A bucket that keeps the records of many clusters (`rayslice history`), declared once and
    named in each cluster's recordBucket; `pulumi destroy` leaves it and its records."""

    url: pulumi.Output[str]
    """The bucket's gs:// URL, for `rayslice history --record` and RAYSLICE_RECORD."""

    def __init__(self, name: str, args: RecordBucketArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(
            name,
            record_bucket.RecordBucketArgs(
                name=args["name"],
                project=args.get("project"),
                location=args["location"],
                keep_days=_whole(args.get("keepDays", record_bucket.DEFAULT_KEEP_DAYS)),
                locked_days=_whole(args.get("lockedDays")),
                writers=tuple(args.get("writers", ())),
                readers=tuple(args.get("readers", ())),
                labels=dict(args.get("labels", {})),
            ),
            opts,
        )


# ---- the provider ------------------------------------------------------------------------------


class RaysliceProvider(ComponentProvider):
    """Pulumi's component provider for `TpuRayCluster` and `RecordBucket`, with the spec's
    descriptions in its schema and rayslice's own messages for bad inputs."""

    def __init__(self) -> None:
        super().__init__([TpuRayCluster, RecordBucket], PACKAGE, version=_version())
        self.schema = _json(with_spec(json.loads(self.schema or "{}")))

    def map_inputs(self, inputs: Any, component_def: ComponentDefinition) -> Any:
        """The SDK maps the other inputs; a cluster's config keys reach `spec.load` as they came,
        so a bad value (an unknown capacity, a fractional slice count) gets the spec's message."""
        if component_def.name != COMPONENT:
            return super().map_inputs(inputs, component_def)
        keys = {k: v for k, v in inputs.items() if k in spec.KEY_NAMES}
        rest = {k: v for k, v in inputs.items() if k not in spec.KEY_NAMES}
        return {**super().map_inputs(rest, component_def), **keys}

    def construct(
        self,
        name: str,
        resource_type: str,
        inputs: Any,
        options: pulumi.ResourceOptions | None = None,
    ) -> ConstructResult:
        """A rayslice error (bad input, found before anything is registered) goes back to the
        engine as its one-line message; the SDK would add the Python stack to it."""
        try:
            return super().construct(name, resource_type, inputs, options)
        except ComponentInitError as failure:
            if isinstance(failure.inner, RaysliceError):
                # The SDK sends the message only with a list of property errors; the message
                # already names the keys.
                raise InputPropertiesError(str(failure.inner), []) from None
            raise


def _describe(key: spec.Key) -> str:
    if key.bounds is None:
        return key.description
    low, high = key.bounds
    return f"{key.description} A whole number from {low:,} to {high:,}."


# Pulumi schemas give constant defaults to these types only.
_SCALARS = ("string", "integer", "boolean")


def with_spec(schema: dict[str, Any]) -> dict[str, Any]:
    """The analyzer's schema with what the spec says of each config key (its description, its
    integer range, its static default, its allowed values' description) and the record bucket's
    default keepDays. Descriptions from docstrings are joined into one paragraph each, and the
    SDK's null fields dropped."""
    schema = {**schema, "description": metadata.metadata(PACKAGE)["Summary"]}
    inputs = schema["resources"][COMPONENT_TYPE]["inputProperties"]
    for key in spec.KEYS:
        prop = inputs[key.name]
        prop["description"] = _describe(key)
        if key.has_default and not key.derived and key.type in _SCALARS:
            prop["default"] = key.default
        if key.name in CHOICES:
            enum_type = schema["types"][f"{PACKAGE}:index:{CHOICES[key.name].__name__}"]
            enum_type["description"] = f"The values {key.name} takes."
    bucket = schema["resources"][RECORD_BUCKET_TYPE]["inputProperties"]
    bucket["keepDays"]["default"] = record_bucket.DEFAULT_KEEP_DAYS
    return _tidy(schema)


def _tidy(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: " ".join(v.split()) if k == "description" and isinstance(v, str) else _tidy(v)
            for k, v in value.items()
            if v is not None
        }
    if isinstance(value, list):
        return [_tidy(v) for v in value]
    return value


def _json(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def schema_text() -> str:
    """The schema `GetSchema` answers with, as the checked-in `SCHEMA_FILE` holds it."""
    return RaysliceProvider().schema or ""


def serve(argv: list[str] | None = None) -> None:
    """Run the provider as Pulumi runs a plugin: argv holds the engine's address; the port it
    listens on is printed on stdout."""
    pulumi.provider.main(RaysliceProvider(), sys.argv[1:] if argv is None else argv)
