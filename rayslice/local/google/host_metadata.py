"""The metadata a simulated host sees: the same paths and values a real TPU host (or the CPU head
VM) gets from its GCE metadata server, built from the spec and the simulated network.

The result is a `metadata_server.Tree` that `metadata_server.MetadataServer` serves. A slice's
host gets the attributes Google's API gives a host of its platform
(`rayslice.platforms.VmPlatform`'s `google_attributes`) plus the ``rayslice-*`` attributes infra
writes (`host_attributes`):

* ``tpu-vm`` (Cloud TPU API): `accelerator-type`, `agent-worker-number`, `instance-id`,
  `worker-network-endpoints` (entries ``unknown:unknown:<ip>``), `tpu-env` (lines ``KEY:
  'value'``). Slices are independent TPU VMs (as infra creates them), so `tpu-env` carries no
  MEGASCALE_* values.
* ``compute`` (Compute Engine MIG instances): what every instance has (name, machine type,
  network, zone), the TPU attributes a real Compute Engine TPU host shows
  (`platforms.COMPUTE_TPU_ATTRIBUTES`: `accelerator-type` as the host reports it, ``v7x-16`` on
  TPU7x; `worker-id`; `worker-network-endpoints`, in the TPU VM's format since no source shows
  Compute Engine's; `tpu-env`), plus the identity attributes infra writes: the slice's name and
  its instances' names in worker order (`names.ATTR_SLICE_NAME`, `names.ATTR_SLICE_HOSTS`).

Every value is the host's spelling of the accelerator type (`catalog.reported_name`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from ipaddress import IPv4Network
from typing import cast

from rayslice.cloud.twin import state as twin_state
from rayslice.local.google.metadata_server import FALSE, Json, Tree
from rayslice.names import CLOUD_PLATFORM_SCOPE, HEAD_VM_SLICE_INDEX
from rayslice.platforms import VM_PLATFORMS
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts import host_attributes

LOCAL_PROJECT = "rayslice-local"  # the project the simulator reports when the spec names none
SCOPES = (CLOUD_PLATFORM_SCOPE,)


def numeric_id(text: str, digits: int = 16) -> str:
    """A stable fake numeric id (GCE instance ids and project numbers are numbers)."""
    return str(int(hashlib.sha256(text.encode()).hexdigest(), 16))[:digits]


def google_attributes(
    spec: ClusterSpec, slice_index: int, worker: int, slice_ips: list[str]
) -> dict[str, str]:
    """The attributes Google's API gives host `worker` of slice `slice_index` (`slice_ips` in worker
    order): those its platform lists, valued as a real host of that platform serves them."""
    tpu = spec.tpu
    return twin_state.google_attributes(
        VM_PLATFORMS[spec.platform].google_attributes,
        accelerator_type=tpu.accelerator_type,
        topology=tpu.topology,
        worker=worker,
        ips=slice_ips,
        node_id=spec.slice_name(slice_index),
        project=spec.project or LOCAL_PROJECT,
        zone=spec.zone or "",
        runtime_version=spec.runtime_version or tpu.runtime_version or "",
    )


def slice_host_attributes(
    spec: ClusterSpec, slice_index: int, worker: int, slice_ips: list[str], head_address: str | None
) -> dict[str, str]:
    """`instance/attributes/` of host `worker` of slice `slice_index`: Google's and rayslice's."""
    return {
        **google_attributes(spec, slice_index, worker, slice_ips),
        **host_attributes(spec, slice_index, head_address=head_address),
    }


def head_vm_attributes(spec: ClusterSpec) -> dict[str, str]:
    """`instance/attributes/` of the CPU head VM (head=vm): no TPU attributes, role head-vm."""
    return host_attributes(spec, HEAD_VM_SLICE_INDEX)


def instance_tree(
    spec: ClusterSpec,
    *,
    hostname: str,
    ip: str,
    network: IPv4Network,
    gateway: str,
    attributes: Mapping[str, str],
    startup_script: str,
    access_token: str,
    machine_type: str | None = None,
) -> Tree:
    """The whole metadata tree (``instance/`` and ``project/``) of one simulated host.

    `access_token` is what its service account's token endpoint serves: a random secret of the
    run, which the cloud API emulation accepts only for the host that runs the recovery
    controller (`access_token_of` reads it back there), as Google accepts only an account with
    the roles.
    """
    project = spec.project or LOCAL_PROJECT
    number = numeric_id(project, 12)
    zone = spec.zone or ""
    email = f"{number}-compute@developer.gserviceaccount.com"
    account: Tree = {
        "aliases": ["default"],
        "email": email,
        "scopes": list(SCOPES),
        "token": Json(
            {
                "access_token": access_token,
                "expires_in": 3599,
                "token_type": "Bearer",
            }
        ),
    }
    instance: Tree = {
        "attributes": {**attributes, "startup-script": startup_script},
        "guest-attributes": {},  # served from the server's own store
        "hostname": f"{hostname}.{zone}.c.{project}.internal",
        "id": numeric_id(f"{project}/{hostname}"),
        "name": hostname,
        "network-interfaces": [
            {
                "gateway": gateway,
                "ip": ip,
                "network": f"projects/{number}/networks/{spec.name}",
                "subnetmask": str(network.netmask),
            }
        ],
        "preempted": FALSE,  # TRUE once a preemption notice arrives (metadata_server.PREEMPTED_PATH)
        "service-accounts": {"default": account, email: account},
        "zone": f"projects/{number}/zones/{zone}",
    }
    if machine_type:
        instance["machine-type"] = f"projects/{number}/machineTypes/{machine_type}"
    project_tree: Tree = {"attributes": {}, "numeric-project-id": number, "project-id": project}
    return {"instance": instance, "project": project_tree}


def access_token_of(tree: Tree) -> str:
    """The access token a host's metadata tree (`instance_tree`) serves for its service account."""
    accounts = cast(Tree, cast(Tree, tree["instance"])["service-accounts"])
    return str(cast(Json, cast(Tree, accounts["default"])["token"]).value["access_token"])
