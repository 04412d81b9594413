"""The VPC the cluster's hosts live in: created with Cloud NAT, or an existing one by name.

Hosts get no external IP by default, yet every boot installs packages from an index; a created
network therefore comes with a Cloud Router and a Cloud NAT gateway for egress, and Private
Google Access so Secret Manager and Logging are reached without the NAT; for a GKE cluster that
rayslice creates, the subnet also carries the pods' and Services' secondary ranges. An existing
network is used as it is: providing egress (NAT, proxy or ``packageIndex``) is then its owner's
job. An existing network is named either by the spec (``network``, ``subnetwork``) or, from a
program that declares its own VPC, by `ExistingNetwork` (`TpuRayClusterArgs.network`), whose
names are Pulumi inputs so the cluster waits for that VPC. With an existing GKE cluster
(``gkeCluster``) no network is declared at all.

A created VPC has MTU 8896, the value MaxText's multislice guide recommends for DCN traffic
between slices (Compute Engine's default is 1460). An existing VPC keeps its MTU, and rayslice
cannot read it: pulumi-gcp 10.2's `getNetwork` does not return the MTU, and `rayslice preview`
calls no cloud API. With multislice on an existing VPC, the program therefore warns (in
`pulumi up` and in `rayslice preview`) with the command that shows the MTU and the one that
raises it.

An existing VPC also keeps its own firewall rules, which rayslice neither reads nor changes;
the default network's ``default-allow-internal`` opens every port to every VM in it. With
``rayAuth: none`` those rules may open Ray's ports to VMs that are not the cluster's, so the
program warns (`open_ports_warning`). The same rules may admit other VMs, on a shared VPC those of
other projects too, to the head's package cache, which fetches from a private index with its
credentials and serves what it fetched to whoever asks: the program warns about that as well
(`package_cache_warning`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from rayslice.catalog import region_of
from rayslice.names import CLIENT_PORT, DASHBOARD_PORT, GCS_PORT, PACKAGE_CACHE_PORT
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


def mtu_warning(network: str) -> str:
    """The warning for a multislice cluster on an existing VPC, whose MTU rayslice cannot read."""
    return (
        f"multislice on existing network {network!r}: rayslice cannot check its MTU. DCN traffic "
        f"between slices wants {MULTISLICE_MTU} (MaxText's recommendation; Compute Engine's default "
        f"is 1460). Check: `gcloud compute networks describe {network} --format='value(mtu)'`; "
        f"raise: `gcloud compute networks update {network} --mtu={MULTISLICE_MTU}` (every VM in "
        "the network must be stopped first), or leave `network` unset so rayslice creates one."
    )


def open_ports_warning(network: str) -> str:
    """The warning for rayAuth=none on an existing VPC, whose own firewall rules rayslice cannot see."""
    return (
        f"rayAuth=none on existing network {network!r}: the network's own firewall rules (the default "
        "network's default-allow-internal opens every port to every VM in it) may admit other VMs to "
        f"Ray's ports ({GCS_PORT} GCS, {DASHBOARD_PORT} dashboard and Jobs API, {CLIENT_PORT} client), "
        "and whoever reaches them can run code as root on every host. Check: `gcloud compute "
        f"firewall-rules list --filter=network:{network}`; set rayAuth=token, or leave `network` unset "
        "so rayslice creates one."
    )


def package_cache_warning(network: str) -> str:
    """The warning for a package cache that proxies a private index on an existing VPC."""
    return (
        f"packageCache with a private index (packageIndexCredentialsSecret) on existing network "
        f"{network!r}: the head's package cache (port {PACKAGE_CACHE_PORT}) fetches packages from the "
        "index with its credentials and serves them without asking for any, to every VM the "
        "network's own firewall rules admit (the default network's default-allow-internal admits "
        "every VM in it; a shared VPC, the VMs of other projects too). Check: `gcloud compute "
        f"firewall-rules list --filter=network:{network}`; set packageCache=false, or leave "
        "`network` unset so rayslice creates one."
    )


@dataclass(frozen=True)
class ExistingNetwork:
    """A VPC, and optionally a subnetwork of it, that rayslice uses as it is and never modifies.

    The names are Pulumi inputs: a program that declares its own VPC passes ``vpc.name`` and
    ``subnet.name``, so every host and firewall rule depends on them and is created after them.
    The spec's ``network`` and ``subnetwork`` keys say the same with plain names.
    """

    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str] | None = None


def existing_network(spec: ClusterSpec) -> ExistingNetwork | None:
    """The existing network the spec names, if any."""
    return None if spec.network is None else ExistingNetwork(spec.network, spec.subnetwork)


@dataclass(frozen=True)
class ClusterNetworkArgs:
    spec: ClusterSpec
    existing: ExistingNetwork | None  # None: create a VPC with Cloud NAT


class ClusterNetwork(pulumi.ComponentResource):
    """The network and subnetwork names every host and firewall rule refers to."""

    network: pulumi.Output[str]
    subnetwork: pulumi.Output[str | None]
    created: bool
    secondary_ranges: SecondaryRanges | None  # on a created subnet, for a created GKE cluster

    def __init__(self, name: str, args: ClusterNetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:infra:ClusterNetwork", name, None, opts)
        spec, existing = args.spec, args.existing
        self.created = existing is None
        self.secondary_ranges = secondary_ranges(spec) if self.created else None
        if existing is None:
            self.network, self.subnetwork = self._create(name, spec)
        else:
            self.network = pulumi.Output.from_input(existing.network)
            self.subnetwork = pulumi.Output.from_input(existing.subnetwork)
            if spec.multislice and spec.platform != "gke":
                # Once the name is known: a VPC the program declares has it only after creation.
                self.network.apply(lambda network: pulumi.log.warn(mtu_warning(network), resource=self))
            if spec.ray_auth == "none" and spec.platform != "gke":
                self.network.apply(
                    lambda network: pulumi.log.warn(open_ports_warning(network), resource=self)
                )
            private_index = spec.package_index_credentials_secret is not None
            if spec.package_cache and private_index and spec.platform != "gke":
                self.network.apply(
                    lambda network: pulumi.log.warn(package_cache_warning(network), resource=self)
                )
        # Declared as attributes above and repeated here so they appear in the component's
        # state (`pulumi stack --show-urns`) and other programs can depend on them.
        self.register_outputs({"network": self.network, "subnetwork": self.subnetwork})

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
