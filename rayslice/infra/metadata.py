"""Instance metadata of a host: the boot script plus the ``rayslice-*`` attributes it reads.

Every host of every slice, and the CPU head VM, boots the same rendered script and learns its
role from these attributes (heads are found through metadata). No secret is ever placed here:
with token auth the attributes name the Secret Manager secret only.

Compute Engine hosts (``platform: compute``) lack the attributes only the Cloud TPU API sets
(``instance-id``, ``agent-worker-number``, ``worker-network-endpoints``), so their metadata
also names the slice (`ATTR_SLICE_NAME`) and lists its hosts' instance names in worker order
(`ATTR_SLICE_HOSTS`); a host's worker number is the position of its own name in that list.
"""

from __future__ import annotations

from rayslice.names import ATTR_SLICE_HOSTS, ATTR_SLICE_NAME, host_name
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts import host_attributes

STARTUP_SCRIPT_KEY = "startup-script"
# OS Login keeps SSH keys out of instance metadata: without it `gcloud ... ssh` writes keys
# into the metadata Pulumi manages, and the next `pulumi up` would remove them again.
OS_LOGIN_KEY = "enable-oslogin"
# Guest attributes are off unless the instance asks for them; the boot script reports its
# state (installing, waiting: head, joined, failed: ...) through them.
GUEST_ATTRIBUTES_KEY = "enable-guest-attributes"
# The input whose change replaces a host instead of patching it (`replace_on_changes`): the
# boot script and every attribute it reads only take effect at boot.
REPLACE_ON_METADATA = "metadata"


def host_metadata(
    spec: ClusterSpec,
    script: str,
    slice_index: int,
    head_address: str | None = None,
    token_secret: str | None = None,
) -> dict[str, str]:
    """Metadata of slice `slice_index`'s hosts, or of the head VM (`HEAD_VM_SLICE_INDEX`)."""
    return {
        STARTUP_SCRIPT_KEY: script,
        OS_LOGIN_KEY: "TRUE",
        GUEST_ATTRIBUTES_KEY: "TRUE",
        **host_attributes(spec, slice_index, head_address=head_address, token_secret=token_secret),
    }


def slice_host_names(spec: ClusterSpec, slice_index: int) -> list[str]:
    """Instance names of a Compute Engine slice's hosts, worker 0 first."""
    return [host_name(spec.slice_name(slice_index), worker) for worker in range(spec.tpu.hosts)]


def compute_identity(spec: ClusterSpec, slice_index: int) -> dict[str, str]:
    """The slice identity a Compute Engine host cannot read from TPU-API-only attributes."""
    return {
        ATTR_SLICE_NAME: spec.slice_name(slice_index),
        ATTR_SLICE_HOSTS: ",".join(slice_host_names(spec, slice_index)),
    }
