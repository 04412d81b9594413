"""The rules across keys, and `load`, which applies them to a draft and returns the spec.

Each `_check_*` reads the typed attributes of a `Draft` and appends what it refuses to
`problems`, each saying what to do; a key that is None (unset, or refused on its own) is left
alone, so one wrong value never hides another problem. A check that refuses a value marks it
refused too (`_refuse`), and no check complains that a refused key is missing (`_missing`): one
wrong value gives one problem, not a cascade of others that would vanish once it is fixed. The
derived keys are filled here too: platform and head before the rules that read them, zone,
runtime version and the catalog's name of the accelerator type once nothing was refused.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any, cast
from urllib.parse import SplitResult, urlsplit

from packaging.requirements import InvalidRequirement, Requirement

from rayslice import addresses, capacity_table, catalog
from rayslice.errors import SpecError, shown
from rayslice.names import slice_name
from rayslice.spec.draft import Draft, read
from rayslice.spec.model import DEFAULT_RAY_VERSION, KEYS, RECORD_OFF, ClusterSpec, Platform

# Every pattern validates a whole value (`fullmatch`: `$` would let a trailing newline through)
# and reads ASCII only (`re.ASCII`; classes are spelled out, `\d` would take "٣" as a digit).
# GCP resource names (RFC 1035) and label keys/values.
_GCP_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}", re.ASCII)
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}", re.ASCII)
_PROJECT = re.compile(r"[a-z][-a-z0-9]{4,28}[a-z0-9]", re.ASCII)
_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]", re.ASCII)
_MACHINE_TYPE = re.compile(r"[a-z][a-z0-9-]{1,62}", re.ASCII)
_RUNTIME = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}", re.ASCII)
_RAY_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+", re.ASCII)
# A URL of URL characters only (RFC 3986), minus what a shell or a quote would read: no quotes,
# backticks, '$', ';', backslashes, spaces.
_URL = re.compile(r"(https?|file)://[A-Za-z0-9._~:/?#@!&()*+,=%\[\]-]+", re.ASCII)
# Secret Manager secret IDs: letters, digits, '-' and '_', at most 255 characters.
_SECRET_ID = re.compile(r"[A-Za-z0-9_-]{1,255}", re.ASCII)
# A Compute Engine image: a name (RFC 1035) or its partial URL in a project (compute v1 discovery
# document, AttachedDiskInitializeParams.sourceImage: "specify the image name in the following
# format: global/images/my-custom-image"; Image.name: RFC1035, 1-63 characters).
_IMAGE = re.compile(
    r"(?:projects/(?P<project>[a-z][-a-z0-9]{4,28}[a-z0-9])/)?(?:global/images/)?"
    r"(?P<name>[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)",
    re.ASCII,
)
# Longest name rayslice derives from `name` is "<name>-slice-NN-fw-internal" (63 max).
_NAME_MAX = 40
# The most public address space dashboardSourceRanges (and gkeAuthorizedNetworks) may cover
# together without allowWideDashboardRanges (allowWideGkeAuthorizedNetworks), as a prefix length
# per IP version: a /8 (16.7 million IPv4 addresses) and a /32 (an ISP's IPv6 allocation) are
# already far more than any team's offices and VPNs.
WIDEST_PUBLIC_DASHBOARD = {4: 8, 6: 32}
# GKE refuses node pool names longer than this; the longest pool is the last slice's.
GKE_NODE_POOL_NAME_MAX = 40


def load(raw: Mapping[str, Any], *, require_zone: bool = True) -> ClusterSpec:
    """Validate raw config values (strings or YAML/JSON values) and return the spec.

    Raises `SpecError` listing every problem at once. `require_zone` is off only for the local
    simulator, which needs no zone: it then uses the generation's first documented zone for the
    metadata it serves.
    """
    problems: list[str] = []
    draft = read(raw, problems)
    tpu = _resolve_tpu(draft, problems)
    _check_names(draft, problems)
    _check_slices(draft, tpu, problems)
    _check_head(draft, problems)
    _check_zone(draft, tpu, problems, require_zone)
    _check_runtime(draft, tpu, problems)
    _check_requirements(draft, problems)
    _check_package_index(draft, problems)
    _check_network(draft, problems)
    _check_dashboard(draft, problems)
    _check_gke(draft, problems)
    _check_capacity(draft, problems)
    _check_elastic(draft, tpu, problems)
    _check_flex_start_zone(draft, tpu, problems)
    _check_host_image(draft, problems)
    _check_record_bucket(draft, problems)
    _check_foreign_grants(draft, problems)
    if problems:
        raise SpecError(problems)
    assert tpu is not None
    draft.accelerator_type = tpu.accelerator_type
    draft.zone = draft.zone or _default_zone(draft, tpu)
    if draft.platform == "tpu-vm":
        draft.runtime_version = draft.runtime_version or tpu.runtime_version
    found = _cell(draft)
    if found is not None and found.run_duration and draft.max_run_hours is None:
        draft.max_run_hours = catalog.MAX_RUN_HOURS
    return draft.spec(tpu)


def _resolve_tpu(draft: Draft, problems: list[str]) -> catalog.TpuType | None:
    """The catalog shape, on the platform given or the generation's default platform."""
    name = draft.accelerator_type
    if name is None:
        return None
    gen = catalog.generation_of(name)
    if draft.platform is None and "platform" not in draft.refused:
        # The catalog names its platforms by the same three words as `Platform`.
        draft.platform = cast(Platform, gen.default_platform if gen is not None else "tpu-vm")
    if draft.platform is None:
        return None  # an invalid platform, reported above
    try:
        return catalog.lookup(name, draft.platform)
    except catalog.CatalogError as exc:
        problems.append(f"acceleratorType: {exc}")
        return None


def _refuse(draft: Draft, field: str) -> None:
    """Mark a value refused by a rule: no later rule reads it."""
    setattr(draft, field, None)
    draft.refused = draft.refused | {field}


def _missing(draft: Draft, field: str) -> bool:
    """Whether a key is left unset (not merely refused, which is reported already)."""
    return getattr(draft, field) is None and field not in draft.refused


def _check_names(draft: Draft, problems: list[str]) -> None:
    name = draft.name
    if name is not None and (not _GCP_NAME.fullmatch(name) or len(name) > _NAME_MAX):
        problems.append(
            f"name={shown(name)} breaks GCP naming rules: use 1-{_NAME_MAX} characters, a lowercase "
            "letter first, then lowercase letters, digits or hyphens, not ending in a hyphen"
        )
        _refuse(draft, "name")
    resources = (
        ("network", "network"),
        ("subnetwork", "subnetwork"),
        ("reservation", "reservation"),
        ("gkeCluster", "gke_cluster"),
    )
    for key, field in resources:
        value = getattr(draft, field)
        if value is not None and not _GCP_NAME.fullmatch(value):
            problems.append(
                f"{key}={shown(value)} is not a valid GCP resource name: use up to 63 lowercase "
                "letters, digits or hyphens, starting with a letter"
            )
            _refuse(draft, field)
    if draft.project is not None and not _PROJECT.fullmatch(draft.project):
        problems.append(
            f"project={shown(draft.project)} is not a valid GCP project ID: 6-30 lowercase "
            "letters, digits or hyphens, starting with a letter"
        )
        _refuse(draft, "project")
    if draft.head_machine_type is not None and not _MACHINE_TYPE.fullmatch(draft.head_machine_type):
        problems.append(
            f"headMachineType={shown(draft.head_machine_type)} is not a machine type name "
            f"(e.g. {catalog.DEFAULT_HEAD_MACHINE_TYPE})"
        )
        _refuse(draft, "head_machine_type")  # the zone's machine families are not asked
    labels = draft.labels or {}
    if len(labels) > 60:
        problems.append(
            f"labels: {len(labels):,} labels given; GCP allows 64 per resource and rayslice adds 4: "
            "use at most 60"
        )
        return  # not each of them too
    for key, value in labels.items():
        if not _LABEL_KEY.fullmatch(key):
            problems.append(
                f"labels: key {shown(key)} breaks GCP label rules: start with a lowercase letter, "
                "then up to 62 lowercase letters, digits, '_' or '-'"
            )
        if not _LABEL_VALUE.fullmatch(value):
            problems.append(
                f"labels: value {shown(value)} of {shown(key)} breaks GCP label rules: up to 63 lowercase "
                "letters, digits, '_' or '-'"
            )


def _check_zone(draft: Draft, tpu: catalog.TpuType | None, problems: list[str], required: bool) -> None:
    if "zone" in draft.refused:
        return  # not a string, reported above
    zone = draft.zone
    if zone is None:
        if required:
            zones = f" ({tpu.generation} is offered in {', '.join(tpu.zones)})" if tpu else ""
            problems.append(f"zone is not set: set rayslice:zone or gcp:zone{zones}")
            return
        zone = _default_zone(draft, tpu) if tpu is not None else None
    elif not _ZONE.fullmatch(zone):
        problems.append(f"zone={shown(zone)} is not a GCP zone name (e.g. us-central1-b)")
        return
    elif tpu is not None and zone not in tpu.zones:
        problems.append(
            f"zone {zone} does not offer TPU {tpu.generation}; use one of: {', '.join(tpu.zones)}"
        )
        return
    machine_type = draft.head_machine_type
    uses_head_machine = draft.head == "vm" or draft.slices != 1 or draft.platform == "gke"
    if zone is not None and machine_type is not None and uses_head_machine:
        problem = catalog.head_machine_problem(machine_type, zone)
        if problem:
            problems.append(f"headMachineType={machine_type!r}: {problem}")


def _check_runtime(draft: Draft, tpu: catalog.TpuType | None, problems: list[str]) -> None:
    runtime = draft.runtime_version
    if runtime is None or tpu is None:
        return
    if draft.platform != "tpu-vm":
        source = (
            "GKE picks the TPU runtime" if draft.platform == "gke" else "the catalog names the TPU OS image"
        )
        problems.append(
            "runtimeVersion applies to the TPU VM API only; remove it for "
            f"platform={draft.platform} ({source})"
        )
        return
    if not _RUNTIME.fullmatch(runtime):
        problems.append(
            f"runtimeVersion={shown(runtime)} is not a runtime version name (e.g. {tpu.runtime_version})"
        )
        return
    built_for = catalog.runtime_generations(runtime)
    if tpu.generation not in built_for:
        problems.append(
            f"runtimeVersion {runtime} is built for {', '.join(built_for)}, not {tpu.generation}; "
            f"use {tpu.runtime_version} (the default) or another {tpu.generation} runtime"
        )


def _check_slices(draft: Draft, tpu: catalog.TpuType | None, problems: list[str]) -> None:
    slices = draft.slices
    if slices is None:
        return
    if slices > 1 and tpu is not None and not tpu.multislice:
        capable = ", ".join(g.name for g in catalog.GENERATIONS if g.multislice)
        problems.append(
            f"slices={slices}: {tpu.generation} does not support multislice; use slices=1 or one "
            f"of: {capable}"
        )


def _check_head(draft: Draft, problems: list[str]) -> None:
    """Fill `head` (vm for multislice and spot) and refuse the heads that cannot work."""
    slices, found = draft.slices, _cell(draft)
    # The stack's capacity cell: a request that waits for capacity has no hosts to put a head on
    # meanwhile; a preemptible host takes the head with it. (No cell: refused in _check_capacity.)
    waits = found is not None and found.waits_for_capacity
    preemptible = found is not None and capacity_table.PREEMPTION in found.events
    if draft.platform == "gke":
        # KubeRay runs the Ray head as a pod on the CPU node pool (headMachineType,
        # rayslice/infra/gke/kuberay.py), whatever `head` says: vm is what it is, off the slice.
        if draft.head == "slice":
            problems.append(
                "head=slice on gke: KubeRay runs the Ray head as a pod on the CPU node pool "
                "(headMachineType), never on a TPU host; remove head"
            )
        elif draft.head is None and "head" not in draft.refused:
            draft.head = "vm"
        return
    if draft.head is None:
        if "head" not in draft.refused:
            elastic = draft.min_slices is not None
            draft.head = "vm" if (slices or 1) > 1 or preemptible or waits or elastic else "slice"
        return
    if draft.head != "slice":
        return
    if waits:
        problems.append(
            f"head=slice with {'queued=true' if draft.queued else 'capacity=flex-start'}: the slice's "
            "hosts exist only once its request is fulfilled (hours later, perhaps), and the cloud "
            "names them, so no host can be the head the others join meanwhile; use head=vm (the "
            "default for requests that wait)"
        )
    if slices is not None and slices > 1:
        problems.append(
            "head=slice with several slices puts the head on one slice's host; use head=vm for multislice"
        )
    if preemptible and draft.recovery:
        problems.append(
            "head=slice with capacity=spot puts the Ray head on a Spot host: a preemption takes the "
            "head with its jobs and their restart state, and the recreated slice starts an empty "
            "cluster, so recovery has nothing to resume: use head=vm (the default for spot), or set "
            "recovery=false to keep head=slice without automatic recovery"
        )


def _check_elastic(draft: Draft, tpu: catalog.TpuType | None, problems: list[str]) -> None:
    """An elastic cluster's range, where its controller runs, and its price ceiling."""
    low, high = draft.min_slices, draft.slices
    if low is None:
        if "min_slices" in draft.refused:
            return  # reported above; whether the cluster is elastic is not known
        for field, key in (
            ("idle_timeout_seconds", "idleTimeoutSeconds"),
            ("max_usd_per_hour", "maxUsdPerHour"),
        ):
            if field not in draft.refused and getattr(draft, field) != _default(field):
                problems.append(f"{key} applies to elastic clusters only; set minSlices too, or remove {key}")
        return
    if high is not None and not 0 <= low < high:
        problems.append(
            f"minSlices={low} with slices={high}: minSlices is the fewest slices kept and slices the most, "
            f"so use 0 to {high - 1} (or leave minSlices out for a fixed cluster of {high})"
        )
    if draft.platform not in (None, "compute"):
        problems.append(
            f"minSlices (elastic slices) needs platform=compute, not {draft.platform}: the controller "
            "adds a slice's hosts to the MIG Pulumi declared for it"
            + (
                "; GKE node pools scale with the cluster autoscaler instead"
                if draft.platform == "gke"
                else "; on tpu-vm each slice is a TPU node (or a queued resource) that Pulumi "
                "declares, and the controller would have to create and delete ones Pulumi does not "
                "know about (on compute, capacity=flex-start gives slices that wait for capacity)"
                if draft.platform == "tpu-vm"
                else ""
            )
        )
    if draft.head == "slice":
        problems.append("minSlices with head=slice: the head must outlive every slice; use head=vm")
    if draft.recovery is False:
        problems.append(
            "minSlices with recovery=false: the recovery controller is what adds and removes slices"
        )
    ceiling = draft.max_usd_per_hour
    if ceiling is None or tpu is None or draft.capacity is None:
        return
    region = catalog.region_of(draft.zone or _default_zone(draft, tpu))
    price = catalog.slice_hour_price(tpu, region, draft.capacity)
    if price is None:
        problems.append(
            f"maxUsdPerHour: no list price of {tpu.accelerator_type} on {draft.capacity} in {region} "
            f"is published ({catalog.price_source()}); remove maxUsdPerHour"
        )
    elif low * price > ceiling:
        problems.append(
            f"maxUsdPerHour={ceiling} is below the {low} slice(s) minSlices keeps "
            f"({catalog.format_price(low * price)}); raise it or lower minSlices"
        )


def _default(field: str) -> object:
    return next(key.default for key in KEYS if key.field == field)


def _check_requirements(draft: Draft, problems: list[str]) -> None:
    for line in draft.requirements or ():
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            problems.append(
                f"requirements: {shown(line)} is not a valid PEP 508 requirement "
                f"({str(exc).splitlines()[0]}); e.g. 'optax>=0.2'"
            )
            continue
        if req.url:
            problems.append(
                f"requirements: {shown(line)} installs from a URL; list a package name and use "
                "packageIndex for a private index"
            )
    ray_version = draft.ray_version
    if ray_version is not None and not _RAY_VERSION.fullmatch(ray_version):
        problems.append(
            f"rayVersion={shown(ray_version)} is malformed; use a release like {DEFAULT_RAY_VERSION}"
        )


def _check_package_index(draft: Draft, problems: list[str]) -> None:
    """Credentials never travel in the URL (they would land in metadata, `ps` and previews), and
    plain http (packages installed as root, open to tampering) needs an explicit opt-in."""
    index, secret = draft.package_index, draft.package_index_credentials_secret
    if secret is not None:
        if not _SECRET_ID.fullmatch(secret):
            problems.append(
                f"packageIndexCredentialsSecret={shown(secret)} is not a Secret Manager secret name: use "
                "up to 255 letters, digits, '-' or '_' (the secret's ID, not its full path)"
            )
        if _missing(draft, "package_index"):
            problems.append(
                "packageIndexCredentialsSecret is set without packageIndex: set packageIndex to the "
                "index these credentials are for, or remove packageIndexCredentialsSecret"
            )
    if index is None:
        return
    if not _URL.fullmatch(index):
        problems.append(
            f"packageIndex={shown(index)} is not an https:// or file:// URL without quotes or spaces"
        )
        return
    parts = urlsplit(index)
    if parts.query or parts.fragment or "?" in index or "#" in index:
        problems.append(
            f"packageIndex {shown(_without_credentials(parts))} has a query "
            "or fragment ('?' or '#'); a token there would be readable in instance metadata, the "
            "boot log and uv's command line: remove it, store 'user:password' in a Secret Manager "
            "secret and set packageIndexCredentialsSecret=<secret name>"
        )
    if "@" in parts.netloc:
        problems.append(
            f"packageIndex {shown(_without_credentials(parts))} carries "
            "credentials in its URL, which would be readable in instance metadata, process lists "
            "and previews: remove them from the URL, store 'user:password' in a Secret Manager "
            "secret and set packageIndexCredentialsSecret=<secret name>"
        )
    if parts.scheme == "http" and draft.allow_insecure_package_index is False:
        problems.append(
            f"packageIndex={shown(index)} uses plain http, so anyone on the network path can change the "
            "packages hosts install as root: use https://, or set allowInsecurePackageIndex=true "
            "if the path is trusted"
        )


def _without_credentials(parts: SplitResult) -> str:
    """An index URL as a message may show it: without the user and password before '@'."""
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def _networks(
    key: str, ranges: tuple[str, ...] | None, problems: list[str]
) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    nets, bad = [], []
    for cidr in ranges or ():
        try:
            nets.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError:
            bad.append(cidr)
    if bad:
        verb = "is not a CIDR range" if len(bad) == 1 else "are not CIDR ranges"
        problems.append(f"{key}: {_listed(bad)} {verb} (e.g. 10.0.0.0/8)")
    return nets


def _covers_everything(nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    """Whether the ranges together cover all of IPv4 or all of IPv6 (0.0.0.0/1 + 128.0.0.0/1),
    an IPv4-mapped IPv6 range counted as the IPv4 range it stands for."""
    unwrapped = [addresses.unwrap(n) for n in nets]
    v4 = [n for n in unwrapped if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in unwrapped if isinstance(n, ipaddress.IPv6Network)]
    return ipaddress.IPv4Network("0.0.0.0/0") in ipaddress.collapse_addresses(v4) or (
        ipaddress.IPv6Network("::/0") in ipaddress.collapse_addresses(v6)
    )


def _listed(items: list[Any], most: int = 5) -> str:
    """The first few of `items` for a message (a string as the user wrote it, quoted), and how
    many more there are."""
    more = f" and {len(items) - most:,} more" if len(items) > most else ""
    return ", ".join(shown(item) if isinstance(item, str) else str(item) for item in items[:most]) + more


def _check_width(
    key: str,
    nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network],
    opt_in: tuple[str, bool | None],
    door: str,
    exposure: str,
    problems: list[str],
) -> None:
    """The width rule of ranges that open a door to the internet: public ranges are judged by
    how much they cover together, not one by one (all the /9s but one are as open as 0.0.0.0/0
    less a sliver). Beyond `WIDEST_PUBLIC_DASHBOARD` (more public space than a team plausibly
    owns) they need the opt-in key set; the whole address space never passes."""
    if _covers_everything(nets):
        problems.append(
            f"{key}: {_listed(nets)} together cover the whole address space, which opens {door} to "
            "the internet; list only your own ranges"
        )
        return
    opt_in_key, opted_in = opt_in
    if opted_in is None:
        return  # the opt-in was refused, reported above
    for version, prefix in WIDEST_PUBLIC_DASHBOARD.items():
        covered = addresses.public_addresses(nets, version)
        limit = 2 ** ((32 if version == 4 else 128) - prefix)
        if covered > limit and not opted_in:
            problems.append(
                f"{key}: the public IPv{version} ranges together cover {covered:,} addresses, more "
                f"than a /{prefix} ({limit:,}), far more than one team's networks: {exposure}. List "
                f"only your own ranges, or set {opt_in_key}=true if {door} must really be reachable "
                "that widely"
            )


def _check_dashboard(draft: Draft, problems: list[str]) -> None:
    """The dashboard port is the Ray Jobs API: whoever reaches it runs code on every host. Its
    ranges keep the width rule (`_check_width`), and public ones need token auth."""
    key = "dashboardSourceRanges"
    nets = _networks(key, draft.dashboard_source_ranges, problems)
    public = [n for n in nets if not addresses.is_internal_network(n)]
    if public and draft.ray_auth == "none" and not _covers_everything(nets):
        problems.append(
            f"{key}: {_listed(public)} {'is a public range' if len(public) == 1 else 'are public ranges'} "
            "and rayAuth=none: anyone there could submit jobs through the Ray Jobs API and run code "
            "on every host (remote code execution); set rayAuth=token, or list only private ranges"
        )
        return  # how wide they are matters once a token guards them
    _check_width(
        key,
        nets,
        ("allowWideDashboardRanges", draft.allow_wide_dashboard_ranges),
        "the Ray dashboard and Jobs API",
        "everyone there can reach the Jobs API and try the token (over plain http unless you tunnel)",
        problems,
    )


def _check_network(draft: Draft, problems: list[str]) -> None:
    # A subnetwork name alone cannot be used: rayslice would create a new VPC and look for the
    # subnetwork in it.
    if draft.subnetwork is not None and _missing(draft, "network"):
        problems.append(
            f"subnetwork={shown(draft.subnetwork)} is set without network: set network to the VPC "
            "that holds this subnetwork too (or remove subnetwork to let rayslice create both)"
        )


def _check_capacity(draft: Draft, problems: list[str]) -> None:
    """The stack's capacity must be a cell of `rayslice.capacity_table` (the table says why one
    is not, and what to set instead), and its durations only where they apply (their ranges are
    the model's)."""
    platform, capacity = draft.platform, draft.capacity
    if platform is None or capacity is None:
        return  # refused above
    if capacity not in capacity_table.offered(platform):
        problems.append(capacity_table.why_not(platform, capacity))
        return
    if draft.reservation and capacity != capacity_table.RESERVED:
        problems.append(f"reservation is used with capacity=reserved only; remove it for capacity={capacity}")
        return
    if draft.calendar_mode and _missing(draft, "reservation"):
        problems.append(
            "calendarMode applies to capacity=reserved with a named reservation (a future reservation "
            "created in calendar mode): set reservation=<its name>, or remove calendarMode"
        )
        return
    if draft.capacity_mode == capacity_table.ALL_CAPACITY_MODE:
        if _missing(draft, "reservation"):
            problems.append(
                "capacityMode=all-capacity applies to capacity=reserved with a named reservation (an "
                "All Capacity mode reservation): set reservation=<its name>, or remove capacityMode"
            )
            return
        if draft.calendar_mode:
            problems.append(
                "capacityMode=all-capacity and calendarMode name two kinds of reservation: keep the "
                "one your reservation is"
            )
            return
    if "queued" in draft.refused or (capacity == capacity_table.RESERVED and "reservation" in draft.refused):
        return  # refused above: which cell the stack names is not known
    cell = _cell(draft)
    if cell is None:
        key = capacity_table.capacity_of(cast(capacity_table.SpecLike, draft))
        problems.append(capacity_table.why_not(platform, key, queued=bool(draft.queued)))
        return
    # The durations' ranges are the model's; here only whether they apply to the cell.
    if draft.max_run_hours is not None and not cell.run_duration:
        problems.append(f"maxRunHours applies to capacity=flex-start only; remove it for capacity={capacity}")
    if draft.queue_deadline_hours is not None and not cell.queued:
        problems.append(
            "queueDeadlineHours applies to queued=true (tpu-vm) only; set queued=true or remove it"
        )


def _default_zone(draft: Draft, tpu: catalog.TpuType) -> str:
    """The zone `load` fills in when none is set: the generation's first, or on flex-start its
    first where the platform takes flex-start."""
    zones = tpu.zones
    if draft.capacity == capacity_table.FLEX_START and draft.platform is not None:
        flex = catalog.FLEX_START_ZONES.get(draft.platform, {}).get(tpu.generation)
        zones = tuple(z for z in flex or () if z in tpu.zones) or zones
    return zones[0]


def _cell(draft: Draft) -> capacity_table.Cell | None:
    """The draft's cell of `rayslice.capacity_table`, None where its keys name none."""
    if draft.platform is None or draft.capacity is None:
        return None
    key = capacity_table.capacity_of(cast(capacity_table.SpecLike, draft))
    queued = bool(draft.queued)
    if not capacity_table.has_cell(draft.platform, key, queued=queued):
        return None
    return capacity_table.cell(draft.platform, key, queued=queued)


def _check_flex_start_zone(draft: Draft, tpu: catalog.TpuType | None, problems: list[str]) -> None:
    """Flex-start only for the generations and in the zones each platform takes it
    (`catalog.FLEX_START_ZONES`, with their sources)."""
    if draft.capacity != capacity_table.FLEX_START or draft.platform is None or tpu is None:
        return
    try:
        zones = catalog.flex_start_zones(draft.platform, tpu.generation)
    except KeyError:
        offered = sorted(catalog.FLEX_START_ZONES.get(draft.platform, {}))
        problems.append(
            f"capacity=flex-start on {draft.platform} does not offer {tpu.generation} (its flex-start "
            f"takes {', '.join(offered)}); use capacity=on-demand, spot or reserved, or another generation"
        )
        return
    zone = draft.zone or _default_zone(draft, tpu)
    if zones is None or zone in zones:
        return
    usable = [z for z in zones if z in tpu.zones]
    problems.append(
        f"capacity=flex-start on {draft.platform} is not offered for {tpu.generation} in zone "
        f"{zone}; use zone={' or zone='.join(usable or zones)} (Google's flex-start zones)"
    )


def _check_gke(draft: Draft, problems: list[str]) -> None:
    """GKE's own limits on what the user chose, so `pulumi up` never fails half-way on them."""
    if draft.platform is None:
        return  # refused above: whether these keys apply is not known
    if draft.platform != "gke":
        for key, given in (
            ("gkeCluster", draft.gke_cluster),
            ("gkeAuthorizedNetworks", draft.gke_authorized_networks),
            ("allowWideGkeAuthorizedNetworks", draft.allow_wide_gke_authorized_networks),
        ):
            if given:
                problems.append(f"{key} applies to platform=gke only; remove it or set platform=gke")
        return
    key = "gkeAuthorizedNetworks"
    _check_width(
        key,
        _networks(key, draft.gke_authorized_networks, problems),
        ("allowWideGkeAuthorizedNetworks", draft.allow_wide_gke_authorized_networks),
        "the GKE control-plane endpoint",
        "everyone there can reach the cluster's Kubernetes API and try credentials on it",
        problems,
    )
    if draft.gke_cluster is not None:
        for net_key, net in (("network", draft.network), ("subnetwork", draft.subnetwork)):
            if net is not None:
                problems.append(
                    f"{net_key} is not used with gkeCluster (the existing cluster brings its own "
                    f"network); remove {net_key}, or remove gkeCluster to create a cluster in it"
                )
    name, slices = draft.name, draft.slices
    if name is None or slices is None:
        return  # refused above
    longest = slice_name(name, slices - 1)  # "<name>-head" is shorter
    if len(longest) > GKE_NODE_POOL_NAME_MAX:
        room = GKE_NODE_POOL_NAME_MAX - (len(longest) - len(name))
        problems.append(
            f"name={name!r} is too long for platform=gke: node pool {longest!r} would have "
            f"{len(longest)} characters and GKE allows {GKE_NODE_POOL_NAME_MAX}; shorten name "
            f"to at most {room} characters"
        )


def host_image_link(image: str) -> tuple[str | None, str]:
    """(project or None, image name) of a valid hostImage value."""
    found = _IMAGE.fullmatch(image)
    assert found is not None, image  # `load` refused anything else
    return found["project"], found["name"]


def _check_host_image(draft: Draft, problems: list[str]) -> None:
    """hostImage: an image in the stack's project, on the one platform whose template names it."""
    image = draft.host_image
    if image is None:
        return
    if draft.platform is not None and draft.platform != "compute":
        route = (
            "on gke, bake the packages into a container image instead (docs/deploy-gke.md)"
            if draft.platform == "gke"
            else "on tpu-vm the runtime version picks the image"
        )
        problems.append(
            f"hostImage applies to platform=compute only (the image its instance templates boot); "
            f"{route}; remove hostImage or set platform=compute"
        )
        return
    found = _IMAGE.fullmatch(image)
    if found is None:
        problems.append(
            f"hostImage={shown(image)} is not a Compute Engine image: give its name (1-63 lowercase "
            "letters, digits or hyphens, a letter first) or projects/PROJECT/global/images/NAME, "
            "as `rayslice image name` prints it"
        )
    elif found["project"] and draft.project and found["project"] != draft.project:
        problems.append(
            f"hostImage {image!r} is in project {found['project']}, not the stack's project "
            f"{draft.project}: build the image in {draft.project} (`rayslice image`) or give its name"
        )


# A Cloud Storage bucket name without dots ("Bucket names": 3-63 characters, lowercase letters,
# digits, hyphens and underscores, starting and ending with a letter or digit; dotted names are
# domain-verified, which a record bucket has no use for).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]")


def _check_foreign_grants(draft: Draft, problems: list[str]) -> None:
    """A bucket or secret the stack names but does not declare gets grants for the cluster's
    accounts, which every job runs as: naming one needs its explicit opt-in key."""
    bucket, secret = draft.record_bucket, draft.package_index_credentials_secret
    named = bucket is not None and bucket != RECORD_OFF and _BUCKET.fullmatch(bucket)
    if named and draft.platform != "gke" and draft.allow_foreign_record_bucket is not True:
        problems.append(
            f"recordBucket={shown(bucket)} names a bucket this stack does not declare, and every job on "
            "the cluster could then create objects in it (under this cluster's prefix): set "
            "allowForeignRecordBucket=true if that bucket is meant for records, or remove recordBucket "
            "to have the stack declare its own"
        )
    if (
        secret is not None
        and _SECRET_ID.fullmatch(secret)
        and draft.allow_foreign_package_index_secret is not True
    ):
        problems.append(
            f"packageIndexCredentialsSecret={shown(secret)} names a secret this stack does not declare, "
            "and every job on the cluster could then read it: set allowForeignPackageIndexSecret=true "
            "if it holds only the index's credentials"
        )


def _check_record_bucket(draft: Draft, problems: list[str]) -> None:
    """recordBucket: a bucket's name, only where rayslice boots the VMs; or `RECORD_OFF`."""
    bucket = draft.record_bucket
    if bucket is None or bucket == RECORD_OFF:
        return
    if draft.platform == "gke":
        problems.append(
            "recordBucket applies to the VM platforms (compute, tpu-vm), whose boot script ships the "
            "record; remove it on gke"
        )
    elif not _BUCKET.fullmatch(bucket):
        problems.append(
            f"recordBucket={shown(bucket)} is not a Cloud Storage bucket name: 3-63 lowercase letters, "
            f"digits, hyphens or underscores, a letter or digit at each end; or {RECORD_OFF} for no record"
        )
