"""`TpuRayCluster`: the whole cluster from one `ClusterSpec`, importable by any Pulumi program.

    from rayslice import spec
    from rayslice.infra import TpuRayCluster, TpuRayClusterArgs

    cluster = TpuRayCluster("ml", TpuRayClusterArgs(spec=spec.load({"acceleratorType": "v6e-16", "zone": "us-east5-b"})))
    pulumi.export("jobs", cluster.jobs_api_address)

On the TPU VM API it builds the network, the firewall, the hosts' identity, the CPU head VM
(``head=vm``) and one `TpuSlice` per slice, all rendered from the same boot script. With
``platform=gke`` it builds the network (none for an existing ``gkeCluster``, which has its own)
and hands the rest to `rayslice.infra.gke`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from rayslice.infra import access
from rayslice.infra.firewall import ClusterFirewall, ClusterFirewallArgs
from rayslice.infra.head_vm import HeadVm, HeadVmArgs
from rayslice.infra.identity import ClusterIdentity, ClusterIdentityArgs
from rayslice.infra.network import ClusterNetwork, ClusterNetworkArgs
from rayslice.infra.tpu_slice import TpuSlice, TpuSliceArgs
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts import render


@dataclass(frozen=True)
class TpuRayClusterArgs:
    spec: ClusterSpec  # validated: build it with `rayslice.spec.load`


class TpuRayCluster(pulumi.ComponentResource):
    """A Ray cluster on TPU slices, with the outputs a user needs to reach it.

    `exports` maps output names to values; `infra/__main__.py` exports exactly these and
    `register_outputs` records them. On TPU VMs they are the annotated attributes below; with
    platform=gke they are the GKE component's `exports`.
    """

    head_internal_ip: pulumi.Output[str]
    jobs_api_address: pulumi.Output[str]
    local_jobs_api_address: pulumi.Output[str]
    dashboard_tunnel_command: pulumi.Output[str]
    slice_names: pulumi.Output[list[str]]
    slice_host_ips: pulumi.Output[dict[str, list[str]]]
    ssh_commands: pulumi.Output[dict[str, str]]
    ray_token_command: pulumi.Output[str | None]
    service_account_email: pulumi.Output[str]
    exports: dict[str, Any]

    def __init__(self, name: str, args: TpuRayClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:infra:TpuRayCluster", name, None, opts)
        spec = args.spec
        self.network = (
            None
            if spec.gke_cluster
            else ClusterNetwork(
                f"{name}-network", ClusterNetworkArgs(spec=spec), pulumi.ResourceOptions(parent=self)
            )
        )
        if spec.platform == "gke":
            self.exports = self._gke(name, spec)
        else:
            self.exports = self._tpu_vm(name, spec)
        self.register_outputs(self.exports)

    def _gke(self, name: str, spec: ClusterSpec) -> dict[str, Any]:
        try:
            from rayslice.infra.gke import GkeTpuCluster, GkeTpuClusterArgs
        except ModuleNotFoundError as exc:
            if exc.name != "rayslice.infra.gke":
                raise
            raise NotImplementedError(
                "platform=gke needs rayslice.infra.gke, which this rayslice lacks"
            ) from None
        self.gke = GkeTpuCluster(
            f"{name}-gke",
            GkeTpuClusterArgs(spec=spec, network=self.network),
            pulumi.ResourceOptions(parent=self),
        )
        return dict(self.gke.exports)

    def _tpu_vm(self, name: str, spec: ClusterSpec) -> dict[str, Any]:
        assert self.network is not None, "gkeCluster is refused for platform=tpu-vm by the spec"
        child = pulumi.ResourceOptions(parent=self)
        assert spec.zone is not None
        zone, project = spec.zone, spec.project
        firewall = ClusterFirewall(
            f"{name}-firewall", ClusterFirewallArgs(spec=spec, network=self.network.network), child
        )
        identity = ClusterIdentity(f"{name}-identity", ClusterIdentityArgs(spec=spec), child)
        script = render(spec)
        # Hosts boot straight into the script: the rules that let them reach each other and
        # the grants that let them read the token must exist first.
        host_opts = pulumi.ResourceOptions(parent=self, depends_on=[firewall, identity])

        head_vm = None
        if spec.head == "vm":
            head_vm = HeadVm(
                f"{name}-head",
                HeadVmArgs(
                    spec=spec,
                    script=script,
                    network=self.network.network,
                    subnetwork=self.network.subnetwork,
                    service_account_email=identity.service_account_email,
                    token_secret=identity.token_secret,
                ),
                host_opts,
            )
        slices = [
            TpuSlice(
                f"{name}-slice-{index}",
                TpuSliceArgs(
                    spec=spec,
                    index=index,
                    script=script,
                    network=self.network.network,
                    subnetwork=self.network.subnetwork,
                    service_account_email=identity.service_account_email,
                    token_secret=identity.token_secret,
                    head_address=head_vm.internal_ip if head_vm else None,
                ),
                host_opts,
            )
            for index in range(spec.slices)
        ]

        self.slice_names = pulumi.Output.all(*[s.slice_name for s in slices])
        self.slice_host_ips = pulumi.Output.all(*[s.host_ips for s in slices]).apply(
            lambda ips: {spec.slice_name(i): host_ips for i, host_ips in enumerate(ips)}
        )
        slice_ssh = {
            spec.slice_name(i): access.tpu_ssh(spec.slice_name(i), zone, project) for i in range(spec.slices)
        }
        if head_vm is not None:
            self.head_internal_ip = head_vm.internal_ip
            self.dashboard_tunnel_command = pulumi.Output.all(
                head_vm.instance_name, head_vm.internal_ip
            ).apply(lambda v: access.vm_dashboard_tunnel(v[0], zone, project, v[1]))
            self.ssh_commands = head_vm.instance_name.apply(
                lambda vm_name: {vm_name: access.vm_ssh(vm_name, zone, project), **slice_ssh}
            )
        else:
            self.head_internal_ip = slices[0].host_ips.apply(lambda ips: ips[0])
            self.dashboard_tunnel_command = self.head_internal_ip.apply(
                lambda ip: access.tpu_dashboard_tunnel(spec.slice_name(0), zone, project, ip)
            )
            self.ssh_commands = pulumi.Output.from_input(slice_ssh)
        self.jobs_api_address = self.head_internal_ip.apply(access.jobs_api_address)
        self.local_jobs_api_address = pulumi.Output.from_input(access.local_jobs_api_address())
        self.ray_token_command = pulumi.Output.from_input(
            access.token_command(identity.token_secret, project) if identity.token_secret else None
        )
        self.service_account_email = identity.service_account_email
        return {
            "head_internal_ip": self.head_internal_ip,
            "jobs_api_address": self.jobs_api_address,
            "local_jobs_api_address": self.local_jobs_api_address,
            "dashboard_tunnel_command": self.dashboard_tunnel_command,
            "slice_names": self.slice_names,
            "slice_host_ips": self.slice_host_ips,
            "ssh_commands": self.ssh_commands,
            "ray_token_command": self.ray_token_command,
            "service_account_email": self.service_account_email,
        }
