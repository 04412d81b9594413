"""The TPU catalog: every accelerator type rayslice knows, derived from per-generation rules.

Nothing else in rayslice hard-codes a TPU fact (chips per host, a topology, a runtime version,
a machine type, an image, a zone). A generation is a handful of numbers in `GENERATIONS`; every
slice shape is generated from them, for three platforms that disagree in small ways:

* ``compute`` follows Compute Engine's TPU machine types (a TPU host is an ordinary VM instance,
  a multi-host slice a managed instance group bound to a workload policy). Google offers v5p,
  v6e and tpu7x there; the 8-chip v6e shape is ONE ``ct6e-standard-8t`` host.
* ``tpu-vm`` follows the Cloud TPU VM API: the 8-chip v5e/v6e shape is ONE 8-chip host and
  tpu7x/tpu7 are not served at all.
* ``gke`` follows GKE's TPU node pools as xpk v1.13 describes them: every multi-chip node has
  4 chips, so ``v6e-8`` is a 2x4 topology on two ``ct6e-standard-4t`` nodes.

It also holds the one Compute Engine fact that is not a TPU's: which machine families each zone
the catalog lists offers (`MACHINE_FAMILIES_BY_ZONE`), so a head VM's type is checked before
anything is created; and the list prices of ``prices.json`` (`chip_hour_price`,
`machine_hour_price`), dated and sourced in that file, which say None where no price is published.

Names are accepted as ``<gen>-<N>`` (N counts TensorCores for v2/v3/v4/v5p/tpu7x, chips for
v5e/v6e), as ``<gen>-<topology>``, with the GKE accelerator label as the prefix
(``tpu-v6e-slice-16``) and as a host and Ray spell them (``v7x-16``).

A generation has two spellings where Google's APIs and the hosts disagree: Compute Engine and
GKE name TPU7x ``tpu7x-N``, while a TPU7x host reports ``v7x-N`` in its ``accelerator-type``
metadata and Ray labels its nodes ``v7x-N``. `Generation.reported_prefix` holds that fact,
`canonical_name` turns any spelling into the catalog's and `reported_name` into the host's; no
other module compares the two spellings.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

from rayslice.errors import CatalogError, shown

PLATFORMS = ("compute", "tpu-vm", "gke")

# What each platform is, for messages that name the platforms offering a generation.
PLATFORM_NAMES = {
    "compute": "Compute Engine",
    "tpu-vm": "the Cloud TPU VM API",
    "gke": "GKE",
}

# Compute Engine's TPU OS images. Project and families from SkyPilot's GCP provisioner and its
# unit test `test_gcp_compute_tpu_uses_accelerator_image_by_default`
# (skypilot-org/skypilot, tests/unit_tests/test_sky/clouds/test_gcp.py): ct6e-standard-4t boots
# `ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e`, tpu7x-standard-4t `ubuntu-accel-2404-amd64-tpu-tpu7x`,
# both in project `ubuntu-os-accelerator-images`. The v5p family is the same v5e-v5p-v6e image by
# its name; no public run on a ct5p host was found.
TPU_IMAGE_PROJECT = "ubuntu-os-accelerator-images"
_IMAGE_V5_V6 = "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
_IMAGE_TPU7X = "ubuntu-accel-2404-amd64-tpu-tpu7x"


@dataclass(frozen=True)
class Generation:
    """The few numbers that define a TPU generation; every shape is derived from them."""

    name: str  # canonical prefix of accelerator type names
    aliases: tuple[str, ...]  # other prefixes users write (GKE label, marketing name)
    tensorcores_per_chip: int
    rank: int  # 2-D or 3-D torus
    max_chips: int  # largest slice
    gke_accelerator: str | None  # node label value; None: not on GKE
    gke_machine_family: str | None  # machine type without the "-<chips>t" suffix
    runtime_version: str | None  # default TPU VM runtime; None: not on the TPU VM API
    runtime_marker: str  # substring that marks a runtime version as this generation's
    zones: tuple[str, ...]  # documented zones (docs snapshot; may be stale)
    multislice: bool
    # HBM per chip, GiB (Google's Cloud TPU pages, "System architecture" of each version: v2 16,
    # v3 32, v4 32, v5e 16, v5p 95, v6e 32, Ironwood 192). The simulated chips report it as
    # their total memory (`rayslice.local.host.tpu_runtime`), and `Chip.hbm_bytes` is read from it.
    hbm_gib: int
    # xpk's choice of which topology owns "<gen>-<N>" when several have N chips: the most
    # cube-like one for up to `cubic_alias_max_cubes` 4x4x4 cubes, otherwise the first one
    # generated, except for the documented shapes in `cubic_alias_shapes`.
    cubic_alias_max_cubes: int = 0
    cubic_alias_shapes: tuple[str, ...] = ()
    # 3-D generations list topologies with non-decreasing dimensions unless this is False.
    nondecreasing: bool = True
    # Smallest slice each platform offers (v6e-1 exists, v5p-2 does not).
    tpu_vm_min_chips: int = 4
    gke_min_chips: int = 4
    # TPU VM API: the 8-chip shape is a single 8-chip host (v5e, v6e).
    tpu_vm_single_host_8: bool = False
    # Multi-host node pools on GKE need a workload policy instead of COMPACT placement.
    gke_workload_policy: bool = False
    # Compute Engine: machine type family ("<family>-<chips per host>t") and the chips-per-host
    # sizes Google documents for it; None: Compute Engine does not offer the generation.
    compute_machine_family: str | None = None
    compute_chips_per_host: tuple[int, ...] = ()
    compute_image_family: str | None = None
    compute_min_chips: int = 4
    # Cloud TPU VM API: topologies of the rules that the API does not offer (see each generation).
    tpu_vm_missing: tuple[str, ...] = ()
    # TPU VMs of this generation are created with Secure Boot (a shielded VM). Only where a
    # public source shows it working: Google's TPU docs do not list Secure Boot support per
    # generation (gcloud's `tpu-vm create --shielded-secure-boot` and the API's
    # ShieldedInstanceConfig say nothing of it). pulumi-gcp's "Tpu V2 Vm Full" example, which
    # its provider tests create, enables it on a v2 (`accelerator_config` V2, 2x2). Turn it on
    # for another generation once its docs, or a real `pulumi up`, show that it boots.
    shielded_vm: bool = False
    # The prefix a host of this generation reports in its ``accelerator-type`` metadata and Ray
    # puts in its node labels, where it is not `name`; None: the same as `name`.
    reported_prefix: str | None = None
    # How a host shows its chips to libtpu and to Ray's TPU detection: "accel", one /dev/accelN
    # per chip, or "vfio", one /dev/vfio/<IOMMU group> per TPU device, each group's PCI vendor in
    # /sys/kernel/iommu_groups/<group>/devices/*/vendor Google's (0x1ae0, which Ray 2.60 checks
    # since ray-project/ray#65105); `devices_per_chip` devices per chip. Sources at each
    # generation; /dev/accel* is v4's and older's (yixiaoer/tpux#6, marin-community/marin#4941).
    chip_devices: Literal["accel", "vfio"] = "accel"
    devices_per_chip: int = 1

    @property
    def counts_tensorcores(self) -> bool:
        return self.tensorcores_per_chip == 2

    @property
    def platforms(self) -> tuple[str, ...]:
        """The platforms that offer this generation, in `PLATFORMS` order."""
        offered = {
            "compute": self.compute_machine_family is not None,
            "tpu-vm": self.runtime_version is not None,
            "gke": self.gke_accelerator is not None,
        }
        return tuple(p for p in PLATFORMS if offered[p])

    @property
    def default_platform(self) -> str:
        """Compute Engine where Google offers the generation there (the Cloud TPU VM API gets
        bug fixes only), otherwise the TPU VM API, otherwise GKE."""
        return self.platforms[0]


_UBUNTU_BASE = "tpu-ubuntu2204-base"

GENERATIONS: tuple[Generation, ...] = (
    Generation(
        name="v2",
        aliases=(),
        tensorcores_per_chip=2,
        rank=2,
        max_chips=256,
        gke_accelerator=None,
        gke_machine_family=None,
        runtime_version=_UBUNTU_BASE,
        runtime_marker="",
        multislice=False,
        hbm_gib=16,
        zones=("us-central1-b", "us-central1-c", "us-central1-f", "europe-west4-a", "asia-east1-c"),
        shielded_vm=True,
        # Google's "TPU v2" page lists v2-8, v2-32, v2-128, v2-256 and v2-512 as the supported
        # types (cloud.google.com/tpu/docs/v2, read 2026-12): no 2x4 (v2-16) or 4x8 (v2-64).
        tpu_vm_missing=("2x4", "4x8"),
    ),
    Generation(
        name="v3",
        aliases=(),
        tensorcores_per_chip=2,
        rank=2,
        max_chips=1024,
        gke_accelerator=None,
        gke_machine_family=None,
        runtime_version=_UBUNTU_BASE,
        runtime_marker="",
        multislice=False,
        hbm_gib=32,
        zones=("us-central1-a", "us-central1-b", "us-central1-f", "europe-west4-a"),
        # Google's TPU regions-and-zones table lists v3-8, 32, 64, 128, 256, 512, 1024 and 2048
        # (cloud.google.com/tpu/docs/regions-zones, read 2026-12): no 2x4 (v3-16).
        tpu_vm_missing=("2x4",),
    ),
    Generation(
        name="v4",
        aliases=("tpu-v4-podslice",),
        tensorcores_per_chip=2,
        rank=3,
        max_chips=4096,
        gke_accelerator="tpu-v4-podslice",
        gke_machine_family="ct4p-hightpu",
        runtime_version=_UBUNTU_BASE,
        runtime_marker="",
        multislice=True,
        hbm_gib=32,
        zones=("us-central2-b",),
        nondecreasing=False,
        cubic_alias_shapes=("4x8x8", "8x8x8", "8x8x12", "8x8x16", "8x16x16"),
    ),
    Generation(
        name="v5litepod",
        aliases=("v5e", "tpu-v5-lite-podslice"),
        tensorcores_per_chip=1,
        rank=2,
        max_chips=256,
        gke_accelerator="tpu-v5-lite-podslice",
        gke_machine_family="ct5lp-hightpu",
        runtime_version="v2-alpha-tpuv5-lite",
        runtime_marker="tpuv5-lite",
        multislice=True,
        hbm_gib=16,
        tpu_vm_single_host_8=True,
        tpu_vm_min_chips=1,
        gke_min_chips=8,
        zones=("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a", "europe-west4-b"),
        # A real v5litepod-4 host's chip, seen on 2026-12-05 (docs/simulated-tpu-runtime.md): /dev/vfio/2
        # and /dev/vfio/vfio, no /dev/accel*.
        chip_devices="vfio",
    ),
    Generation(
        name="v5p",
        aliases=("tpu-v5p-slice",),
        tensorcores_per_chip=2,
        rank=3,
        max_chips=8960,
        gke_accelerator="tpu-v5p-slice",
        gke_machine_family="ct5p-hightpu",
        runtime_version="v2-alpha-tpuv5",
        runtime_marker="tpuv5",
        multislice=True,
        hbm_gib=95,
        zones=("us-central1-a", "us-east5-a"),
        cubic_alias_max_cubes=96,
        cubic_alias_shapes=("12x24x24", "16x20x28"),
        # ct5p-hightpu-{1,2,4}t (xpk, SkyPilot). The rules make no 1- or 2-chip v5p shape (the
        # smallest slice on the other platforms is v5p-8), so only -4t is used.
        compute_machine_family="ct5p-hightpu",
        compute_chips_per_host=(1, 2, 4),
        compute_image_family=_IMAGE_V5_V6,
        # /dev/vfio/* on v5p and v6e, /dev/accel* on v4 (marin-community/marin#3858 and #4941).
        chip_devices="vfio",
    ),
    Generation(
        name="v6e",
        aliases=("tpu-v6e-slice",),
        tensorcores_per_chip=1,
        rank=2,
        max_chips=256,
        gke_accelerator="tpu-v6e-slice",
        gke_machine_family="ct6e-standard",
        runtime_version="v2-alpha-tpuv6e",
        runtime_marker="tpuv6e",
        multislice=True,
        hbm_gib=32,
        tpu_vm_single_host_8=True,
        tpu_vm_min_chips=1,
        gke_min_chips=1,
        zones=("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"),
        # ct6e-standard-{1,4,8}t (xpk, SkyPilot); -8t is the one 8-chip host, as on the TPU VM API.
        compute_machine_family="ct6e-standard",
        compute_chips_per_host=(1, 4, 8),
        compute_image_family=_IMAGE_V5_V6,
        compute_min_chips=1,
        # A v6e-4 host: /dev/vfio/0..3 and /dev/vfio/vfio, each group vendor 0x1ae0 device 0x006f
        # (ray-project/ray#65105, tested on v6e and tpu7x).
        chip_devices="vfio",
    ),
    Generation(
        name="tpu7x",
        aliases=("ironwood",),
        tensorcores_per_chip=2,
        rank=3,
        max_chips=9216,
        gke_accelerator="tpu7x",
        gke_machine_family="tpu7x-standard",
        runtime_version=None,
        runtime_marker="tpu7x",
        multislice=True,
        hbm_gib=192,
        zones=("us-central1-c",),
        gke_workload_policy=True,
        gke_min_chips=1,
        cubic_alias_max_cubes=96,
        cubic_alias_shapes=("12x24x24", "16x16x32", "16x20x28", "16x24x24"),
        # tpu7x-standard-{1,4}t (xpk, SkyPilot).
        compute_machine_family="tpu7x-standard",
        compute_chips_per_host=(1, 4),
        compute_image_family=_IMAGE_TPU7X,
        compute_min_chips=1,
        # A tpu7x-standard-4t host of a 2-host MIG slice reports `v7x-16` (a published guide's
        # check of a real TPU7x slice on Compute Engine: "Qwen3.5-397B-A17B-FP8 Inference on
        # TPU v7x — TPU VM Edition", part 3, step 1.5 "Verify the ICI interconnect": "Should
        # output: v7x-16 (note: no "tpu" prefix)"), and Ray 2.60 rewrites `tpu7x-N` to `v7x-N`
        # (ray/_private/accelerators/tpu.py, normalize_tpu_accelerator_type).
        reported_prefix="v7x",
        # Two VFIO devices per chip, its chiplets (ray-project/ray#65105; vllm-project/tpu-inference#1266:
        # a tpu7x-8 host has 4 chips, 8 devices), so Ray 2.60's own count is twice the chips and
        # the boot script's explicit `--resources '{"TPU": N}'` is what counts chips.
        chip_devices="vfio",
        devices_per_chip=2,
    ),
    Generation(
        name="tpu7",
        aliases=(),
        tensorcores_per_chip=2,
        rank=3,
        max_chips=256,
        gke_accelerator="tpu7",
        gke_machine_family="tpu7-standard",
        runtime_version=None,
        runtime_marker="tpu7-",
        multislice=True,
        hbm_gib=192,
        zones=("us-central1-c",),
        gke_workload_policy=True,
        gke_min_chips=1,
        cubic_alias_max_cubes=96,
        # No public host of it was found; Ray's rule (above) turns `tpu7-N` into `v7-N`.
        reported_prefix="v7",
        # Assumed like tpu7x's; no source shows a host.
        chip_devices="vfio",
        devices_per_chip=2,
    ),
)

_BY_PREFIX = {p: g for g in GENERATIONS for p in (g.name, *g.aliases, g.reported_prefix) if p}

# ---- CPU machine families per zone (for the head VM and GKE's head node pool) -------------------
#
# Source: SkyPilot's GCP VM catalog, skypilot-org/skypilot-catalog catalogs/v8/gcp/vms.csv (commit
# 006059e0f18a, read 2026-12), which lists every priced machine type per zone as Compute Engine
# reports it. Checked there family by family (rows of e2-highmem-*, n1-standard-*,
# n2-highmem-*/n2-standard-*, n2d-*, c3-standard-*, c4-standard-*) for each zone the generations
# list. It agrees with the project's cloud review: us-east5 and us-south1 have no n1, and c3 is
# missing from asia-east1. `None` marks a zone no source settles: us-central2-b (TPU v4) has no
# row at all in that catalog (not even the n1/n2d types TPU hosts run on), and Google's zone
# table we could read does not list its machine families, so rayslice accepts any well-formed
# machine type there and docs/configuration.md says so.
HEAD_MACHINE_FAMILIES = ("c3", "c4", "e2", "n1", "n2", "n2d")  # the families the table tracks
_ALL = frozenset(HEAD_MACHINE_FAMILIES)
_NO_N1 = _ALL - {"n1"}
MACHINE_FAMILIES_BY_ZONE: dict[str, frozenset[str] | None] = {
    "asia-east1-c": _ALL - {"c3"},
    "europe-west4-a": _ALL,
    "europe-west4-b": _ALL,
    "us-central1-a": _ALL,
    "us-central1-b": _ALL,
    "us-central1-c": _ALL,
    "us-central1-f": _ALL,
    "us-central2-b": None,
    "us-east1-d": _ALL,
    "us-east5-a": _NO_N1,
    "us-east5-b": _NO_N1,
    "us-south1-a": _NO_N1,
    "us-west1-c": _ALL,
    "us-west4-a": _ALL,
}
MACHINE_FAMILIES_SOURCE = (
    "SkyPilot's GCP VM catalog (skypilot-org/skypilot-catalog, catalogs/v8/gcp/vms.csv, commit "
    "006059e0f18a, read 2026-12), families c3, c4, e2, n1, n2, n2d"
)


def machine_family(machine_type: str) -> str:
    """``n2-standard-16`` -> ``n2``; custom types (``n2-custom-8-32768``) keep their family."""
    return machine_type.split("-", 1)[0]


def zone_machine_families(zone: str) -> frozenset[str] | None:
    """The machine families a catalog zone offers; None where no source settled it (or unknown)."""
    return MACHINE_FAMILIES_BY_ZONE.get(zone)


# Compute Engine's Arm (aarch64) machine series: Google Axion (C4A, N4A) and Ampere Altra (Tau
# T2A), from the "Arm processors" section of Compute Engine's "CPU platforms" page
# (cloud.google.com/compute/docs/cpu-platforms) and Google Cloud's Axion N4A/C4A announcement
# (2025-11). Every host rayslice boots is x86_64 (a TPU host, docs/decisions.md "Hosts are
# x86_64"; the head and controller VMs boot the x86_64 image ubuntu-2204-lts), and so are the
# locks the hosts install: an Arm head is refused in every zone, the unsettled ones included.
ARM_MACHINE_FAMILIES = frozenset({"c4a", "n4a", "t2a"})


def head_machine_problem(machine_type: str, zone: str) -> str | None:
    """Why a CPU machine type cannot run in a zone (None: it can, or the zone is not settled)."""
    family = machine_family(machine_type)
    if family in ARM_MACHINE_FAMILIES:
        return (
            f"machine family {family!r} ({machine_type}) is Arm (aarch64), but the head VM boots an "
            f"x86_64 image and installs the hosts' x86_64 lock; use an x86_64 family (e.g. "
            f"{DEFAULT_HEAD_MACHINE_TYPE})"
        )
    families = zone_machine_families(zone)
    if families is None:
        return None
    if family in families:
        return None
    offered = ", ".join(sorted(families))
    if family not in HEAD_MACHINE_FAMILIES:
        return (
            f"machine family {family!r} ({machine_type}) is unknown; use a type of a family zone "
            f"{zone} offers: {offered} (e.g. {DEFAULT_HEAD_MACHINE_TYPE})"
        )
    return (
        f"machine family {family!r} ({machine_type}) is not offered in zone {zone}; use a type of "
        f"a family it offers: {offered} (e.g. {DEFAULT_HEAD_MACHINE_TYPE})"
    )


# The head VM's default: n2 is offered in every settled zone above (n1 is not in us-east5 and
# us-south1); 16 vCPUs / 64 GB like the n1-standard-16 of Google's Ray-on-TPU guide.
DEFAULT_HEAD_MACHINE_TYPE = "n2-standard-16"


@dataclass(frozen=True)
class TpuType:
    """One slice shape on one platform; `as_json` is the CLI's and the docs' view of it."""

    accelerator_type: str
    generation: str
    platform: str
    chips: int
    tensorcores: int
    hosts: int
    chips_per_host: int
    topology: str
    runtime_version: str | None
    machine_type: str | None
    gke_accelerator: str | None
    placement: str | None  # "COMPACT", "workload-policy" or None (single host / TPU VM API)
    zones: tuple[str, ...]
    multislice: bool
    image_project: str | None = None  # Compute Engine only: the TPU OS image
    image_family: str | None = None

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    def as_json(self) -> dict[str, object]:
        return {
            "accelerator_type": self.accelerator_type,
            "generation": self.generation,
            "platform": self.platform,
            "chips": self.chips,
            "tensorcores": self.tensorcores,
            "hosts": self.hosts,
            "chips_per_host": self.chips_per_host,
            "topology": self.topology,
            "runtime_version": self.runtime_version,
            "machine_type": self.machine_type,
            "gke_accelerator": self.gke_accelerator,
            "placement": self.placement,
            "zones": list(self.zones),
            "multislice": self.multislice,
        } | (
            {"image_project": self.image_project, "image_family": self.image_family}
            if self.platform == "compute"
            else {}
        )


def parse_topology(topology: str) -> tuple[int, ...]:
    return tuple(int(x) for x in topology.split("x"))


def _product(dims: tuple[int, ...]) -> int:
    return math.prod(dims)


def _topologies(gen: Generation) -> list[str]:
    """All topologies of a generation, in the order that decides ownership of "<gen>-<N>"."""
    if gen.rank == 2:
        # 2-D tori double one side at a time: 1x1, 2x2, 2x4, 4x4, 4x8, ...
        shapes = ["1x1"]
        side = 2
        while side * side <= gen.max_chips:
            shapes.append(f"{side}x{side}")
            if side * side * 2 <= gen.max_chips:
                shapes.append(f"{side}x{side * 2}")
            side *= 2
        return shapes
    # 3-D tori: the sub-cube shapes, then multiples of the 4x4x4 cube up to the pod size.
    shapes = ["1x1x1", "2x2x1", "2x2x2", "2x2x4", "2x4x4"]
    max_cubes = gen.max_chips // 64
    sides = range(4, 257, 4)
    for x, y, z in itertools.product(sides, repeat=3):
        if gen.nondecreasing and not x <= y <= z:
            continue
        if (x // 4) * (y // 4) * (z // 4) <= max_cubes:
            shapes.append(f"{x}x{y}x{z}")
    return shapes


def _alias_owner(gen: Generation, candidates: list[str]) -> str:
    """Which of the topologies with the same chip count the name "<gen>-<N>" means."""
    chips = _product(parse_topology(candidates[0]))
    cubic = min(candidates, key=lambda t: (max(parse_topology(t)), sum(parse_topology(t))))
    if chips // 64 <= gen.cubic_alias_max_cubes or cubic in gen.cubic_alias_shapes:
        return cubic
    return candidates[0]


def _chips_per_host(gen: Generation, platform: str, chips: int) -> int:
    if chips == 1:
        return 1
    if platform in ("tpu-vm", "compute") and gen.tpu_vm_single_host_8 and chips == 8:
        return 8
    return 4 if chips >= 4 else chips


def _placement(gen: Generation, platform: str, hosts: int) -> str | None:
    if platform == "tpu-vm" or hosts == 1:
        return None
    # Compute Engine: every multi-host slice is a MIG bound to a workload policy.
    return "workload-policy" if gen.gke_workload_policy or platform == "compute" else "COMPACT"


def _offered(gen: Generation, platform: str, topology: str) -> bool:
    chips = _product(parse_topology(topology))
    if platform == "tpu-vm":
        return (
            gen.runtime_version is not None
            and chips >= gen.tpu_vm_min_chips
            and topology not in gen.tpu_vm_missing
            and _tpu_vm_orders_dims(gen, topology)
        )
    if platform == "compute":
        return (
            gen.compute_machine_family is not None
            and chips >= gen.compute_min_chips
            and _chips_per_host(gen, platform, chips) in gen.compute_chips_per_host
        )
    return gen.gke_accelerator is not None and chips >= gen.gke_min_chips


def _tpu_vm_orders_dims(gen: Generation, topology: str) -> bool:
    """The Cloud TPU API writes a 3-D topology of whole cubes as AxBxC with A <= B <= C
    (Google's "TPU types and topologies" page on v4); GKE also takes the other orders (xpk lists
    them), so only the TPU VM API drops them. Sub-cube shapes (2x2x1, 2x4x4) keep their names."""
    dims = parse_topology(topology)
    return gen.rank != 3 or any(d % 4 for d in dims) or list(dims) == sorted(dims)


def _make(gen: Generation, platform: str, topology: str) -> TpuType:
    chips = _product(parse_topology(topology))
    per_host = _chips_per_host(gen, platform, chips)
    hosts = chips // per_host
    tensorcores = chips * gen.tensorcores_per_chip
    return TpuType(
        accelerator_type=f"{gen.name}-{tensorcores}",
        generation=gen.name,
        platform=platform,
        chips=chips,
        tensorcores=tensorcores,
        hosts=hosts,
        chips_per_host=per_host,
        topology=topology,
        runtime_version=gen.runtime_version if platform == "tpu-vm" else None,
        machine_type=_machine_type(gen, platform, per_host),
        gke_accelerator=gen.gke_accelerator if platform == "gke" else None,
        placement=_placement(gen, platform, hosts),
        zones=gen.zones,
        multislice=gen.multislice,
        image_project=TPU_IMAGE_PROJECT if platform == "compute" else None,
        image_family=gen.compute_image_family if platform == "compute" else None,
    )


def _machine_type(gen: Generation, platform: str, per_host: int) -> str | None:
    family = {"gke": gen.gke_machine_family, "compute": gen.compute_machine_family}.get(platform)
    return f"{family}-{per_host}t" if family else None


@cache
def table(platform: str) -> dict[str, TpuType]:
    """Every accepted canonical name ("<gen>-<N>" and "<gen>-<topology>") on a platform."""
    _check_platform(platform)
    names: dict[str, TpuType] = {}
    for gen in GENERATIONS:
        by_chips: dict[int, list[str]] = {}
        for topology in _topologies(gen):
            if not _offered(gen, platform, topology):
                continue
            names[f"{gen.name}-{topology}"] = _make(gen, platform, topology)
            by_chips.setdefault(_product(parse_topology(topology)), []).append(topology)
        for candidates in by_chips.values():
            shape = _make(gen, platform, _alias_owner(gen, candidates))
            names[shape.accelerator_type] = shape
    return names


def _check_platform(platform: str) -> None:
    if platform not in PLATFORMS:
        raise CatalogError(f"unknown platform {platform!r}; use one of: {', '.join(PLATFORMS)}")


def generation(name: str) -> Generation:
    """A generation by its name or any alias (``v5e``, ``tpu-v6e-slice``)."""
    try:
        return _BY_PREFIX[name.strip().lower()]
    except KeyError:
        known = ", ".join(g.name for g in GENERATIONS)
        raise CatalogError(f"unknown TPU generation {shown(name)}; known generations: {known}") from None


_NAME = re.compile(r"(?P<prefix>[a-z0-9-]+?)-(?P<size>[0-9]+(?:x[0-9]+)*)", re.ASCII)


def generation_of(name: str) -> Generation | None:
    """The generation an accelerator type name belongs to (``tpu-v6e-slice-16`` -> v6e), if any."""
    match = _NAME.fullmatch(name.strip().lower())
    return _BY_PREFIX.get(match["prefix"]) if match else None


def canonical_name(name: str) -> str:
    """Rewrite alias prefixes to the canonical one: ``tpu-v6e-slice-4x4`` -> ``v6e-4x4``."""
    text = name.strip().lower()
    match = _NAME.fullmatch(text)
    if match and match["prefix"] in _BY_PREFIX:
        return f"{_BY_PREFIX[match['prefix']].name}-{match['size']}"
    return text


def reported_name(name: str) -> str:
    """The name a host reports for an accelerator type, and Ray's: ``tpu7x-16`` -> ``v7x-16``,
    ``tpu-v6e-slice-16`` -> ``v6e-16``; a name of no known generation comes back lowercased."""
    text = canonical_name(name)
    match = _NAME.match(text)
    gen = _BY_PREFIX.get(match["prefix"]) if match else None
    if match is None or gen is None or gen.reported_prefix is None:
        return text
    return f"{gen.reported_prefix}-{match['size']}"


def lookup(name: str, platform: str = "tpu-vm") -> TpuType:
    """Resolve an accelerator type on a platform, or raise CatalogError saying what to use."""
    shapes = table(platform)
    key = canonical_name(name)
    if key in shapes:
        return shapes[key]
    raise CatalogError(_unknown_message(name, key, platform))


def not_offered_message(gen: Generation, platform: str) -> str:
    """Why a generation cannot be used on a platform, naming the platforms that offer it."""
    return (
        f"{gen.name} is not available on {platform} ({PLATFORM_NAMES[platform]} does not offer it); "
        f"it is offered on: {', '.join(gen.platforms)}: set platform to one of them "
        f"(--set platform={gen.platforms[0]}, or --platform {gen.platforms[0]} for `rayslice catalog`)"
    )


def _unknown_message(name: str, key: str, platform: str) -> str:
    match = _NAME.fullmatch(key)
    gen = _BY_PREFIX.get(match["prefix"]) if match else None
    if gen is not None and platform not in gen.platforms:
        return not_offered_message(gen, platform)
    if match is not None and gen is not None and "x" in match["size"]:
        ordered = f"{gen.name}-{'x'.join(str(d) for d in sorted(map(_asked, match['size'].split('x'))))}"
        if ordered != key and ordered in table(platform):
            return (
                f"unknown topology {shown(name)} on {platform}: write its dimensions in ascending "
                f"order, {ordered}"
            )
    suggestions = closest(key, platform)
    return (
        f"unknown accelerator type {shown(name)} on {platform}; closest valid types: "
        f"{', '.join(suggestions)} (run `rayslice catalog --platform {platform}` for all)"
    )


# A size or dimension asked for with more digits than this is far beyond any slice; it is compared
# as 10**_ASKED_DIGITS (int() of a long text costs time, and Python refuses over 4,300 digits).
_ASKED_DIGITS = 6


def _asked(digits: str) -> int:
    """A size or topology dimension from a name a user gave, as a number to compare."""
    return int(digits) if len(digits) <= _ASKED_DIGITS else 10**_ASKED_DIGITS


def closest(key: str, platform: str, count: int = 3) -> list[str]:
    """The valid names nearest to `key`: same generation by size when it parses, else by spelling."""
    shapes = table(platform)
    match = _NAME.fullmatch(key)
    gen = _BY_PREFIX.get(match["prefix"]) if match else None
    if match is not None and gen is not None and "x" not in match["size"]:
        wanted = _asked(match["size"])
        sizes = sorted(
            {
                s.tensorcores if gen.counts_tensorcores else s.chips
                for s in shapes.values()
                if s.generation == gen.name
            },
            key=lambda n: (abs(n - wanted), n),
        )
        if sizes:
            return [f"{gen.name}-{n}" for n in sizes[:count]]
    plain = [n for n in shapes if "x" not in n.split("-")[-1]]
    return difflib.get_close_matches(key, plain, n=count, cutoff=0.0)


def generations(platform: str) -> list[Generation]:
    """Generations that have at least one shape on a platform."""
    present = {t.generation for t in table(platform).values()}
    return [g for g in GENERATIONS if g.name in present]


def runtime_generations(runtime_version: str) -> list[str]:
    """The generations a TPU VM runtime version is built for (the Ubuntu base serves v2-v4)."""
    marked = [g.name for g in GENERATIONS if g.runtime_marker and g.runtime_marker in runtime_version]
    if "tpuv5-lite" in runtime_version or "v5litepod" in runtime_version:
        return ["v5litepod"]
    if marked:
        return marked
    return [g.name for g in GENERATIONS if g.runtime_version == _UBUNTU_BASE]


def generation_rows(platform: str) -> list[dict[str, object]]:
    """One summary row per generation on a platform, for the readable table."""
    rows: list[dict[str, object]] = []
    for gen in generations(platform):
        shapes = [
            s for n, s in table(platform).items() if n == s.accelerator_type and s.generation == gen.name
        ]
        shapes.sort(key=lambda s: s.chips)
        row: dict[str, object] = {
            "generation": gen.name,
            "aliases": ",".join(gen.aliases) or "-",
            "smallest": shapes[0].accelerator_type,
            "largest": shapes[-1].accelerator_type,
            "chips/host": ",".join(str(c) for c in sorted({s.chips_per_host for s in shapes})),
            "runtime" if platform == "tpu-vm" else "machine": (
                gen.runtime_version
                if platform == "tpu-vm"
                else ",".join(sorted({str(s.machine_type) for s in shapes}))
            ),
            "multislice": "yes" if gen.multislice else "no",
            "zones": ",".join(gen.zones),
        }
        if platform == "compute":
            row["image"] = f"{TPU_IMAGE_PROJECT}/{gen.compute_image_family}"
        rows.append(row)
    return rows


# ---- list prices (prices.json: the one copy, dated, with its source) ---------------------------

# The ways to get TPU capacity, in the order the spec and the catalog's price table show them.
CAPACITIES = ("on-demand", "spot", "reserved", "flex-start")
# ---- flex-start zones (per platform and generation) ------------------------------------------

# Where each platform takes flex-start TPUs, per catalog generation; a generation a platform has
# no entry for gets no flex-start there. None: the platform's page lists its own zones, which
# rayslice has not read, so any zone of the generation is passed on to Google.
# - tpu-vm: Cloud TPU, "Request Cloud TPUs using flex-start"
#   (https://cloud.google.com/tpu/docs/request-using-flex-start), Limitations: "TPU v6e for
#   training and serving: asia-northeast1-b, us-east5-a; TPU v5e for training: us-west4-a; TPU v5e
#   for serving: us-central1-a".
# - compute: SkyPilot, sky/provision/gcp/mig_utils.py `_TPU_FLEX_START_ZONES` (its Compute Engine
#   TPU flex-start MIGs): ct6e asia-northeast1-b, us-east5-a, us-south1-ai1b; tpu7x us-central1-c.
#   The v6e zones are the Cloud TPU page's; us-south1-ai1b is not a zone name the spec takes.
#   Compute Engine's own pages list none, and no source offers v5p there.
# - gke: GKE, "About flex-start provisioning mode" (https://cloud.google.com/kubernetes-engine/docs/concepts/dws),
#   its TPU section as a review of it quoted (the page itself not re-read here): v6e in
#   asia-northeast1-b, us-east5-a and us-east5-b; v5e in us-west4-a; v5p in us-east5-a; no TPU7x
#   (and TPU v3 and v4 are not supported); GKE 1.33.0-gke.1712000 or later.
FLEX_START_ZONES: dict[str, dict[str, tuple[str, ...] | None]] = {
    "tpu-vm": {"v6e": ("asia-northeast1-b", "us-east5-a"), "v5litepod": ("us-west4-a", "us-central1-a")},
    "compute": {"v6e": ("asia-northeast1-b", "us-east5-a"), "tpu7x": ("us-central1-c",)},
    "gke": {
        "v5litepod": ("us-west4-a",),
        "v5p": ("us-east5-a",),
        "v6e": ("asia-northeast1-b", "us-east5-a", "us-east5-b"),
    },
}


def flex_start_zones(platform: str, generation_name: str) -> tuple[str, ...] | None:
    """The zones where `platform` takes flex-start TPUs of the generation (None: any zone of the
    generation, the platform's own list not being known); `KeyError` if it takes none."""
    return FLEX_START_ZONES[platform][generation(generation_name).name]


# ---- boot disks -------------------------------------------------------------------------------

# Boot disk type per TPU generation on Compute Engine. "Storage options for Cloud TPU data"
# (https://docs.cloud.google.com/tpu/docs/storage-options-compute), "TPU generation and
# supported disk types": TPU7x and v6e Hyperdisk Balanced or Hyperdisk ML, v5p Balanced
# Persistent Disk or Hyperdisk ML. Hyperdisk ML volumes are read-only data disks, never boot
# disks, so one boot type is left per generation (the stricter reading).
BOOT_DISK_TYPES: dict[str, tuple[str, ...]] = {
    "v5p": ("pd-balanced",),
    "v6e": ("hyperdisk-balanced",),
    "tpu7x": ("hyperdisk-balanced",),
}

# Flex-start capacity runs at most 7 days ("Flex-start VMs: ... for up to 7 days", Google's
# "Plan your Cloud TPU resources").
MAX_RUN_HOURS = 7 * 24


def region_of(zone: str) -> str:
    """``us-central1-b`` -> ``us-central1``."""
    return zone.rsplit("-", 1)[0]


@cache
def prices() -> dict[str, Any]:
    """The price file as read: currency, retrieval date, source, notes and the tables."""
    text = resources.files("rayslice").joinpath("prices.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _price(table: str, key: str, region: str, capacity: str) -> float | None:
    found = prices()[table].get(key, {}).get(region, {}).get(capacity)
    return float(found) if found is not None else None


def chip_hour_price(generation_name: str, region: str, capacity: str) -> float | None:
    """USD per chip-hour of a generation in `region` on `capacity`; None: not published in the
    price file's source (say so, never guess)."""
    return _price("tpu_chip_hour", generation(generation_name).name, region, capacity)


def slice_hour_price(tpu: TpuType, region: str, capacity: str) -> float | None:
    """USD per hour of one slice of shape `tpu`: its chips at the generation's per-chip price."""
    per_chip = chip_hour_price(tpu.generation, region, capacity)
    return None if per_chip is None else per_chip * tpu.chips


def machine_hour_price(machine_type: str, region: str, capacity: str = "on-demand") -> float | None:
    """USD per hour of a CPU VM of `machine_type` in `region`; None: not in the price file."""
    return _price("machine_hour", machine_type, region, capacity)


def gke_cluster_hour_price() -> tuple[float, float]:
    """GKE's cluster management fee: USD per cluster-hour, and the monthly free-tier credit per
    billing account that zonal clusters may use (prices.json, with its source)."""
    fee = prices()["gke_cluster_hour"]
    return float(fee["usd"]), float(fee["free_tier_usd_per_month"])


def price_source() -> str:
    """One line naming where and when the prices were read, for output that shows a price."""
    data = prices()
    return f"list prices in {data['currency']}, read {data['retrieved']}, from {data['source']}"


def format_price(per_hour: float | None) -> str:
    """``$43.20/h``, or the words that say no price is published."""
    return "no published price" if per_hour is None else f"${per_hour:,.2f}/h"


def slice_prices(tpu: TpuType) -> dict[str, dict[str, float | None]]:
    """Per region of the shape's zones, one slice's USD per hour on each capacity (None: no
    published price)."""
    regions = sorted({region_of(z) for z in tpu.zones})
    return {region: {c: slice_hour_price(tpu, region, c) for c in CAPACITIES} for region in regions}


# --- Chips: memory, peak compute and memory bandwidth per generation --------------------------
#
# What one chip of a generation can hold and do, for `rayslice fit` (does a step fit a chip's
# HBM, how long would it take at peak), the bundled jobs (sizes on a chip; achieved against peak)
# and the slice check (each chip against its peak). Figures are per chip, dense (no sparsity).
# Sources, each Google's page for the generation, the "key specifications" table, read 2026-12:
# v5e cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16; 16 GB; 819 GB/s), v5p /tpu/docs/v5p
# (459; 95 GB; 2,765 GB/s), v6e /tpu/docs/v6e (918; 32 GB; 1,638 GB/s), v3 /tpu/docs/v3 (123;
# 32 GiB; 900 GB/s). v2 (45; 16 GiB; 600 GB/s) and v4 (275; 32 GiB; 1,200 GB/s): the pages
# /tpu/docs/v2 and /v4, as rayslice's benchmark table recorded them before this table existed.
# TPU7x (Ironwood): Google gives 4,614 TFLOP/s in FP8, 192 GB and 7.37 TB/s per chip
# (cloud.google.com/tpu/docs/tpu7x); bf16 here is half the FP8 figure, as the MXUs run FP8 at
# twice the bf16 rate (Google's "Training large models on Ironwood" post); not a published number.
# Google writes "GB" for HBM where the chips hold GiB: a v5e chip shows 15.75 GiB to JAX
# (`memory_stats()["bytes_limit"]`, measured 2026-12-06, docs/benchmarks.md), so capacities
# are taken as GiB. The capacity itself is the generation's `hbm_gib`, the one record of it.

_GIB = 2**30


@dataclass(frozen=True)
class Chip:
    """One chip of a generation, as a job sees it."""

    generation: str  # `Generation.name`
    device_kinds: tuple[str, ...]  # `jax.Device.device_kind` of its devices (exact strings)
    topology_prefix: str  # the name libtpu gives `get_topology_desc` ("v5e" in "v5e:2x2")
    bf16_flops: float  # dense peak, FLOP/s
    hbm_bytes_per_s: float
    # JAX devices per chip on a real host: two TensorCores shown apart on v2, v3 and TPU7x, one
    # (megacore) device on v4 and v5p; from the bench table before (v2, v3) and libtpu
    # 0.0.42.1's compile-only topologies (tpu7x:2x2x1 has 8 devices for 4 chips).
    jax_devices_per_chip: int = 1

    @property
    def hbm_bytes(self) -> int:
        return generation(self.generation).hbm_gib * _GIB


CHIPS: tuple[Chip, ...] = (
    Chip("v2", ("TPU v2",), "v2", 45e12, 600e9, jax_devices_per_chip=2),
    Chip("v3", ("TPU v3",), "v3", 123e12, 900e9, jax_devices_per_chip=2),
    Chip("v4", ("TPU v4",), "v4", 275e12, 1200e9),
    Chip("v5litepod", ("TPU v5 lite", "TPU v5e"), "v5e", 197e12, 819e9),
    Chip("v5p", ("TPU v5", "TPU v5p"), "v5p", 459e12, 2765e9),
    Chip("v6e", ("TPU v6 lite", "TPU v6e"), "v6e", 918e12, 1638e9),
    Chip("tpu7x", ("TPU7x", "TPU v7x"), "tpu7x", 2307e12, 7370e9, jax_devices_per_chip=2),
)

_CHIP_BY_GENERATION = {c.generation: c for c in CHIPS}
_CHIP_BY_KIND = {k: c for c in CHIPS for k in c.device_kinds}


def chip(generation_name: str) -> Chip | None:
    """The chip of a generation (any spelling `generation` takes); None where no public source
    gives its figures (tpu7)."""
    return _CHIP_BY_GENERATION.get(generation(generation_name).name)


def chip_of_device_kind(device_kind: str) -> Chip | None:
    """The TPU chip behind a JAX device kind ("TPU v5 lite"), or None (a CPU, a GPU, a TPU kind
    this table does not know): callers then say the peak is unknown rather than guess."""
    return _CHIP_BY_KIND.get(device_kind)


def device_peak_flops(device_kind: str) -> float | None:
    """Dense bf16 peak of one JAX device of that kind (a chip's share), or None where unknown."""
    found = chip_of_device_kind(device_kind)
    return None if found is None else found.bf16_flops / found.jax_devices_per_chip


def device_hbm_bytes(device_kind: str) -> int | None:
    """HBM of one JAX device of that kind (a chip's share), or None where unknown."""
    found = chip_of_device_kind(device_kind)
    return None if found is None else found.hbm_bytes // found.jax_devices_per_chip


def device_hbm_bytes_per_s(device_kind: str) -> float | None:
    """HBM bandwidth of one JAX device of that kind (a chip's share), or None where unknown."""
    found = chip_of_device_kind(device_kind)
    return None if found is None else found.hbm_bytes_per_s / found.jax_devices_per_chip
