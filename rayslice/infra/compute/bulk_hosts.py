"""Every host of a bulk-mode slice in one ``instanceGroupManagers.createInstances`` call.

Why a dynamic provider: a slice whose cell runs its MIG in bulk mode with its hosts named
(`capacity_table.TARGET_FROM_ZERO` with ``mig_mode`` BULK: reservation-bound capacity) must get
all its hosts in one createInstances, sent while the MIG's target size is 0 (Compute Engine,
"About bulk mode": a bulk MIG adds hosts only while its target size is 0; rule
bulk-grows-from-zero), and each host needs its name and its reserved internal address
(``<slice>-w0``'s is the head's with ``head=slice``: the boot script's ``read_identity``).
pulumi-gcp 10.2 has two types that call createInstances: ``PerInstanceConfig``, one call per host,
which bulk mode refuses after the first; and ``BulkPerInstanceConfig``, which takes instance
names but no preserved internal addresses. `SliceHosts` sends the call itself, through
`rayslice.recovery.cloud.CloudClient` (as `rayslice.infra.tpu_vm.queued` does), with the body the
per-host configs would have sent, all at once.

The body (compute v1 discovery document, revision 20261106 as google-api-python-client 2.202.0
ships it): ``InstanceGroupManagersCreateInstancesRequest`` is ``{"instances": [PerInstanceConfig]}``;
each PerInstanceConfig has ``name`` ("The name of a per-instance configuration and its
corresponding instance") and ``preservedState.internalIPs``, a map keyed by network interface
name (``nic0``) of ``PreservedStatePreservedNetworkIp``: ``autoDelete`` NEVER (the address outlives
the host, as Pulumi declares it) and ``ipAddress.address``, the address's self link. The entries
come from `rayslice.recovery.scaling.host_config`, which the controller sends too.

Create: the call, then its operation, at most `ACCEPT_TIMEOUT_S`. The discovery document says
"The create instances operation is marked DONE if the createInstances request is successful. The
underlying actions take additional time", and a bulk MIG creates no host until the zone (here the
reservation) has them all, so ``pulumi up`` returns once the request is accepted, not when the
hosts exist (as for flex-start); ``rayslice status`` shows them. A MIG whose target size is
already above 0 with only these hosts (an earlier ``pulumi up`` sent the call and was interrupted
before it recorded it; or the controller recreated the slice) is taken as created: bulk mode would
refuse the call again.

Delete: bulk mode removes hosts by a resize to 0 ("About bulk mode"), so the delete resizes the
MIG to 0, waits until none of these hosts is left (the resize "is marked DONE when the resize
actions are scheduled even if the group has not yet added or deleted any instances", discovery,
instanceGroupManagers.resize), then deletes what is left of their per-instance configs (whether a
host's config goes with it is not settled: `rayslice.cloud.twin.compute`'s docstring), as the
per-host configs' ``remove_instance_on_destroy`` removed host and config. The MIG depends on the
addresses and this resource on the MIG, so ``pulumi destroy`` removes the hosts, then the MIG,
then the addresses (an address in use cannot be deleted). A MIG already gone: nothing to do.

Diff: any change of the MIG, the names or the addresses replaces the resource, deleting the old
one first (bulk mode takes the new hosts only from target size 0). Under Pulumi's mocks
(`rayslice preview`, the tests, the simulator) the provider is never run: the mocks apply the same
createInstances to the cloud twin (`rayslice.cloud.bodies.SLICE_HOSTS`).
"""

from __future__ import annotations

import time
from typing import Any

import pulumi
import pulumi.dynamic

from rayslice.cloud import bodies
from rayslice.errors import CloudError
from rayslice.infra.providers import ReplacingProvider, succeeded
from rayslice.infra.providers import client as _client
from rayslice.recovery.cloud import managed_instance_name

ACCEPT_TIMEOUT_S = 600.0  # how long `pulumi up` waits for Google to accept the request
DELETE_TIMEOUT_S = 1800.0  # how long a delete waits for the hosts to go (the MIG's delete timeout)
MIG = "instanceGroupManager"
# The inputs a change of which replaces the resource (every input Google receives).
_COMPARED = sorted(bodies.consumed(bodies.SLICE_HOSTS) | {"project", "zone"})


class SliceHostsProvider(ReplacingProvider):
    """Creates and deletes one slice's hosts in a bulk MIG (module docstring)."""

    compared = _COMPARED

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        request = bodies.request(bodies.SLICE_HOSTS, props)
        assert request is not None
        mig, client = str(props[MIG]), _client(props)
        wanted = [str(i["name"]) for i in request.body["instances"]]
        found = client.get_mig(mig)
        if found is None:
            raise CloudError(f"create the hosts of {mig}", 404, f"no instance group manager {mig}")
        if int(found.get("targetSize", 0)) > 0:
            there = {managed_instance_name(i) for i in client.list_managed_instances(mig)}
            if there <= set(wanted):  # an earlier call of ours was accepted (module docstring)
                return pulumi.dynamic.CreateResult(id_=_path(props), outs=dict(props))
            raise CloudError(
                f"create the hosts of {mig}",
                None,
                f"the MIG holds other hosts ({', '.join(sorted(there - set(wanted)))}): a bulk MIG "
                "takes hosts only while its target size is 0",
            )
        done = client.wait_zone_operation(
            client.create_instances(mig, list(request.body["instances"]), [mig]), ACCEPT_TIMEOUT_S
        )
        succeeded(done, f"createInstances in {mig}")
        return pulumi.dynamic.CreateResult(id_=_path(props), outs=dict(props))

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        mig, client = str(props[MIG]), _client(props)
        if client.get_mig(mig) is None:
            return
        hosts = {str(i["name"]) for i in props.get("instances") or []}
        done = client.wait_zone_operation(client.resize_mig(mig, 0, [mig]), DELETE_TIMEOUT_S)
        succeeded(done, f"resize {mig} to 0")
        deadline = time.monotonic() + DELETE_TIMEOUT_S
        while {managed_instance_name(i) for i in client.list_managed_instances(mig)} & hosts:
            if time.monotonic() >= deadline:
                raise CloudError(f"delete the hosts of {mig}", None, "they were still there after 30 min")
            client.sleep(client.poll_interval_s)
        left = [str(c["name"]) for c in client.list_per_instance_configs(mig) if c.get("name") in hosts]
        if left:
            done = client.wait_zone_operation(
                client.delete_per_instance_configs(mig, left, [mig]), DELETE_TIMEOUT_S
            )
            succeeded(done, f"deletePerInstanceConfigs in {mig}")


def _path(props: dict[str, Any]) -> str:
    return f"projects/{props['project']}/zones/{props['zone']}/instanceGroupManagers/{props[MIG]}/hosts"


class SliceHosts(pulumi.dynamic.Resource, module="compute", name="SliceHosts"):
    """One slice's hosts (type token `bodies.SLICE_HOSTS`): inputs ``project``, ``zone``,
    ``instanceGroupManager`` (the MIG's name) and ``instances`` (createInstances' entries)."""

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None):
        super().__init__(SliceHostsProvider(), name, props, opts)
