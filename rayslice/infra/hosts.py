"""What every VM-based platform shares (Cloud TPU API and Compute Engine): `VmSliceCluster`.

Both platforms run the same rendered boot script on ordinary VMs in the cluster's VPC, with the
same firewall, the same hosts' identity and token, the same optional CPU head VM, the same
recovery controller VM where the cluster recovers its slices, and the same outputs. Only the
slice differs: a `gcp.tpu.V2Vm` on ``tpu-vm``, a managed instance group on ``compute``. A
platform subclasses `VmSliceCluster` and supplies `make_slice` and the SSH commands of its
hosts; everything else is here, once.

Hosts and the head VM are created only after every grant exists and after
`IAM_PROPAGATION_WAIT` (see `ClusterIdentity`): a host that boots before its account may read
the token secret fails its first read. The controller VM waits for its own grants and for the
slices, so that it first looks at slices that exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import pulumi

from rayslice.errors import InvalidInput
from rayslice.infra import access
from rayslice.infra.compilation_cache import CompilationCacheBucket, CompilationCacheBucketArgs
from rayslice.infra.compilation_cache import wanted as compilation_cache_wanted
from rayslice.infra.controller_vm import ControllerVm, ControllerVmArgs
from rayslice.infra.firewall import ClusterFirewall, ClusterFirewallArgs
from rayslice.infra.head_vm import HeadVm, HostArgs
from rayslice.infra.identity import ClusterIdentity, ClusterIdentityArgs
from rayslice.infra.metadata import host_metadata
from rayslice.infra.network import ClusterNetwork
from rayslice.infra.record_bucket import cluster_record
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts import render
from rayslice.startup_scripts.locks import Lock


@dataclass(frozen=True, kw_only=True)
class SliceArgs(HostArgs):
    """What every slice component gets, whatever the platform: what every host gets, and where."""

    index: int
    # The head's IP: the head VM's (head=vm), or on compute with head=slice `<slice>-w0`'s address.
    head_address: pulumi.Input[str] | None = None

    def metadata(self) -> pulumi.Output[dict[str, str]]:
        """The metadata of this slice's hosts, once the head's address (if any) is known."""
        return pulumi.Output.all(self.head_address, self.compilation_cache, self.record).apply(
            lambda known: host_metadata(
                self.spec,
                self.script,
                self.index,
                head_address=known[0],
                token_secret=self.token_secret,
                compilation_cache=known[1],
                record=known[2],
            )
        )


class Slice(Protocol):
    """A slice component: its name and its hosts' internal IPs, worker 0 first."""

    slice_name: pulumi.Output[str]
    host_ips: pulumi.Output[list[str]]


@dataclass(frozen=True)
class VmSliceClusterArgs:
    spec: ClusterSpec
    network: ClusterNetwork
    # The stack's lock (`rayslice.startup_scripts.stack_locks`); None: hosts install the preset's.
    lock: Lock | None = None


class VmSliceCluster(pulumi.ComponentResource):
    """Firewall, identity, optional head VM and one slice per ``slices``, plus the outputs."""

    TYPE: ClassVar[str]

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

    def make_slice(self, name: str, args: SliceArgs, opts: pulumi.ResourceOptions) -> Slice:
        raise NotImplementedError

    def slice_ssh(self, spec: ClusterSpec, index: int, zone: str) -> str:
        """The command that opens a shell on worker 0 of slice `index`."""
        raise NotImplementedError

    def slice_dashboard_tunnel(self, spec: ClusterSpec, zone: str, head_ip: str) -> str:
        """The tunnel to the dashboard when the head runs on the slice (its first host)."""
        raise NotImplementedError

    def __init__(self, name: str, args: VmSliceClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(self.TYPE, name, None, opts)
        spec, network = args.spec, args.network
        if spec.zone is None:  # `spec.load` requires one unless the simulator asked it not to
            raise InvalidInput("a cloud cluster needs a zone: set rayslice:zone (or gcp:zone)")
        zone, project = spec.zone, spec.project
        child = pulumi.ResourceOptions(parent=self)
        firewall = ClusterFirewall(
            f"{name}-firewall", ClusterFirewallArgs(spec=spec, network=network.network), child
        )
        cache = (
            CompilationCacheBucket(f"{name}-compilation-cache", CompilationCacheBucketArgs(spec=spec), child)
            if compilation_cache_wanted(spec)
            else None
        )
        # The record outlives the cluster: its bucket is kept by `pulumi destroy` (or the stack names one).
        record = cluster_record(f"{name}-record", spec, child)
        identity = ClusterIdentity(
            f"{name}-identity",
            ClusterIdentityArgs(
                spec=spec,
                compilation_cache_bucket=cache.name if cache else None,
                record_bucket=record.bucket if record else None,
                record_prefix=record.prefix if record else None,
            ),
            child,
        )
        script = render(spec, lock=args.lock)
        # Hosts boot straight into the script: the rules that let them reach each other and
        # the grants that let them read the token (plus IAM's propagation wait) come first.
        # `ready` is created after every grant; the firewall component stands for its rules.
        host_deps: list[pulumi.Resource] = [firewall, identity.ready]

        host_args = HostArgs(
            spec=spec,
            script=script,
            network=network.network,
            subnetwork=network.subnetwork,
            service_account_email=identity.service_account_email,
            token_secret=identity.token_secret,
            compilation_cache=cache.location if cache else None,
            record=record.location if record else None,
            depends_on=host_deps,
        )
        head_vm = HeadVm(f"{name}-head", host_args, child) if spec.head == "vm" else None
        slices = [
            self.make_slice(
                f"{name}-slice-{index}",
                # vars(): the same fields, shallow-copied (the Pulumi outputs themselves, not copies).
                SliceArgs(
                    **vars(host_args), index=index, head_address=head_vm.internal_ip if head_vm else None
                ),
                child,
            )
            for index in range(spec.slices)
        ]
        if identity.controller_service_account_email is not None:
            # Each platform's slice is a component: depending on it waits for all it creates.
            created = [s for s in slices if isinstance(s, pulumi.Resource)]
            ControllerVm(
                f"{name}-controller",
                ControllerVmArgs(
                    spec=spec,
                    network=network.network,
                    subnetwork=network.subnetwork,
                    service_account_email=identity.controller_service_account_email,
                    record=record.location if record else None,
                    depends_on=[*host_deps, *created],
                ),
                child,
            )

        self.slice_names = pulumi.Output.all(*[s.slice_name for s in slices])
        self.slice_host_ips = pulumi.Output.all(*[s.host_ips for s in slices]).apply(
            lambda ips: {spec.slice_name(i): host_ips for i, host_ips in enumerate(ips)}
        )
        slice_ssh = {spec.slice_name(i): self.slice_ssh(spec, i, zone) for i in range(spec.slices)}
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
                lambda ip: self.slice_dashboard_tunnel(spec, zone, ip)
            )
            self.ssh_commands = pulumi.Output.from_input(slice_ssh)
        self.jobs_api_address = self.head_internal_ip.apply(access.jobs_api_address)
        self.local_jobs_api_address = pulumi.Output.from_input(access.local_jobs_api_address())
        self.ray_token_command = pulumi.Output.from_input(
            access.token_command(identity.token_secret, project) if identity.token_secret else None
        )
        self.service_account_email = identity.service_account_email
        self.exports = {
            "head_internal_ip": self.head_internal_ip,
            "jobs_api_address": self.jobs_api_address,
            "local_jobs_api_address": self.local_jobs_api_address,
            "dashboard_tunnel_command": self.dashboard_tunnel_command,
            "slice_names": self.slice_names,
            "slice_host_ips": self.slice_host_ips,
            "ssh_commands": self.ssh_commands,
            "ray_token_command": self.ray_token_command,
            "service_account_email": self.service_account_email,
            # Where hosts keep JAX's compilation cache (gs://...), for `rayslice fit --fill-cache`;
            # None where the stack has none.
            "compilation_cache": pulumi.Output.from_input(cache.location if cache else None),
            # The cluster's record (gs://BUCKET/clusters/NAME/RUN) for `rayslice history --record`
            # and RAYSLICE_RECORD; its bucket outlives the stack. None with recordBucket=none.
            "record": pulumi.Output.from_input(record.location if record else None),
        }
        # Repeated from the annotations: registered outputs are what `pulumi stack` shows.
        self.register_outputs(self.exports)
