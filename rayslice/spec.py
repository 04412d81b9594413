"""ClusterSpec: the one reader of user input, and the one declaration of every config key.

Pulumi config (namespace ``rayslice``, falling back to ``gcp:project`` / ``gcp:zone``), a stack
file read by the CLI and ``--set KEY=VALUE`` overrides all arrive here as raw values, often as
strings ("true", "2", a JSON list). `ClusterSpec` is a pydantic dataclass: each field declares a
key once (type, default, description; the camelCase alias is generated), and Pulumi.yaml's config
section and docs/configuration.md are generated from it (`rayslice.config_reference`).

`load` checks every key, reports every problem at once (each saying what to do), fills the
defaults that depend on other keys (platform, zone, head, runtime version) and returns a frozen
`ClusterSpec`; everything downstream trusts it and never re-validates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import ipaddress
import json
import re
import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union
from urllib.parse import urlsplit

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from pydantic import BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel
from pydantic.dataclasses import dataclass
from pydantic.fields import FieldInfo

from rayslice import catalog
from rayslice.errors import SpecError
from rayslice.names import slice_name

NAMESPACE = "rayslice"
DEFAULT_RAY_VERSION = "2.60.0"


# ---- how raw values are coerced (Pulumi config and --set hand over strings) -------------------


def _string(value: Any) -> str:
    if isinstance(value, (dict, list, tuple, bool)):
        raise ValueError(f"must be a string, got {value!r}")
    return str(value)


def _integer(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"must be a whole number, got {value!r}")
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"must be a whole number, got {value!r}") from None


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise ValueError(f"must be true or false, got {value!r}")


def _strings(value: Any) -> tuple[str, ...]:
    """A list of strings, also from a JSON list or from lines of text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = [line for line in value.splitlines() if line.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"must be a list of strings, got {value!r}")
    return tuple(value)


def _mapping(value: Any) -> dict[str, str]:
    """A mapping of strings, also from a JSON object; YAML nulls become empty strings."""
    if isinstance(value, str):
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping of strings, got {value!r}")
    return {str(k): "" if v is None else str(v) for k, v in value.items()}


Str = Annotated[str, BeforeValidator(_string)]
Int = Annotated[int, BeforeValidator(_integer)]
Bool = Annotated[bool, BeforeValidator(_boolean)]
Strings = Annotated[tuple[str, ...], BeforeValidator(_strings)]
StrMap = Annotated[dict[str, str], BeforeValidator(_mapping)]
Platform = Annotated[Literal["compute", "tpu-vm", "gke"], BeforeValidator(_string)]
Capacity = Annotated[Literal["on-demand", "spot", "reserved"], BeforeValidator(_string)]
Head = Annotated[Literal["slice", "vm"], BeforeValidator(_string)]
Preset = Annotated[Literal["jax", "xla"], BeforeValidator(_string)]
RayAuth = Annotated[Literal["token", "none"], BeforeValidator(_string)]
KubeRay = Annotated[Literal["helm", "addon"], BeforeValidator(_string)]

# Keys whose default depends on other keys: `load` always fills them. Their field has no default
# (so the attribute is never None), and Pulumi.yaml cannot declare them (no static default).
DERIVED = "derived"


def _derived(description: str) -> Any:
    return Field(description=description, json_schema_extra={DERIVED: True})


# ---- the spec: one field per config key -------------------------------------------------------


@dataclass(
    frozen=True,
    kw_only=True,
    config=ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        arbitrary_types_allowed=True,
    ),
)
class ClusterSpec:
    """A validated cluster description; build it with `load`, never directly from user input.

    Every field except `tpu` is a config key; its alias is the camelCase name users write.
    """

    tpu: catalog.TpuType = Field(exclude=True, description="The catalog shape of acceleratorType.")
    name: Str = Field(
        "rayslice",
        description="Prefix of every resource name (GCP name rules: lowercase letter, then letters, "
        "digits, hyphens).",
    )
    project: Str | None = Field(None, description="GCP project; falls back to gcp:project.")
    platform: Platform = _derived(
        "Where the TPUs run: compute (Compute Engine VMs and managed instance groups), tpu-vm "
        "(Cloud TPU VM API) or gke. Default: compute where Compute Engine offers the generation "
        "(v5p, v6e, tpu7x), tpu-vm otherwise (gke for generations only GKE offers)."
    )
    accelerator_type: Str = Field(
        "v6e-16",
        description="TPU slice type, e.g. v6e-16, v5p-2x2x2 or tpu-v6e-slice-16 (see `rayslice catalog`).",
    )
    slices: Int = Field(
        1, description="Number of identical slices; more than one is multislice (v4 and newer)."
    )
    zone: Str = _derived(
        "GCP zone that offers the generation; falls back to gcp:zone (required for a cloud "
        "deployment; the local simulator uses the generation's first zone)."
    )
    runtime_version: Str | None = Field(
        None,
        description="TPU VM runtime (software) version, platform tpu-vm only; default: the "
        "generation's from the catalog.",
    )
    capacity: Capacity = Field("on-demand", description="on-demand, spot or reserved.")
    reservation: Str | None = Field(
        None,
        description="Reservation name for capacity=reserved on GKE (TPU VMs use any matching reservation).",
    )
    head: Head = _derived(
        "Where the Ray head runs: slice (worker 0 of slice 0) or vm (a CPU VM). Default: vm for "
        "several slices or capacity=spot (a preempted slice cannot heal itself), slice otherwise."
    )
    head_machine_type: Str = Field(
        catalog.DEFAULT_HEAD_MACHINE_TYPE,
        description="Machine type of the CPU head VM (head=vm) or the GKE head node pool; its "
        "family must be offered in the zone (the catalog's machine-family-by-zone table).",
    )
    network: Str | None = Field(
        None, description="Existing VPC network name; absent: rayslice creates one with Cloud NAT."
    )
    subnetwork: Str | None = Field(
        None,
        description="Existing subnetwork of `network` (set both); absent: created with the network.",
    )
    external_ips: Bool = Field(
        False,
        description="Give TPU hosts external IPs (off: hosts reach package indexes through Cloud NAT).",
    )
    dashboard_source_ranges: Strings = Field(
        (),
        description="CIDR ranges, besides the cluster itself, allowed to reach the Ray dashboard / "
        "Jobs API. Public ranges need rayAuth=token; ranges covering the whole internet are refused.",
    )
    preset: Preset = Field(
        "jax",
        description="Requirement set from the guide: jax (host-centric) or xla (PyTorch/XLA, "
        "device-centric).",
    )
    requirements: Strings = Field((), description="Extra PEP 508 requirement lines installed on every host.")
    package_index: Str | None = Field(
        None,
        description="Python package index URL used instead of PyPI (hosts without internet); "
        "https:// or file://, without credentials in it.",
    )
    allow_insecure_package_index: Bool = Field(
        False,
        description="Allow a plain http:// packageIndex (anyone on the network path can then "
        "tamper with packages installed as root).",
    )
    package_index_credentials_secret: Str | None = Field(
        None,
        description="Secret Manager secret (name) holding the packageIndex credentials as "
        "user:password; hosts read it into uv's index credential variables.",
    )
    ray_version: Str = Field(DEFAULT_RAY_VERSION, description="Ray version installed on every host (X.Y.Z).")
    labels: StrMap = Field(
        default_factory=dict, description="GCP labels added to every resource (GCP label rules apply)."
    )
    ray_auth: RayAuth = Field(
        "token", description="Ray token authentication: token (token kept in Secret Manager) or none."
    )
    recovery: Bool = Field(
        True,
        description="Run the recovery controller on the head VM: it recreates preempted or failed "
        "slices whole. With capacity=spot it needs head=vm (the default for spot).",
    )
    kuberay: KubeRay = Field(
        "helm",
        description="GKE only: how the KubeRay operator is installed: helm (pinned release) or "
        "addon (GKE Ray add-on).",
    )
    gke_cluster: Str | None = Field(
        None,
        description="GKE only: name of an existing cluster to add node pools to; absent: one is created.",
    )
    gke_authorized_networks: Strings = Field(
        (),
        description="GKE only: CIDR ranges allowed to reach the cluster's control-plane endpoint; "
        "empty: private endpoint only.",
    )

    @property
    def multislice(self) -> bool:
        return self.slices > 1

    @property
    def total_hosts(self) -> int:
        return self.tpu.hosts * self.slices

    @property
    def runs_recovery(self) -> bool:
        """Whether the head VM runs the recovery controller (GKE recreates its node pools itself)."""
        return self.recovery and self.head == "vm" and self.platform != "gke"

    def slice_name(self, index: int) -> str:
        return slice_name(self.name, index)

    def as_config(self) -> dict[str, Any]:
        """The spec as config keys (camelCase), the form stack files and `--set` use."""
        values: dict[str, Any] = {}
        for key in KEYS:
            value = getattr(self, key.field)
            values[key.name] = list(value) if isinstance(value, tuple) else value
        values["labels"] = dict(self.labels)
        return values


# ---- the keys, read from the model (the generator and the readers use these) -------------------

PULUMI_TYPES: dict[type, str] = {
    str: "string",
    int: "integer",
    bool: "boolean",
    tuple: "array",
    dict: "object",
}


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key as declared by a `ClusterSpec` field."""

    name: str  # camelCase, as users write it
    field: str  # the ClusterSpec attribute
    type: str  # Pulumi config type: string | integer | boolean | array | object
    description: str
    default: Any  # None: no static default (optional, or derived when `derived`)
    derived: bool
    choices: tuple[str, ...]  # allowed values of a Literal key, else ()
    info: FieldInfo

    @property
    def has_default(self) -> bool:
        return self.default is not None


def _base_type(annotation: Any) -> tuple[Any, tuple[str, ...]]:
    """(python type, Literal choices) of an annotation, through Annotated and Optional."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        elif origin is Literal:
            return str, tuple(typing.get_args(annotation))
        elif origin is not None:
            return origin, ()
        else:
            return annotation, ()


def _keys() -> tuple[Key, ...]:
    keys = []
    fields: dict[str, FieldInfo] = ClusterSpec.__pydantic_fields__  # type: ignore[attr-defined]  # set by @dataclass
    for field, info in fields.items():
        if info.exclude:
            continue
        base, choices = _base_type(info.annotation)
        default = (
            None if info.is_required() else info.get_default(call_default_factory=True, validated_data={})
        )
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        keys.append(
            Key(
                name=info.alias or field,
                field=field,
                type=PULUMI_TYPES[base],
                description=info.description or "",
                default=default,
                derived=bool(extra.get(DERIVED)),
                choices=choices,
                info=info,
            )
        )
    return tuple(keys)


KEYS: tuple[Key, ...] = _keys()
KEY_NAMES = {k.name for k in KEYS}
_BY_NAME = {k.name: k for k in KEYS}


@cache
def _adapter(name: str) -> TypeAdapter[Any]:
    info = _BY_NAME[name].info
    annotation: Any = info.annotation
    return TypeAdapter(Annotated[annotation, *info.metadata] if info.metadata else annotation)


def _coerce(key: Key, value: Any) -> Any:
    """A raw value as the key's type, or ValueError with a message that names the key."""
    try:
        return _adapter(key.name).validate_python(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        if error["type"] == "literal_error":
            raise ValueError(
                f"{key.name}={value!r} is not valid; use one of: {', '.join(key.choices)}"
            ) from None
        message = str(error["msg"]).removeprefix("Value error, ")
        raise ValueError(f"{key.name} {message}") from None


# GCP resource names (RFC 1035) and label keys/values.
_GCP_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_PROJECT = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_MACHINE_TYPE = re.compile(r"^[a-z][a-z0-9-]{1,62}$")
_RUNTIME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")
_RAY_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
_URL = re.compile(r"^(https?|file)://[^\s'\"`$;\\]+$")
# Secret Manager secret IDs: letters, digits, '-' and '_', at most 255 characters.
_SECRET_ID = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
# Longest name rayslice derives from `name` is "<name>-slice-NN-fw-internal" (63 max).
_NAME_MAX = 40
# GKE refuses node pool names longer than this; the longest pool is the last slice's.
GKE_NODE_POOL_NAME_MAX = 40


def load(raw: Mapping[str, Any], *, require_zone: bool = True) -> ClusterSpec:
    """Validate raw config values (strings or YAML/JSON values) and return the spec.

    `require_zone` is off only for the local simulator, which needs no zone: it then uses the
    generation's first documented zone for the metadata it serves.
    """
    problems: list[str] = []
    values: dict[str, Any] = {k.name: k.default for k in KEYS}
    for key in raw:
        if key not in KEY_NAMES:
            problems.append(_unknown_key(key))
    for k in KEYS:
        if raw.get(k.name) is not None:
            try:
                values[k.name] = _coerce(k, raw[k.name])
            except ValueError as exc:
                problems.append(str(exc))
                values[k.name] = None

    tpu = _resolve_tpu(values, raw, problems)
    _check_names(values, problems)
    _check_slices(values, tpu, problems)
    _check_head(values, raw, problems)
    if values["zone"] is not None or raw.get("zone") is None:  # else: not a string, reported
        _check_zone(values, tpu, problems, require_zone)
    _check_runtime(values, tpu, problems)
    _check_requirements(values, problems)
    _check_package_index(values, problems)
    _check_network(values, problems)
    _check_dashboard(values, problems)
    _check_gke(values, problems)
    if problems:
        raise SpecError(problems)
    assert tpu is not None
    values["acceleratorType"] = tpu.accelerator_type
    values["zone"] = values["zone"] or tpu.zones[0]
    if values["platform"] == "tpu-vm":
        values["runtimeVersion"] = values["runtimeVersion"] or tpu.runtime_version
    return ClusterSpec(tpu=tpu, **{_BY_NAME[name].field: value for name, value in values.items()})


def _unknown_key(key: str) -> str:
    near = difflib.get_close_matches(key, sorted(KEY_NAMES), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else f"; known keys: {', '.join(sorted(KEY_NAMES))}"
    return f"unknown config key {key!r}{hint}"


def _resolve_tpu(
    values: dict[str, Any], raw: Mapping[str, Any], problems: list[str]
) -> catalog.TpuType | None:
    """The catalog shape, on the platform given or the generation's default platform."""
    name = values["acceleratorType"]
    if name is None:
        return None
    gen = catalog.generation_of(name)
    if values["platform"] is None and raw.get("platform") is None:
        values["platform"] = gen.default_platform if gen is not None else "tpu-vm"
    if values["platform"] is None:
        return None  # an invalid platform, reported above
    try:
        return catalog.lookup(name, values["platform"])
    except catalog.CatalogError as exc:
        problems.append(f"acceleratorType: {exc}")
        return None


def _check_names(values: dict[str, Any], problems: list[str]) -> None:
    name = values["name"]
    if name is not None and (not _GCP_NAME.match(name) or len(name) > _NAME_MAX):
        problems.append(
            f"name={name!r} breaks GCP naming rules: use 1-{_NAME_MAX} characters, a lowercase "
            "letter first, then lowercase letters, digits or hyphens, not ending in a hyphen"
        )
    for key in ("network", "subnetwork", "reservation", "gkeCluster"):
        value = values[key]
        if value is not None and not _GCP_NAME.match(value):
            problems.append(
                f"{key}={value!r} is not a valid GCP resource name: use up to 63 lowercase "
                "letters, digits or hyphens, starting with a letter"
            )
    if values["project"] is not None and not _PROJECT.match(values["project"]):
        problems.append(
            f"project={values['project']!r} is not a valid GCP project ID: 6-30 lowercase "
            "letters, digits or hyphens, starting with a letter"
        )
    if values["headMachineType"] is not None and not _MACHINE_TYPE.match(values["headMachineType"]):
        problems.append(
            f"headMachineType={values['headMachineType']!r} is not a machine type name "
            f"(e.g. {catalog.DEFAULT_HEAD_MACHINE_TYPE})"
        )
        values["headMachineType"] = None
    labels = values["labels"] or {}
    if len(labels) > 60:
        problems.append(
            f"labels: {len(labels)} labels given; GCP allows 64 per resource and rayslice adds 4: "
            "use at most 60"
        )
    for key, value in labels.items():
        if not _LABEL_KEY.match(key):
            problems.append(
                f"labels: key {key!r} breaks GCP label rules: start with a lowercase letter, "
                "then up to 62 lowercase letters, digits, '_' or '-'"
            )
        if not _LABEL_VALUE.match(value):
            problems.append(
                f"labels: value {value!r} of {key!r} breaks GCP label rules: up to 63 lowercase "
                "letters, digits, '_' or '-'"
            )


def _check_zone(
    values: dict[str, Any], tpu: catalog.TpuType | None, problems: list[str], required: bool
) -> None:
    zone = values["zone"]
    if zone is None:
        if required:
            zones = f" ({tpu.generation} is offered in {', '.join(tpu.zones)})" if tpu else ""
            problems.append(f"zone is not set: set rayslice:zone or gcp:zone{zones}")
            return
        zone = tpu.zones[0] if tpu is not None else None
    elif not _ZONE.match(zone):
        problems.append(f"zone={zone!r} is not a GCP zone name (e.g. us-central1-b)")
        return
    elif tpu is not None and zone not in tpu.zones:
        problems.append(
            f"zone {zone} does not offer TPU {tpu.generation}; use one of: {', '.join(tpu.zones)}"
        )
        return
    machine_type = values["headMachineType"]
    uses_head_machine = values["head"] == "vm" or values["slices"] != 1 or values["platform"] == "gke"
    if zone is not None and machine_type is not None and uses_head_machine:
        problem = catalog.head_machine_problem(machine_type, zone)
        if problem:
            problems.append(f"headMachineType={machine_type!r}: {problem}")


def _check_runtime(values: dict[str, Any], tpu: catalog.TpuType | None, problems: list[str]) -> None:
    runtime = values["runtimeVersion"]
    if runtime is None or tpu is None:
        return
    if values["platform"] != "tpu-vm":
        source = (
            "GKE picks the TPU runtime"
            if values["platform"] == "gke"
            else "the catalog names the TPU OS image"
        )
        problems.append(
            "runtimeVersion applies to the TPU VM API only; remove it for "
            f"platform={values['platform']} ({source})"
        )
        return
    if not _RUNTIME.match(runtime):
        problems.append(
            f"runtimeVersion={runtime!r} is not a runtime version name (e.g. {tpu.runtime_version})"
        )
        return
    built_for = catalog.runtime_generations(runtime)
    if tpu.generation not in built_for:
        problems.append(
            f"runtimeVersion {runtime} is built for {', '.join(built_for)}, not {tpu.generation}; "
            f"use {tpu.runtime_version} (the default) or another {tpu.generation} runtime"
        )


def _check_slices(values: dict[str, Any], tpu: catalog.TpuType | None, problems: list[str]) -> None:
    slices = values["slices"]
    if slices is None:
        return
    if not 1 <= slices <= 64:
        problems.append(f"slices={slices} is out of range; use 1 to 64")
    elif slices > 1 and tpu is not None and not tpu.multislice:
        capable = ", ".join(g.name for g in catalog.GENERATIONS if g.multislice)
        problems.append(
            f"slices={slices}: {tpu.generation} does not support multislice; use slices=1 or one "
            f"of: {capable}"
        )


def _check_head(values: dict[str, Any], raw: Mapping[str, Any], problems: list[str]) -> None:
    """Fill `head` (vm for multislice and spot) and refuse the heads that cannot work."""
    slices, capacity = values["slices"], values["capacity"]
    if values["head"] is None:
        if raw.get("head") is not None:
            return  # invalid, reported above
        values["head"] = "vm" if (slices or 1) > 1 or capacity == "spot" else "slice"
        return
    if values["head"] != "slice":
        return
    if slices is not None and slices > 1:
        problems.append(
            "head=slice with several slices puts the head on one slice's host; use head=vm for multislice"
        )
    if capacity == "spot" and values["recovery"]:
        problems.append(
            "head=slice with capacity=spot puts the Ray head and the recovery controller on a Spot "
            "host, so a preemption takes down what should recreate it: use head=vm (the default for "
            "spot), or set recovery=false to keep head=slice without automatic recovery"
        )


def _check_requirements(values: dict[str, Any], problems: list[str]) -> None:
    for line in values["requirements"] or []:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            problems.append(
                f"requirements: {line!r} is not a valid PEP 508 requirement ({exc}); e.g. 'optax>=0.2'"
            )
            continue
        if req.url:
            problems.append(
                f"requirements: {line!r} installs from a URL; list a package name and use "
                "packageIndex for a private index"
            )
    ray_version = values["rayVersion"]
    if ray_version is not None and not _RAY_VERSION.match(ray_version):
        problems.append(f"rayVersion={ray_version!r} is malformed; use a release like {DEFAULT_RAY_VERSION}")


def _check_package_index(values: dict[str, Any], problems: list[str]) -> None:
    """Credentials never travel in the URL (they would land in metadata, `ps` and previews), and
    plain http (packages installed as root, open to tampering) needs an explicit opt-in."""
    index, secret = values["packageIndex"], values["packageIndexCredentialsSecret"]
    if secret is not None:
        if not _SECRET_ID.match(secret):
            problems.append(
                f"packageIndexCredentialsSecret={secret!r} is not a Secret Manager secret name: use "
                "up to 255 letters, digits, '-' or '_' (the secret's ID, not its full path)"
            )
        if index is None:
            problems.append(
                "packageIndexCredentialsSecret is set without packageIndex: set packageIndex to the "
                "index these credentials are for, or remove packageIndexCredentialsSecret"
            )
    if index is None:
        return
    if not _URL.match(index):
        problems.append(f"packageIndex={index!r} is not an https:// or file:// URL without quotes or spaces")
        return
    parts = urlsplit(index)
    if "@" in parts.netloc:
        problems.append(
            f"packageIndex {parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path} carries "
            "credentials in its URL, which would be readable in instance metadata, process lists "
            "and previews: remove them from the URL, store 'user:password' in a Secret Manager "
            "secret and set packageIndexCredentialsSecret=<secret name>"
        )
    if parts.scheme == "http" and not values["allowInsecurePackageIndex"]:
        problems.append(
            f"packageIndex={index!r} uses plain http, so anyone on the network path can change the "
            "packages hosts install as root: use https://, or set allowInsecurePackageIndex=true "
            "if the path is trusted"
        )


def _networks(
    key: str, ranges: Any, problems: list[str]
) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    nets = []
    for cidr in ranges or []:
        try:
            nets.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError:
            problems.append(f"{key}: {cidr!r} is not a CIDR range (e.g. 10.0.0.0/8)")
    return nets


def _covers_everything(nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    """Whether the ranges together cover all of IPv4 or all of IPv6 (0.0.0.0/1 + 128.0.0.0/1)."""
    v4 = [n for n in nets if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in nets if isinstance(n, ipaddress.IPv6Network)]
    return ipaddress.IPv4Network("0.0.0.0/0") in ipaddress.collapse_addresses(v4) or (
        ipaddress.IPv6Network("::/0") in ipaddress.collapse_addresses(v6)
    )


def _check_dashboard(values: dict[str, Any], problems: list[str]) -> None:
    """The dashboard port is the Ray Jobs API: whoever reaches it runs code on every host."""
    key = "dashboardSourceRanges"
    nets = _networks(key, values[key], problems)
    if _covers_everything(nets):
        problems.append(
            f"{key}: {', '.join(map(str, nets))} together cover the whole address space, which opens "
            "the Ray dashboard and Jobs API to the internet; list only your own ranges"
        )
        return
    public = [str(n) for n in nets if not n.is_private]
    if public and values["rayAuth"] == "none":
        problems.append(
            f"{key}: {', '.join(public)} {'is a public range' if len(public) == 1 else 'are public ranges'} "
            "and rayAuth=none: anyone there could submit jobs through the Ray Jobs API and run code "
            "on every host (remote code execution); set rayAuth=token, or list only private ranges"
        )


def _check_network(values: dict[str, Any], problems: list[str]) -> None:
    # A subnetwork name alone cannot be used: rayslice would create a new VPC and look for the
    # subnetwork in it.
    if values["subnetwork"] is not None and values["network"] is None:
        problems.append(
            f"subnetwork={values['subnetwork']!r} is set without network: set network to the VPC "
            "that holds this subnetwork too (or remove subnetwork to let rayslice create both)"
        )


def _check_gke(values: dict[str, Any], problems: list[str]) -> None:
    """GKE's own limits on what the user chose, so `pulumi up` never fails half-way on them."""
    if values["platform"] != "gke":
        for key in ("gkeCluster", "gkeAuthorizedNetworks"):
            if values[key]:
                problems.append(f"{key} applies to platform=gke only; remove it or set platform=gke")
        return
    key = "gkeAuthorizedNetworks"
    if _covers_everything(_networks(key, values[key], problems)):
        problems.append(
            f"{key} covers the whole address space, which opens the GKE control-plane endpoint to "
            "the internet; list only your own ranges (empty: private endpoint only)"
        )
    if values["capacity"] == "reserved" and not values["reservation"]:
        problems.append("capacity=reserved on GKE needs reservation=<name of your reservation>")
    if values["gkeCluster"] is not None:
        for net_key in ("network", "subnetwork"):
            if values[net_key] is not None:
                problems.append(
                    f"{net_key} is not used with gkeCluster (the existing cluster brings its own "
                    f"network); remove {net_key}, or remove gkeCluster to create a cluster in it"
                )
    name, slices = values["name"], values["slices"]
    if name is None or slices is None or not 1 <= slices <= 64:
        return  # reported above
    longest = slice_name(name, slices - 1)  # "<name>-head" is shorter
    if len(longest) > GKE_NODE_POOL_NAME_MAX:
        room = GKE_NODE_POOL_NAME_MAX - (len(longest) - len(name))
        problems.append(
            f"name={name!r} is too long for platform=gke: node pool {longest!r} would have "
            f"{len(longest)} characters and GKE allows {GKE_NODE_POOL_NAME_MAX}; shorten name "
            f"to at most {room} characters"
        )


# ---- where raw values come from ------------------------------------------------------------


def read_stack_file(path: str | Path) -> dict[str, Any]:
    """Raw values from a Pulumi stack file (``config:`` with ``rayslice:`` and ``gcp:`` keys)."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise SpecError([f"cannot read stack file {path}: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"stack file {path} is not valid YAML: {exc}"]) from None
    config = document.get("config") or {}
    if not isinstance(config, dict):
        raise SpecError([f"stack file {path}: 'config' must be a mapping"])
    return from_namespaced(config.get, config.keys())


def from_namespaced(get: Callable[[str], Any], keys: Any = None) -> dict[str, Any]:
    """Raw values from ``rayslice:KEY`` config entries, falling back to ``gcp:project/zone``."""
    raw: dict[str, Any] = {}
    names = KEY_NAMES | {k.split(":", 1)[1] for k in (keys or ()) if str(k).startswith(NAMESPACE + ":")}
    for name in names:
        value = get(f"{NAMESPACE}:{name}")
        if value is not None:
            raw[name] = value
    for name in ("project", "zone"):
        if name not in raw and get(f"gcp:{name}") is not None:
            raw[name] = get(f"gcp:{name}")
    return raw


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs from ``--set``; values stay strings and are typed by `load`."""
    raw: dict[str, Any] = {}
    problems = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            problems.append(f"--set {pair!r} must look like KEY=VALUE (e.g. --set slices=2)")
            continue
        raw[key.removeprefix(NAMESPACE + ":")] = value
    if problems:
        raise SpecError(problems)
    return raw


def load_cli(
    stack_file: str | None,
    overrides: list[str],
    *,
    require_zone: bool = True,
    defaults: Mapping[str, Any] | None = None,
) -> ClusterSpec:
    """The spec as the CLI sees it: defaults, then the stack file, then ``--set`` overrides."""
    raw: dict[str, Any] = dict(defaults or {})
    if stack_file:
        raw.update(read_stack_file(stack_file))
    raw.update(parse_overrides(overrides))
    return load(raw, require_zone=require_zone)
