"""Everything the boot script needs, computed in Python so the template only lays it out."""

from __future__ import annotations

import hashlib
import json

from rayslice import names
from rayslice import startup_scripts as ss
from rayslice.spec import ClusterSpec

# The guide's two requirement sets. torch_xla 2.9 is built for torch 2.9 (FACTS.md); libtpu
# wheels for torch_xla come from Google's find-links pages, as in the guide.
PRESETS: dict[str, tuple[str, ...]] = {
    "jax": ("jax[tpu]>=0.10.2,<0.11",),
    "xla": ("torch~=2.9.0", "torch_xla[tpu]~=2.9.0"),
}
PRESET_FIND_LINKS: dict[str, tuple[str, ...]] = {
    "jax": (),
    "xla": (
        "https://storage.googleapis.com/libtpu-releases/index.html",
        "https://storage.googleapis.com/libtpu-wheels/index.html",
    ),
}

# How long a worker waits for the head's GCS port before it reports failure. The head VM
# installs the same requirements first, so this covers a cold install plus `ray start`.
HEAD_WAIT_DEADLINE_S = 1200
SUPERVISOR_RESTART_DELAY_S = 5
PYTHON_VERSION = "3.11"


def requirement_lines(spec: ClusterSpec) -> list[str]:
    """The pip requirement lines every host installs, in install order."""
    return [*PRESETS[spec.preset], f"ray[default]=={spec.ray_version}", *spec.requirements]


def install_fingerprint(spec: ClusterSpec, options: ss.RenderOptions) -> str:
    """Changes whenever a host would install something different (the reboot fast-path key)."""
    payload = {
        "requirements": requirement_lines(spec),
        "find_links": PRESET_FIND_LINKS[spec.preset],
        "index": spec.package_index,
        "source": options.package_source,
        "python": PYTHON_VERSION,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def script_variables(spec: ClusterSpec, options: ss.RenderOptions) -> dict[str, object]:
    mode, _, location = (options.package_source or "pypi:").partition(":")
    return {
        "accelerator_type": spec.accelerator_type,
        "chips_per_host": spec.tpu.chips_per_host,
        "tpu_resources": json.dumps({"TPU": spec.tpu.chips_per_host}),
        "root": options.root,
        "supervisor": options.supervisor,
        "package_mode": mode,
        "package_dir": location,
        "package_index": spec.package_index or "",
        "find_links": list(PRESET_FIND_LINKS[spec.preset]),
        "requirements": requirement_lines(spec),
        "install_fingerprint": install_fingerprint(spec, options),
        "python_version": PYTHON_VERSION,
        "ray_auth_mode": "token" if spec.ray_auth == "token" else "disabled",
        "gcs_port": names.GCS_PORT,
        "dashboard_port": names.DASHBOARD_PORT,
        "client_port": names.CLIENT_PORT,
        "object_store_bytes": options.object_store_bytes or 0,
        "head_wait_deadline_s": HEAD_WAIT_DEADLINE_S,
        "restart_delay_s": SUPERVISOR_RESTART_DELAY_S,
        "guest_namespace": names.GUEST_ATTRIBUTE_NAMESPACE,
        "attr_head_mode": names.ATTR_HEAD_MODE,
        "attr_head_address": names.ATTR_HEAD_ADDRESS,
        "attr_slice_index": names.ATTR_SLICE_INDEX,
        "attr_num_slices": names.ATTR_NUM_SLICES,
        "attr_config_hash": names.ATTR_CONFIG_HASH,
        "attr_role": names.ATTR_ROLE,
        "head_vm_role": names.HEAD_VM_ROLE,
        "attr_token_secret": names.ATTR_TOKEN_SECRET,
    }
