"""Instance metadata of a host: the boot script plus the ``rayslice-*`` attributes it reads.

Every host of every slice, and the CPU head VM, boots the same rendered script and learns its
role from these attributes (heads are found through metadata). No secret is ever placed here:
with token auth the attributes name the Secret Manager secret only. The recovery controller's VM
boots its own script (`controller_metadata`).

Where Google's attributes do not identify a host's worker (Compute Engine), the attributes
include the platform's identity attributes (`rayslice.platforms`): the slice's name and its
hosts' instance names in worker order; a host's worker number is the position of its own name
in that list.
"""

from __future__ import annotations

from rayslice.spec import ClusterSpec
from rayslice.startup_scripts import host_attributes
from rayslice.startup_scripts.controller import controller_attributes

STARTUP_SCRIPT_KEY = "startup-script"
# OS Login keeps SSH keys out of instance metadata: without it `gcloud ... ssh` writes keys
# into the metadata Pulumi manages, and the next `pulumi up` would remove them again.
OS_LOGIN_KEY = "enable-oslogin"
# Guest attributes are off unless the instance asks for them; the boot script reports its
# state (installing, waiting: head, joined, failed: ...) through them.
GUEST_ATTRIBUTES_KEY = "enable-guest-attributes"
# Project-wide SSH keys in metadata would otherwise still open a VM that OS Login does not cover;
# the controller VM takes none (nothing is meant to log in there).
BLOCK_PROJECT_SSH_KEYS_KEY = "block-project-ssh-keys"
# The input whose change replaces a host instead of patching it (`replace_on_changes`): the
# boot script and every attribute it reads only take effect at boot.
REPLACE_ON_METADATA = "metadata"


def host_metadata(
    spec: ClusterSpec,
    script: str,
    slice_index: int,
    head_address: str | None = None,
    token_secret: str | None = None,
    compilation_cache: str | None = None,
    record: str | None = None,
) -> dict[str, str]:
    """Metadata of slice `slice_index`'s hosts, or of the head VM (`HEAD_VM_SLICE_INDEX`)."""
    attributes = host_attributes(
        spec,
        slice_index,
        head_address=head_address,
        token_secret=token_secret,
        compilation_cache=compilation_cache,
        record=record,
    )
    return {STARTUP_SCRIPT_KEY: script, OS_LOGIN_KEY: "TRUE", GUEST_ATTRIBUTES_KEY: "TRUE", **attributes}


def controller_metadata(spec: ClusterSpec, script: str) -> dict[str, str]:
    """Metadata of the recovery controller's VM: its own boot script and the controller."""
    return {
        STARTUP_SCRIPT_KEY: script,
        OS_LOGIN_KEY: "TRUE",
        BLOCK_PROJECT_SSH_KEYS_KEY: "TRUE",
        GUEST_ATTRIBUTES_KEY: "TRUE",
        **controller_attributes(spec),
    }
