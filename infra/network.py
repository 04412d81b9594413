"""The VPC the cluster's hosts live in: created with Cloud NAT, or an existing one by name.

Hosts get no external IP by default, yet every boot installs packages from an index; a created
network therefore comes with a Cloud Router and a Cloud NAT gateway for egress, and Private
Google Access so Secret Manager and Logging are reached without the NAT. An existing network
is used as it is: providing egress (NAT, proxy or ``packageIndex``) is then its owner's job.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from rayslice.spec import ClusterSpec

# Private range of a created subnet: 4,096 addresses, far more than the largest slice's hosts.
SUBNET_CIDR = "10.128.0.0/20"


def region_of(zone: str) -> str:
    """``us-central1-b`` -> ``us-central1``."""
    return zone.rsplit("-", 1)[0]


@dataclass(frozen=True)
class ClusterNetworkArgs:
    spec: ClusterSpec


class ClusterNetwork(pulumi.ComponentResource):
    """The network and subnetwork names every host and firewall rule refers to."""

    network: pulumi.Output[str]
    subnetwork: pulumi.Output[str | None]
    created: bool

    def __init__(self, name: str, args: ClusterNetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:infra:ClusterNetwork", name, None, opts)
        spec = args.spec
        self.created = spec.network is None
        if self.created:
            self.network, self.subnetwork = self._create(name, spec)
        else:
            self.network = pulumi.Output.from_input(spec.network)
            self.subnetwork = pulumi.Output.from_input(spec.subnetwork)
        # Declared as attributes above and repeated here so they appear in the component's
        # state (`pulumi stack --show-urns`) and other programs can depend on them.
        self.register_outputs({"network": self.network, "subnetwork": self.subnetwork})

    def _create(self, name: str, spec: ClusterSpec) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
        assert spec.zone is not None
        region = region_of(spec.zone)
        child = pulumi.ResourceOptions(parent=self)
        vpc = gcp.compute.Network(
            f"{name}-vpc", name=f"{spec.name}-net", project=spec.project,
            auto_create_subnetworks=False, routing_mode="REGIONAL",
            description=f"rayslice cluster {spec.name}", opts=child,
        )
        in_vpc = pulumi.ResourceOptions(parent=vpc)
        subnet = gcp.compute.Subnetwork(
            f"{name}-subnet", name=f"{spec.name}-subnet", project=spec.project, region=region,
            network=vpc.name, ip_cidr_range=SUBNET_CIDR, private_ip_google_access=True, opts=in_vpc,
        )
        router = gcp.compute.Router(
            f"{name}-router", name=f"{spec.name}-router", project=spec.project, region=region,
            network=vpc.name, opts=in_vpc,
        )
        gcp.compute.RouterNat(
            f"{name}-nat", name=f"{spec.name}-nat", project=spec.project, region=region,
            router=router.name, nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
            log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
            opts=pulumi.ResourceOptions(parent=router),
        )
        return vpc.name, subnet.name
