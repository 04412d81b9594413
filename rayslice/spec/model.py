"""The spec model: `ClusterSpec`, one field per config key, and how raw values become typed.

A pydantic dataclass declares each key once: type, default, description; the camelCase alias
users write is generated from the field name. `KEYS` reads the declarations back for the readers
(`rayslice.spec.draft`, `rayslice.spec.sources`) and for the generator of Pulumi.yaml's config
section and docs/configuration.md (`rayslice.config_reference`).

Pulumi config and ``--set`` hand over strings ("true", "2", a JSON list); the annotated types
below (`Str`, `Int`, ...) coerce them, so a key's type says how its raw value is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import types
import typing
from functools import cache
from typing import Annotated, Any, Literal, Union, cast

import annotated_types
from pydantic import BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel
from pydantic.dataclasses import dataclass
from pydantic.fields import FieldInfo

from rayslice import capacity_table, catalog, printable
from rayslice.errors import shown
from rayslice.names import slice_name

DEFAULT_RAY_VERSION = "2.60.0"
SECONDS_PER_HOUR = 3600
# The most slices one cluster may have (`slices`).
MAX_SLICES = 64
# The highest `maxUsdPerHour` ceiling.
MAX_USD_PER_HOUR = 10_000_000
# `recordBucket`'s value for a cluster without a record.
RECORD_OFF = "none"


# ---- how raw values are coerced (Pulumi config and --set hand over strings) -------------------

# What a raw value may be made of: YAML and JSON scalars. A nested list or mapping where a key
# wants one value is refused before it is turned into text (a YAML alias bomb is small as a graph
# and enormous as text).
_SCALARS = (str, int, float)


_INTEGER = re.compile(r"-?[0-9]+")
# The most digits an integer may be written with before it is read as `_HUGE`: every integer
# key's upper bound (`Field(le=...)`) has fewer, and int() of a longer text costs time that grows
# with its length (Python refuses more than 4,300 digits outright).
_MAX_DIGITS = 18
_HUGE = 10**_MAX_DIGITS
# The longest text a key takes. The longest real values (a package index URL, a requirement line
# with markers) are a few hundred characters; a longer one is a mistake, such as a pasted file.
MAX_TEXT = 4096


def _text(value: Any) -> str:
    """A scalar as text, refused when it is too long or holds a character that is not printable
    text."""
    if isinstance(value, bool) or not isinstance(value, _SCALARS):
        raise ValueError(f"must be a string or a number, got {shown(value)}")
    text = str(value)
    if len(text) > MAX_TEXT:
        raise ValueError(f"is {len(text):,} characters long; a value has at most {MAX_TEXT:,}")
    bad = next((c for c in text if printable.unprintable(c)), None)
    if bad is not None:
        raise ValueError(
            f"must be printable text; {shown(text)} holds the control or format character "
            f"U+{ord(bad):04X}: remove newlines, tabs, escape sequences and invisible characters"
        )
    return text


def _string(value: Any) -> str:
    if isinstance(value, (dict, list, tuple, bool)):
        raise ValueError(f"must be a string, got {shown(value)}")
    return _text(value)


def _integer(value: Any) -> int:
    """A whole number, read from its decimal text as Pulumi's `Config.get_int` reads it
    (``"010"`` is 10). A text of more digits than any bound is read as ±`_HUGE`, which the key's
    bound then refuses, naming the range."""
    if isinstance(value, bool):
        raise ValueError(f"must be a whole number, got {value!r}")
    if isinstance(value, int):
        return value
    text = _text(value)
    # ASCII digits only: int() also reads "٣", "1_0" and surrounding whitespace.
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"must be a whole number written in ASCII digits, got {shown(value)}")
    if len(text.lstrip("-").lstrip("0")) > _MAX_DIGITS:
        return -_HUGE if text.startswith("-") else _HUGE
    return int(text)


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = _text(value)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise ValueError(f"must be true or false, got {shown(value)}")


def _strings(value: Any) -> tuple[str, ...]:
    """A list of strings, also from a JSON list or from lines of text (the only place a newline
    is allowed: between items)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = [line for line in value.splitlines() if line.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"must be a list of strings, got {shown(value)}")
    return tuple(_text(v) for v in value)


def _mapping(value: Any) -> dict[str, str]:
    """A mapping of strings, also from a JSON object; YAML nulls become empty strings."""
    if isinstance(value, str):
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping of strings, got {shown(value)}")
    return {_text(k): "" if v is None else _text(v) for k, v in value.items()}


Str = Annotated[str, BeforeValidator(_string)]
Int = Annotated[int, BeforeValidator(_integer)]
Bool = Annotated[bool, BeforeValidator(_boolean)]
Strings = Annotated[tuple[str, ...], BeforeValidator(_strings)]
StrMap = Annotated[dict[str, str], BeforeValidator(_mapping)]
Platform = Annotated[Literal["compute", "tpu-vm", "gke"], BeforeValidator(_string)]
Capacity = Annotated[Literal["on-demand", "spot", "reserved", "flex-start"], BeforeValidator(_string)]
# `capacity_table.CAPACITY_MODES`: a reservation's operational mode.
CapacityMode = Annotated[Literal["managed", "all-capacity"], BeforeValidator(_string)]
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
    # Every integer key has bounds (ge, le), checked where its value is read (`coerce`); the reason
    # for each upper bound is beside it.
    # 64 slices: rayslice's limit from its first version; no source we read states a multislice
    # maximum, and no larger cluster has been tried.
    slices: Int = Field(
        1,
        ge=1,
        le=MAX_SLICES,
        description="Number of identical slices; more than one is multislice (v4 and newer). With "
        "minSlices, the most slices the cluster may have.",
    )
    # Below `slices`, checked with it (`rules`).
    min_slices: Int | None = Field(
        None,
        ge=0,
        le=MAX_SLICES - 1,
        description="Makes the cluster elastic (platform compute, head=vm): the recovery controller "
        "keeps between minSlices and `slices` slices, adding whole slices when Ray has work no slice "
        "can take and removing a slice idle for idleTimeoutSeconds. 0 or more, below `slices`. "
        "See docs/elastic.md.",
    )
    # A week: a slice kept idle longer is a fixed slice (raise minSlices instead).
    idle_timeout_seconds: Int = Field(
        600,
        ge=1,
        le=7 * 24 * SECONDS_PER_HOUR,
        description="minSlices only: seconds a slice above minSlices may sit with nothing scheduled "
        "on any of its hosts before the controller removes it.",
    )
    # $10M/h: above the list price of 64 of the dearest slices ($2.4M/h), so a higher ceiling
    # could never bind (a test keeps it above that price).
    max_usd_per_hour: Int | None = Field(
        None,
        ge=1,
        le=MAX_USD_PER_HOUR,
        description="minSlices only: ceiling on the TPU slices' list price per hour in USD "
        "(`rayslice catalog` prices): the controller adds no slice that would cross it.",
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
    capacity: Capacity = Field(
        "on-demand",
        description="How the TPUs are obtained: on-demand, spot, reserved (a reservation) or "
        "flex-start (waits for capacity, runs at most maxRunHours; compute, gke, and tpu-vm "
        "with queued=true). On-demand, spot and reserved fail fast where the zone has no capacity "
        "unless queued=true (tpu-vm). See docs/capacity.md.",
    )
    reservation: Str | None = Field(
        None,
        description="Reservation name: required for capacity=reserved on compute (a "
        "RESERVATION_BOUND MIG consumes one named reservation) and gke; on tpu-vm only with "
        "queued=true (a direct create uses any matching reservation).",
    )
    calendar_mode: Bool = Field(
        False,
        description="capacity=reserved with a named reservation only: the reservation is a future "
        "reservation created in calendar mode (1 to 90 days); its slices are reservation-bound and "
        "end with it. compute, and tpu-vm with queued=true.",
    )
    capacity_mode: CapacityMode = Field(
        "managed",
        description="capacity=reserved with a named reservation only: the reservation's mode. "
        "managed (default): Google recovers a failed slice; all-capacity (an All Capacity mode "
        "reservation): Google repairs hosts in place and never moves a slice, so the recovery "
        "controller recreates a slice still broken after 15 min on the reservation's spare hosts. "
        "compute only.",
    )
    # Google's limit on a flex-start run (`catalog.MAX_RUN_HOURS`, 7 days).
    max_run_hours: Int | None = Field(
        None,
        ge=1,
        le=catalog.MAX_RUN_HOURS,
        description="capacity=flex-start only: hours the slice may run before Google deletes it, "
        "1 to 168 (7 days); default 168.",
    )
    queued: Bool = Field(
        False,
        description="tpu-vm only: create each slice through a queued resource, a request that "
        "waits for capacity (until queueDeadlineHours) instead of failing; needed for flex-start "
        "on tpu-vm.",
    )
    # A year: a request still waiting after that is better made again; far inside the range of
    # the API's google.protobuf.Duration (about 10,000 years).
    queue_deadline_hours: Int | None = Field(
        None,
        ge=1,
        le=365 * 24,
        description="queued=true only: hours after which a request still waiting fails "
        "(the queued resource's validUntilDuration); absent: it waits until cancelled.",
    )
    head: Head = _derived(
        "Where the Ray head runs: slice (the first host of the slice) or vm (a CPU VM). Default: vm for "
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
        "Jobs API. Public ranges need rayAuth=token and may cover together at most a /8 of IPv4 "
        "(a /32 of IPv6) unless allowWideDashboardRanges is set; ranges covering the whole "
        "internet are refused.",
    )
    allow_wide_dashboard_ranges: Bool = Field(
        False,
        description="Accept public dashboardSourceRanges that together cover more than a /8 of "
        "IPv4 or a /32 of IPv6. Everyone there can reach the Jobs API and try the token, which "
        "crosses the network in clear unless you reach the dashboard through a tunnel.",
    )
    preset: Preset = Field(
        "jax",
        description="Requirement set from the guide: jax (host-centric) or xla (PyTorch/XLA, "
        "device-centric), installed with Ray from the preset's lock (exact versions and hashes) "
        "for the default rayVersion, or from the stack lock resolved on the deployer's machine "
        "for another rayVersion.",
    )
    requirements: Strings = Field(
        (),
        description="Extra PEP 508 requirement lines installed on every host: resolved once on the "
        "deployer's machine (pulumi up, rayslice preview), under the preset lock's versions, into "
        "rayslice-locks/<stack>.lock beside the Pulumi project (commit it), which hosts install as it is "
        "(with another rayVersion, which has no preset lock, resolved there together with the preset "
        "and that Ray release).",
    )
    package_index: Str | None = Field(
        None,
        description="Python package index URL used instead of PyPI (hosts without internet); "
        "https:// or file://, without credentials, query or fragment in it. The URL is readable "
        "in instance metadata, the boot log and uv's command line: an index that takes a token "
        "in its path (some hosted registries do) exposes it there too, so give such an index "
        "its credentials through packageIndexCredentialsSecret instead.",
    )
    allow_insecure_package_index: Bool = Field(
        False,
        description="Allow a plain http:// packageIndex for the hosts (anyone on the network "
        "path can then tamper with packages installed as root). The recovery controller's VM "
        "never installs over plain http: with such an index it installs its lock from PyPI.",
    )
    package_index_credentials_secret: Str | None = Field(
        None,
        description="Secret Manager secret (name) holding the packageIndex credentials as "
        "user:password; hosts read it into uv's index credential variables.",
    )
    allow_foreign_package_index_secret: Bool = Field(
        False,
        description="Grant the hosts' account (every job on the cluster) read access to the secret "
        "packageIndexCredentialsSecret names, which this stack does not declare. Required with "
        "that key, so that naming a secret is never a silent grant: name one that holds only the "
        "index's credentials.",
    )
    package_cache: Bool = Field(
        True,
        description="Run a caching proxy of the package index (proxpi) on the head, so a cluster "
        "downloads each package once instead of once per host; hosts fall back to the index when it "
        "does not answer. VM platforms only; not used with a wheelhouse or a prepared venv.",
    )
    ray_version: Str = Field(DEFAULT_RAY_VERSION, description="Ray version installed on every host (X.Y.Z).")
    host_image: Str | None = Field(
        None,
        description="compute only: a Compute Engine image in the stack's project (a name, or "
        "projects/PROJECT/global/images/NAME) that the slices boot from instead of the TPU OS "
        "image; `rayslice image` builds one that already holds the hosts' venv, so the first "
        "boot skips the install. An image whose venv does not match the requirements is "
        "installed over as usual.",
    )
    record_bucket: Str | None = Field(
        None,
        description="VM platforms: the GCS bucket (its name) where every host, the head and the "
        "controller write the cluster's record as they run (boot logs, Ray job logs and events, "
        "the controller's decisions; `rayslice history` reads it). Absent: the program declares one "
        "that `pulumi destroy` keeps (its name is the stack output record); set it to that name to "
        f"go on writing there after a destroy; `{RECORD_OFF}`: no record.",
    )
    allow_foreign_record_bucket: Bool = Field(
        False,
        description="Grant the cluster's accounts (every job on it) object creation in the bucket "
        "recordBucket names, which this stack does not declare, under this cluster's prefix only. "
        "Required with a recordBucket name, so that naming a bucket is never a silent grant.",
    )
    labels: StrMap = Field(
        default_factory=dict, description="GCP labels added to every resource (GCP label rules apply)."
    )
    ray_auth: RayAuth = Field(
        "token", description="Ray token authentication: token (token kept in Secret Manager) or none."
    )
    recovery: Bool = Field(
        True,
        description="Run the recovery controller on its own small VM (with head=vm): it recreates "
        "preempted or failed slices whole. With capacity=spot it needs head=vm (the default for spot).",
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
        "empty: private endpoint only. Public ranges may cover together at most a /8 of IPv4 "
        "(a /32 of IPv6) unless allowWideGkeAuthorizedNetworks is set; ranges covering the "
        "whole internet are refused.",
    )
    allow_wide_gke_authorized_networks: Bool = Field(
        False,
        description="GKE only: accept public gkeAuthorizedNetworks that together cover more than "
        "a /8 of IPv4 or a /32 of IPv6. Everyone there can reach the cluster's Kubernetes API and "
        "try credentials on it.",
    )

    @property
    def elastic(self) -> bool:
        """Whether the controller adds and removes slices (between minSlices and slices)."""
        return self.min_slices is not None

    @property
    def multislice(self) -> bool:
        return self.slices > 1

    @property
    def total_hosts(self) -> int:
        return self.tpu.hosts * self.slices

    @property
    def waits_for_capacity(self) -> bool:
        """Whether each slice is a request that waits for capacity (a flex-start MIG, a queued
        resource) rather than a direct create; its hosts exist only once it is fulfilled, named by
        the cloud, not by rayslice. The stack's cell says so: no capacity means keep waiting."""
        return capacity_table.cell_for(self).waits_for_capacity

    @property
    def max_run_seconds(self) -> int | None:
        """``maxRunHours`` in seconds, as a flex-start slice's resize request asks for it
        (``requestedRunDuration.seconds``); None unless capacity is flex-start."""
        return self.max_run_hours * SECONDS_PER_HOUR if self.max_run_hours is not None else None

    @property
    def gke_cluster_name(self) -> str:
        """The GKE cluster that holds the node pools: ``gkeCluster``, or the one rayslice
        creates, which is named after the cluster."""
        return self.gke_cluster or self.name

    @property
    def runs_recovery(self) -> bool:
        """Whether the recovery controller's VM runs (GKE recreates its node pools itself)."""
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
    bounds: tuple[int, int] | None  # (lowest, highest) of an integer key, else None
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
        # The model gives integer bounds only (`Field(ge=..., le=...)` on integer keys).
        low = next((cast(int, m.ge) for m in info.metadata if isinstance(m, annotated_types.Ge)), None)
        high = next((cast(int, m.le) for m in info.metadata if isinstance(m, annotated_types.Le)), None)
        keys.append(
            Key(
                name=info.alias or field,
                field=field,
                type=PULUMI_TYPES[base],
                description=info.description or "",
                default=default,
                derived=bool(extra.get(DERIVED)),
                choices=choices,
                bounds=(low, high) if low is not None and high is not None else None,
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


def coerce(key: Key, value: Any) -> Any:
    """A raw value as the key's type, or ValueError with a message that names the key."""
    try:
        return _adapter(key.name).validate_python(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        if error["type"] == "literal_error":
            raise ValueError(
                f"{key.name}={shown(value)} is not valid; use one of: {', '.join(key.choices)}"
            ) from None
        if error["type"] in ("greater_than_equal", "less_than_equal") and key.bounds is not None:
            low, high = key.bounds
            given = shown(value).strip("'")  # a number, however it was written: digits only
            raise ValueError(f"{key.name}={given} is out of range; use {low:,} to {high:,}") from None
        message = str(error["msg"]).removeprefix("Value error, ")
        raise ValueError(f"{key.name} {message}") from None
