"""ClusterSpec: the one reader of user input.

Pulumi config (namespace ``rayslice``, falling back to ``gcp:project`` / ``gcp:zone``), a stack
file read by the CLI and ``--set KEY=VALUE`` overrides all arrive here as raw values. `load`
checks every key, reports every problem at once (each saying what to do) and returns a frozen
`ClusterSpec`; everything downstream trusts it and never re-validates.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement

from rayslice import catalog
from rayslice.errors import SpecError
from rayslice.names import slice_name

NAMESPACE = "rayslice"
DEFAULT_RAY_VERSION = "2.60.0"


@dataclass(frozen=True)
class Key:
    """One config key: its Pulumi type, default and description (Pulumi.yaml mirrors these)."""

    name: str
    type: str  # Pulumi config type: string | integer | boolean | array | object
    description: str
    default: Any = None


KEYS: tuple[Key, ...] = (
    Key(
        "name",
        "string",
        "Prefix of every resource name (GCP name rules: lowercase letter, then letters, digits, hyphens).",
        "rayslice",
    ),
    Key("project", "string", "GCP project; falls back to gcp:project."),
    Key("platform", "string", "Where the TPUs run: tpu-vm (Cloud TPU VM API) or gke.", "tpu-vm"),
    Key(
        "acceleratorType",
        "string",
        "TPU slice type, e.g. v6e-16, v5p-2x2x2 or tpu-v6e-slice-16 (see `rayslice catalog`).",
        "v6e-16",
    ),
    Key("slices", "integer", "Number of identical slices; more than one is multislice (v4 and newer).", 1),
    Key("zone", "string", "GCP zone that offers the generation; falls back to gcp:zone."),
    Key(
        "runtimeVersion",
        "string",
        "TPU VM runtime (software) version; default: the generation's from the catalog.",
    ),
    Key("capacity", "string", "on-demand, spot or reserved.", "on-demand"),
    Key(
        "reservation",
        "string",
        "Reservation name for capacity=reserved on GKE (TPU VMs use any matching reservation).",
    ),
    Key(
        "head",
        "string",
        "Where the Ray head runs: slice (worker 0 of slice 0) or vm (a CPU VM); default slice for one slice, vm for several.",
    ),
    Key(
        "headMachineType",
        "string",
        "Machine type of the CPU head VM (head=vm) or the GKE head node pool.",
        "n1-standard-16",
    ),
    Key("network", "string", "Existing VPC network name; absent: rayslice creates one with Cloud NAT."),
    Key(
        "subnetwork",
        "string",
        "Existing subnetwork of `network` (set both); absent: created with the network.",
    ),
    Key(
        "externalIps",
        "boolean",
        "Give TPU hosts external IPs (off: hosts reach package indexes through Cloud NAT).",
        False,
    ),
    Key(
        "dashboardSourceRanges",
        "array",
        "CIDR ranges, besides the cluster itself, allowed to reach the Ray dashboard / Jobs API.",
        (),
    ),
    Key(
        "preset",
        "string",
        "Requirement set from the guide: jax (host-centric) or xla (PyTorch/XLA, device-centric).",
        "jax",
    ),
    Key("requirements", "array", "Extra PEP 508 requirement lines installed on every host.", ()),
    Key("packageIndex", "string", "Python package index URL used instead of PyPI (hosts without internet)."),
    Key("rayVersion", "string", "Ray version installed on every host (X.Y.Z).", DEFAULT_RAY_VERSION),
    Key("labels", "object", "GCP labels added to every resource (GCP label rules apply).", {}),
    Key(
        "rayAuth",
        "string",
        "Ray token authentication: token (token kept in Secret Manager) or none.",
        "token",
    ),
    Key(
        "kuberay",
        "string",
        "GKE only: how the KubeRay operator is installed: helm (pinned release) or addon (GKE Ray add-on).",
        "helm",
    ),
    Key(
        "gkeCluster",
        "string",
        "GKE only: name of an existing cluster to add node pools to; absent: one is created.",
    ),
)
KEY_NAMES = {k.name for k in KEYS}

CHOICES = {
    "platform": catalog.PLATFORMS,
    "capacity": ("on-demand", "spot", "reserved"),
    "head": ("slice", "vm"),
    "preset": ("jax", "xla"),
    "rayAuth": ("token", "none"),
    "kuberay": ("helm", "addon"),
}

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
# Longest name rayslice derives from `name` is "<name>-slice-NN-fw-internal" (63 max).
_NAME_MAX = 40
# GKE refuses node pool names longer than this; the longest pool is the last slice's.
GKE_NODE_POOL_NAME_MAX = 40


@dataclass(frozen=True)
class ClusterSpec:
    """A validated cluster description; build it with `load`, never directly from user input."""

    tpu: catalog.TpuType
    name: str = "rayslice"
    project: str | None = None
    platform: str = "tpu-vm"
    slices: int = 1
    zone: str | None = None
    runtime_version: str | None = None
    capacity: str = "on-demand"
    reservation: str | None = None
    head: str = "slice"
    head_machine_type: str = "n1-standard-16"
    network: str | None = None
    subnetwork: str | None = None
    external_ips: bool = False
    dashboard_source_ranges: tuple[str, ...] = ()
    preset: str = "jax"
    requirements: tuple[str, ...] = ()
    package_index: str | None = None
    ray_version: str = DEFAULT_RAY_VERSION
    labels: Mapping[str, str] = field(default_factory=dict)
    ray_auth: str = "token"
    kuberay: str = "helm"
    gke_cluster: str | None = None

    @property
    def accelerator_type(self) -> str:
        return self.tpu.accelerator_type

    @property
    def multislice(self) -> bool:
        return self.slices > 1

    @property
    def total_hosts(self) -> int:
        return self.tpu.hosts * self.slices

    def slice_name(self, index: int) -> str:
        return slice_name(self.name, index)

    def as_config(self) -> dict[str, Any]:
        """The spec as config keys (camelCase), the form stack files and `--set` use."""
        values = {
            "name": self.name,
            "project": self.project,
            "platform": self.platform,
            "acceleratorType": self.accelerator_type,
            "slices": self.slices,
            "zone": self.zone,
            "runtimeVersion": self.runtime_version,
            "capacity": self.capacity,
            "reservation": self.reservation,
            "head": self.head,
            "headMachineType": self.head_machine_type,
            "network": self.network,
            "subnetwork": self.subnetwork,
            "externalIps": self.external_ips,
            "dashboardSourceRanges": list(self.dashboard_source_ranges),
            "preset": self.preset,
            "requirements": list(self.requirements),
            "packageIndex": self.package_index,
            "rayVersion": self.ray_version,
            "labels": dict(self.labels),
            "rayAuth": self.ray_auth,
            "kuberay": self.kuberay,
            "gkeCluster": self.gke_cluster,
        }
        assert set(values) == KEY_NAMES, "as_config must list every key"
        return values


def load(raw: Mapping[str, Any], *, require_zone: bool = True) -> ClusterSpec:
    """Validate raw config values (strings or YAML/JSON values) and return the spec.

    `require_zone` is off only for the local simulator, which needs no zone: it then uses the
    generation's first documented zone for the metadata it serves.
    """
    problems: list[str] = []
    values = {k.name: k.default for k in KEYS}
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

    for key, allowed in CHOICES.items():
        if values[key] is not None and values[key] not in allowed:
            problems.append(f"{key}={values[key]!r} is not valid; use one of: {', '.join(allowed)}")

    tpu = _resolve_tpu(values, problems)
    _check_names(values, problems)
    _check_zone(values, tpu, problems, require_zone)
    _check_runtime(values, tpu, problems)
    _check_slices(values, tpu, problems)
    _check_requirements(values, problems)
    _check_network(values, problems)
    _check_gke(values, problems)
    _check_misc(values, problems)
    if problems:
        raise SpecError(problems)
    assert tpu is not None
    slices = values["slices"]
    return ClusterSpec(
        tpu=tpu,
        name=values["name"],
        project=values["project"],
        platform=values["platform"],
        slices=slices,
        zone=values["zone"] or tpu.zones[0],
        runtime_version=(values["runtimeVersion"] or tpu.runtime_version)
        if values["platform"] == "tpu-vm"
        else None,
        capacity=values["capacity"],
        reservation=values["reservation"],
        head=values["head"] or ("slice" if slices == 1 else "vm"),
        head_machine_type=values["headMachineType"],
        network=values["network"],
        subnetwork=values["subnetwork"],
        external_ips=values["externalIps"],
        dashboard_source_ranges=tuple(values["dashboardSourceRanges"]),
        preset=values["preset"],
        requirements=tuple(values["requirements"]),
        package_index=values["packageIndex"],
        ray_version=values["rayVersion"],
        labels=dict(values["labels"]),
        ray_auth=values["rayAuth"],
        kuberay=values["kuberay"],
        gke_cluster=values["gkeCluster"],
    )


def _unknown_key(key: str) -> str:
    near = difflib.get_close_matches(key, sorted(KEY_NAMES), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else f"; known keys: {', '.join(sorted(KEY_NAMES))}"
    return f"unknown config key {key!r}{hint}"


def _coerce(key: Key, value: Any) -> Any:
    """Turn a config value (often a string from Pulumi or --set) into the key's type."""
    if key.type == "string":
        if isinstance(value, (dict, list, bool)):
            raise ValueError(f"{key.name} must be a string, got {value!r}")
        return str(value)
    if key.type == "integer":
        if isinstance(value, bool):
            raise ValueError(f"{key.name} must be a whole number, got {value!r}")
        try:
            return int(str(value).strip())
        except ValueError:
            raise ValueError(f"{key.name} must be a whole number, got {value!r}") from None
    if key.type == "boolean":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "false"):
            return text == "true"
        raise ValueError(f"{key.name} must be true or false, got {value!r}")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            if key.type == "array":
                value = [line for line in value.splitlines() if line.strip()]
    if key.type == "array":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key.name} must be a list of strings, got {value!r}")
        return list(value)
    if not isinstance(value, dict):
        raise ValueError(f"{key.name} must be a mapping of strings, got {value!r}")
    return {str(k): "" if v is None else str(v) for k, v in value.items()}


def _resolve_tpu(values: dict[str, Any], problems: list[str]) -> catalog.TpuType | None:
    name = values["acceleratorType"]
    platform = values["platform"] if values["platform"] in catalog.PLATFORMS else "tpu-vm"
    if name is None:
        return None
    try:
        return catalog.lookup(name, platform)
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
            f"headMachineType={values['headMachineType']!r} is not a machine type name (e.g. n1-standard-16)"
        )
    labels = values["labels"] or {}
    if len(labels) > 60:
        problems.append(
            f"labels: {len(labels)} labels given; GCP allows 64 per resource and rayslice adds 4: use at most 60"
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
    if not _ZONE.match(zone):
        problems.append(f"zone={zone!r} is not a GCP zone name (e.g. us-central1-b)")
    elif tpu is not None and zone not in tpu.zones:
        problems.append(
            f"zone {zone} does not offer TPU {tpu.generation}; use one of: {', '.join(tpu.zones)}"
        )


def _check_runtime(values: dict[str, Any], tpu: catalog.TpuType | None, problems: list[str]) -> None:
    runtime = values["runtimeVersion"]
    if runtime is None or tpu is None:
        return
    if values["platform"] == "gke":
        problems.append(
            "runtimeVersion applies to the TPU VM API only; remove it for platform=gke (GKE picks the TPU runtime)"
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
            f"slices={slices}: {tpu.generation} does not support multislice; use slices=1 or one of: {capable}"
        )
    if values["head"] == "slice" and slices > 1:
        problems.append(
            "head=slice with several slices puts the head on one slice's host; use head=vm for multislice"
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
                f"requirements: {line!r} installs from a URL; list a package name and use packageIndex for a private index"
            )
    ray_version = values["rayVersion"]
    if ray_version is not None and not _RAY_VERSION.match(ray_version):
        problems.append(f"rayVersion={ray_version!r} is malformed; use a release like {DEFAULT_RAY_VERSION}")
    index = values["packageIndex"]
    if index is not None and not _URL.match(index):
        problems.append(
            f"packageIndex={index!r} is not an http(s):// or file:// URL without quotes or spaces"
        )


def _check_misc(values: dict[str, Any], problems: list[str]) -> None:
    for cidr in values["dashboardSourceRanges"] or []:
        try:
            net = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            problems.append(f"dashboardSourceRanges: {cidr!r} is not a CIDR range (e.g. 10.0.0.0/8)")
            continue
        if net.prefixlen == 0:
            problems.append(
                f"dashboardSourceRanges: {cidr} opens the Ray dashboard and Jobs API to the internet; list your own ranges"
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
        if values["gkeCluster"] is not None:
            problems.append("gkeCluster applies to platform=gke only; remove it or set platform=gke")
        return
    if values["capacity"] == "reserved" and not values["reservation"]:
        problems.append("capacity=reserved on GKE needs reservation=<name of your reservation>")
    if values["gkeCluster"] is not None:
        for key in ("network", "subnetwork"):
            if values[key] is not None:
                problems.append(
                    f"{key} is not used with gkeCluster (the existing cluster brings its own "
                    f"network); remove {key}, or remove gkeCluster to create a cluster in it"
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
