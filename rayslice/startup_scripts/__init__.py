"""Boot scripts for TPU hosts, rendered from Jinja templates (`rayslice.startup_scripts`).

One script per slice: every host of the slice runs the same text at every boot and decides
its role from its own metadata. What a host reads (besides the TPU VM's own attributes) is
the set of ``rayslice-*`` attributes from `host_attributes`, which infra writes into instance
metadata and the local simulator serves from its fake metadata server.

`RenderOptions` holds the only differences between a real host and a simulated one, each a
documented, rendered knob: the supervisor, the package source and the file-system root.
"""

from __future__ import annotations

import hashlib
import json

from rayslice.errors import InvalidInput
from rayslice.names import (
    ATTR_COMPILATION_CACHE,
    ATTR_CONFIG_HASH,
    ATTR_HEAD_ADDRESS,
    ATTR_HEAD_MODE,
    ATTR_INDEX_CREDENTIALS_SECRET,
    ATTR_NUM_SLICES,
    ATTR_RECORD,
    ATTR_ROLE,
    ATTR_SLICE_INDEX,
    ATTR_TOKEN_SECRET,
    HEAD_VM_ROLE,
    HEAD_VM_SLICE_INDEX,
    IMAGE_BUILDER_ROLE,
)
from rayslice.platforms import VM_PLATFORMS
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts.locks import Lock
from rayslice.startup_scripts.options import RenderOptions
from rayslice.startup_scripts.templating import render_template
from rayslice.startup_scripts.variables import script_variables

# GCE metadata values are limited to 256 KB; the script must fit in one.
METADATA_VALUE_LIMIT = 256 * 1024


def config_hash(spec: ClusterSpec) -> str:
    """A short hash of everything that changes what a host installs or runs."""
    text = json.dumps(spec.as_config(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def host_attributes(
    spec: ClusterSpec,
    slice_index: int,
    head_address: str | None = None,
    token_secret: str | None = None,
    compilation_cache: str | None = None,
    record: str | None = None,
) -> dict[str, str]:
    """The ``rayslice-*`` metadata attributes of one slice (or of the head VM, `HEAD_VM_SLICE_INDEX`).

    Where Google's attributes do not identify a host's worker (``platform: compute``), a slice's
    hosts also get their platform's identity attributes (`platforms.VmPlatform.identity_attributes`:
    the slice name and the slice's instance names in worker order), from which each host finds
    its worker number. `token_secret` and the spec's `package_index_credentials_secret` are Secret Manager
    secret *names*, never their contents. No host gets the recovery controller: it runs on its
    own VM (`rayslice.startup_scripts.controller`).
    """
    attributes = {
        ATTR_HEAD_MODE: spec.head,
        ATTR_SLICE_INDEX: str(slice_index),
        ATTR_NUM_SLICES: str(spec.slices),
        ATTR_CONFIG_HASH: config_hash(spec),
    }
    if slice_index == HEAD_VM_SLICE_INDEX:
        attributes[ATTR_ROLE] = HEAD_VM_ROLE
    if head_address is not None:
        attributes[ATTR_HEAD_ADDRESS] = head_address
    if token_secret is not None:
        attributes[ATTR_TOKEN_SECRET] = token_secret
    if compilation_cache is not None:  # the gs:// location of JAX's cache (rayslice.compilation_cache)
        attributes[ATTR_COMPILATION_CACHE] = compilation_cache
    if record is not None:  # the gs:// prefix of the cluster's record (rayslice.observability.record)
        attributes[ATTR_RECORD] = record
    if spec.package_index_credentials_secret is not None:
        attributes[ATTR_INDEX_CREDENTIALS_SECRET] = spec.package_index_credentials_secret
    platform = VM_PLATFORMS.get(spec.platform)
    if platform is not None and slice_index != HEAD_VM_SLICE_INDEX:
        attributes.update(
            platform.identity_attributes(
                spec.slice_name(slice_index), spec.tpu.hosts, cloud_names=spec.waits_for_capacity
            )
        )
    return attributes


def image_builder_attributes(spec: ClusterSpec) -> dict[str, str]:
    """The ``rayslice-*`` attributes of the instance that bakes `spec`'s host image: its role
    (the boot script then installs and powers off instead of starting Ray) and, for a private
    index, the secret holding its credentials."""
    attributes = {ATTR_ROLE: IMAGE_BUILDER_ROLE}
    if spec.package_index_credentials_secret is not None:
        attributes[ATTR_INDEX_CREDENTIALS_SECRET] = spec.package_index_credentials_secret
    return attributes


def render(spec: ClusterSpec, options: RenderOptions | None = None, lock: Lock | None = None) -> str:
    """The boot script for every host of a slice of `spec` (and for its head VM); without
    `options`, for a real host. `lock` is the stack's lock (`stack_locks`), if it has one."""
    script = render_template("startup.sh.j2", **script_variables(spec, options or RenderOptions(), lock))
    if len(script.encode()) > METADATA_VALUE_LIMIT:
        size = len(script.encode())
        raise InvalidInput(
            f"rendered startup script is {size} bytes; GCE metadata allows {METADATA_VALUE_LIMIT}; "
            "shorten requirements"
        )
    return script
