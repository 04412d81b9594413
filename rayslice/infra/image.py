"""The host image a compute stack's ``hostImage`` names: a builder instance, an image of its disk.

A slice's hosts install the same packages at their first boot. Baked into an image, the venv is
already on every host's boot disk: the boot script finds its marker equal to its install
fingerprint and skips the install (docs/boot-script.md, "Booting from an image").

`HostImage` declares, from the stack's spec:

- the **builder**: a CPU instance booted from the generation's TPU OS image family (the catalog's
  ``image_project``/``image_family``, the image the slices boot otherwise) that runs the hosts'
  own boot script with the ``image-builder`` role: the script installs the hosts' packages as a
  host would, clears its own traces, publishes ``image ready`` and powers the instance off;
- the **image**, `gcp.compute.Image` from the builder's boot disk, named after the digest of what
  the hosts install (`image_name`: the boot script's install fingerprint, its reboot fast-path
  key; a lock's digest is to take its place once installs are locked, which is not built yet).

What Pulumi alone cannot sequence: an image may only be taken of a disk no running instance uses
(`rayslice.cloud.twin`, rule image-source-disk-in-use, with its source), and nothing in Pulumi waits
for the install inside the builder to finish. So the program has three phases (`PHASES`, the
stack's ``rayslice-image:phase``), each one ``pulumi up``:

1. ``build``: the builder, running. The install takes minutes; it is done when the builder's
   guest attribute ``rayslice/state`` reads ``image ready`` and the instance is TERMINATED
   (docs/deploy-compute.md gives the commands that show both).
2. ``image``: the builder with ``desired_status=TERMINATED`` (the provider stops it if it still
   runs; stopping it early leaves a venv without its marker, which hosts install over, never a
   venv they would trust), and the image of its disk, created after the stop.
3. ``done``: the image alone; Pulumi deletes the builder (its boot disk is deleted with it). The
   image's inputs are unchanged, so it stays.

`rayslice image preview` runs each phase offline against the cloud twin; `rayslice image name`
prints the name to set as ``hostImage``.
"""

from __future__ import annotations

import re

import pulumi
import pulumi_gcp as gcp

from rayslice.errors import InvalidInput
from rayslice.infra.compute.template import BOOT_DISK_GB, base_image
from rayslice.infra.labels import resource_labels
from rayslice.infra.metadata import GUEST_ATTRIBUTES_KEY, OS_LOGIN_KEY, STARTUP_SCRIPT_KEY
from rayslice.infra.program import LockSource, project_locks, read_spec
from rayslice.platforms import VM_PLATFORMS
from rayslice.spec import ClusterSpec, host_image_link
from rayslice.startup_scripts import image_builder_attributes, render
from rayslice.startup_scripts.locks import Lock
from rayslice.startup_scripts.options import PackageSource
from rayslice.startup_scripts.variables import install_fingerprint

PHASES = ("build", "image", "done")
PHASE_NAMESPACE, PHASE_KEY = "rayslice-image", "phase"
IMAGE_ROLE = "host-image"
BUILDER_ROLE = "image-builder"
# The builder is a plain CPU VM: its disk type is one every general-purpose machine series takes.
BUILDER_DISK_TYPE = "pd-balanced"
# Without the spec's network the builder joins the project's default network (which a new
# project has) with an external address, to reach the package index.
DEFAULT_NETWORK = "default"
STOPPED = "TERMINATED"  # pulumi-gcp Instance.desired_status: RUNNING, SUSPENDED or TERMINATED


_IMAGE_NAME = re.compile(r"rayslice-host-[0-9a-f]{16}", re.ASCII)


def image_name(spec: ClusterSpec, lock: Lock | None = None) -> str:
    """``rayslice-host-<install fingerprint>``: equal for two specs exactly when their hosts
    would install the same thing (the lock, with the stack's `lock` if it has one, index,
    find-links, Python, uv), so the name says which stacks the image fits."""
    return f"rayslice-host-{install_fingerprint(spec, PackageSource.parse(None), lock)}"


def stale_image_warning(spec: ClusterSpec, lock: Lock | None = None) -> str | None:
    """A warning when `spec` boots a host image `rayslice image` named for another install:
    the hosts then install at their first boot, as without an image (None otherwise, and for
    images named some other way, whose content rayslice cannot tell from the name)."""
    if spec.host_image is None:
        return None
    _, name = host_image_link(spec.host_image)
    wanted = image_name(spec, lock)
    if not _IMAGE_NAME.fullmatch(name) or name == wanted:
        return None
    return (
        f"hostImage {name} holds another install than this stack's ({wanted}): the hosts will "
        "install over it at their first boot; build the stack's image (`rayslice image`) or set "
        f"hostImage={wanted} once it exists"
    )


def builder_name(spec: ClusterSpec, lock: Lock | None = None) -> str:
    return f"{image_name(spec, lock)}-builder"


def builder_disk(spec: ClusterSpec, lock: Lock | None = None) -> str:
    """The builder's boot disk as images.insert takes it (compute v1 discovery document,
    Image.sourceDisk: "zones/zone/disks/disk" is valid). The disk is named after its instance
    (AttachedDiskInitializeParams.diskName: "If not specified, the default is to use the name of
    the instance"); a literal, so the image's input stays the same once the builder is gone."""
    return f"zones/{spec.zone}/disks/{builder_name(spec, lock)}"


def unbuildable(spec: ClusterSpec, phase: str) -> str | None:
    """Why this program cannot build an image for `spec` (None: it can)."""
    if phase not in PHASES:
        return f"{PHASE_NAMESPACE}:{PHASE_KEY}={phase!r} is not a phase; use one of: {', '.join(PHASES)}"
    platform = VM_PLATFORMS.get(spec.platform)
    if platform is None or not platform.host_images:
        return (
            f"a host image is a Compute Engine image, for platform=compute; this stack is "
            f"platform={spec.platform} (on gke, bake the packages into a container image: "
            "docs/deploy-gke.md)"
        )
    if spec.package_index_credentials_secret is not None:
        return (
            "packageIndexCredentialsSecret: the builder runs without a service account, so it "
            "cannot read the secret; building an image from a private index with credentials is "
            "not supported yet"
        )
    return None


class HostImage(pulumi.ComponentResource):
    """The builder (phases build and image) and the image (phases image and done)."""

    image_self_link: pulumi.Output[str] | None

    def __init__(
        self,
        name: str,
        spec: ClusterSpec,
        phase: str,
        lock: Lock | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("rayslice:infra:HostImage", name, None, opts)
        builder = None
        if phase in ("build", "image"):
            builder = gcp.compute.Instance(
                f"{name}-builder",
                name=builder_name(spec, lock),
                project=spec.project,
                zone=spec.zone,
                machine_type=spec.head_machine_type,
                description=f"rayslice: builds image {image_name(spec, lock)}, then powers off",
                boot_disk=gcp.compute.InstanceBootDiskArgs(
                    initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                        image=base_image(spec), size=BOOT_DISK_GB, type=BUILDER_DISK_TYPE
                    ),
                ),
                network_interfaces=[
                    gcp.compute.InstanceNetworkInterfaceArgs(
                        network=spec.network or DEFAULT_NETWORK,
                        subnetwork=spec.subnetwork,
                        access_configs=[gcp.compute.InstanceNetworkInterfaceAccessConfigArgs()]
                        if spec.external_ips or spec.network is None
                        else None,
                    )
                ],
                metadata={
                    STARTUP_SCRIPT_KEY: render(spec, lock=lock),
                    OS_LOGIN_KEY: "TRUE",
                    GUEST_ATTRIBUTES_KEY: "TRUE",
                    **image_builder_attributes(spec),
                },
                labels=resource_labels(spec, BUILDER_ROLE),
                desired_status=STOPPED if phase == "image" else "RUNNING",
                allow_stopping_for_update=True,
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.image_self_link = None
        if phase in ("image", "done"):
            image = gcp.compute.Image(
                f"{name}-image",
                name=image_name(spec, lock),
                project=spec.project,
                description=f"rayslice host image: the venv of {spec.preset} + ray {spec.ray_version} "
                f"on {spec.tpu.image_family}",
                source_disk=builder_disk(spec, lock),
                labels=resource_labels(spec, IMAGE_ROLE),
                # Created only once the builder is stopped (Pulumi waits for its update).
                opts=pulumi.ResourceOptions(parent=self, depends_on=[builder] if builder else []),
            )
            self.image_self_link = image.self_link
        self.register_outputs({"image": self.image_self_link})


def main(locks: LockSource | None = None) -> HostImage:
    """The image program: the stack's spec, its phase, its lock (as the cluster program finds
    it, so the image holds what the hosts install), then `HostImage`."""
    spec = read_spec()
    phase = pulumi.Config(PHASE_NAMESPACE).get(PHASE_KEY) or PHASES[0]
    problem = unbuildable(spec, phase)
    if problem:
        raise InvalidInput(problem)
    lock = (locks or project_locks().lock)(spec)
    host_image = HostImage(spec.name, spec, phase, lock)
    pulumi.export("hostImage", image_name(spec, lock))
    pulumi.export("builder", builder_name(spec, lock) if phase != "done" else None)
    return host_image
