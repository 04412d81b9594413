"""The VPC the cluster's hosts live in: created with Cloud NAT, or an existing one by name.

Hosts get no external IP by default, yet every boot installs packages from an index; a created
network therefore comes with a Cloud Router and a Cloud NAT gateway for egress, and Private
Google Access so Secret Manager and Logging are reached without the NAT; for a GKE cluster that
rayslice creates, the subnet also carries the pods' and Services' secondary ranges. An existing
network is used as it is: providing egress (NAT, proxy or ``packageIndex``) is then its owner's
job. With an existing GKE cluster (``gkeCluster``) no network is declared at all.

A created VPC has MTU 8896, the value MaxText's multislice guide recommends for DCN traffic
between slices (Compute Engine's default is 1460). An existing VPC keeps its MTU; with
multislice, `ClusterNetwork` reads it through the API at deploy time and warns when it is lower.
An offline preview cannot read it (the mocks answer Compute Engine's default), so the warning
there says what to check rather than what is.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from rayslice.spec import ClusterSpec

# Private range of a created subnet: 4,096 addresses, far more than the largest slice's hosts.
SUBNET_CIDR = "10.128.0.0/20"
# A created GKE cluster is VPC-native: pods and Services get addresses from two secondary
# ranges of the created subnet, sized like GKE's defaults (/14: 1,024 nodes of 110 pods;
# /20: 4,096 Services) and apart from SUBNET_CIDR.
PODS_CIDR = "10.16.0.0/14"
SERVICES_CIDR = "10.20.0.0/20"
# MTU of a created VPC: MaxText's multislice guide recommends 8896 for DCN traffic.
MULTISLICE_MTU = 8896


@dataclass(frozen=True)
class IpRange:
    name: str
    cidr: str


@dataclass(frozen=True)
class SecondaryRanges:
    """The subnet's ranges for a GKE cluster's pods and Services."""

    pods: IpRange
    services: IpRange


def secondary_ranges(spec: ClusterSpec) -> SecondaryRanges | None:
    """The secondary ranges a created subnet needs: only a GKE cluster that rayslice creates uses them."""
    if spec.platform != "gke" or spec.gke_cluster is not None:
        return None
    return SecondaryRanges(
        pods=IpRange(f"{spec.name}-pods", PODS_CIDR), services=IpRange(f"{spec.name}-services", SERVICES_CIDR)
    )


def mtu_warning(network: str, mtu: int | None) -> str | None:
    """The warning for a multislice cluster on an existing VPC whose MTU is below 8896."""
    if mtu is not None and mtu >= MULTISLICE_MTU:
        return None
    shown = "unknown" if mtu is None else str(mtu)
    return (
        f"network {network!r} has MTU {shown}; multislice DCN traffic between slices is slower "
        f"below {MULTISLICE_MTU} (MaxText's recommendation). Raise it with `gcloud compute "
        f"networks update {network} --mtu={MULTISLICE_MTU}` (all VMs in the network must be "
        "stopped), or let rayslice create the network (leave `network` unset)."
    )


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
    secondary_ranges: SecondaryRanges | None  # on a created subnet, for a created GKE cluster

    def __init__(self, name: str, args: ClusterNetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:infra:ClusterNetwork", name, None, opts)
        spec = args.spec
        self.created = spec.network is None
        self.secondary_ranges = secondary_ranges(spec) if self.created else None
        if spec.network is None:
            self.network, self.subnetwork = self._create(name, spec)
        else:
            self.network = pulumi.Output.from_input(spec.network)
            self.subnetwork = pulumi.Output.from_input(spec.subnetwork)
            if spec.multislice and spec.platform != "gke":
                self._check_mtu(spec.network, spec.project)
        # Declared as attributes above and repeated here so they appear in the component's
        # state (`pulumi stack --show-urns`) and other programs can depend on them.
        self.register_outputs({"network": self.network, "subnetwork": self.subnetwork})

    def _check_mtu(self, network: str, project: str | None) -> None:
        def warn(mtu: int | None) -> None:
            if message := mtu_warning(network, mtu):
                pulumi.log.warn(message, resource=self)

        existing = gcp.compute.get_network_output(name=network, project=project)
        existing.mtu.apply(warn)

    def _create(self, name: str, spec: ClusterSpec) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
        assert spec.zone is not None
        region = region_of(spec.zone)
        child = pulumi.ResourceOptions(parent=self)
        vpc = gcp.compute.Network(
            f"{name}-vpc",
            name=f"{spec.name}-net",
            project=spec.project,
            auto_create_subnetworks=False,
            routing_mode="REGIONAL",
            mtu=MULTISLICE_MTU,
            description=f"rayslice cluster {spec.name}",
            opts=child,
        )
        in_vpc = pulumi.ResourceOptions(parent=vpc)
        subnet = gcp.compute.Subnetwork(
            f"{name}-subnet",
            name=f"{spec.name}-subnet",
            project=spec.project,
            region=region,
            network=vpc.name,
            ip_cidr_range=SUBNET_CIDR,
            private_ip_google_access=True,
            secondary_ip_ranges=[
                gcp.compute.SubnetworkSecondaryIpRangeArgs(range_name=r.name, ip_cidr_range=r.cidr)
                for r in (self.secondary_ranges.pods, self.secondary_ranges.services)
            ]
            if self.secondary_ranges
            else None,
            opts=in_vpc,
        )
        router = gcp.compute.Router(
            f"{name}-router",
            name=f"{spec.name}-router",
            project=spec.project,
            region=region,
            network=vpc.name,
            opts=in_vpc,
        )
        gcp.compute.RouterNat(
            f"{name}-nat",
            name=f"{spec.name}-nat",
            project=spec.project,
            region=region,
            router=router.name,
            nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
            log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
            opts=pulumi.ResourceOptions(parent=router),
        )
        return vpc.name, subnet.name
