// The ML platform team's program: its own VPC, and a rayslice cluster on a TPU slice inside it.
// rayslice is a component package here (`pulumi package add`): the cluster takes the keys of a
// stack file as its inputs, checked by the same rules as in Python, and joins the team's VPC
// instead of creating one. See docs/use-as-a-library.md in the rayslice repository.
import * as gcp from "@pulumi/gcp";
import * as pulumi from "@pulumi/pulumi";
import * as rayslice from "@pulumi/rayslice";

const region = "us-east5";
const project = new pulumi.Config("gcp").require("project");

// The team's network, shared with its other workloads. Egress is the network owner's job: TPU
// hosts get no external IP and install their packages at boot, hence the Cloud NAT.
const vpc = new gcp.compute.Network("platform-vpc", {
    name: "platform-vpc",
    autoCreateSubnetworks: false,
    mtu: 8896,
});
const subnet = new gcp.compute.Subnetwork("platform-tpu", {
    name: "platform-tpu",
    network: vpc.id,
    region: region,
    ipCidrRange: "10.20.0.0/20",
    privateIpGoogleAccess: true,
});
const router = new gcp.compute.Router("platform-router", {
    name: "platform-router",
    network: vpc.id,
    region: region,
});
new gcp.compute.RouterNat("platform-nat", {
    name: "platform-nat",
    router: router.name,
    region: region,
    natIpAllocateOption: "AUTO_ONLY",
    sourceSubnetworkIpRangesToNat: "ALL_SUBNETWORKS_ALL_IP_RANGES",
});

// The same keys a stack file sets (docs/configuration.md); the network's names are outputs, so
// every host and firewall rule waits for the VPC and the subnet.
const cluster = new rayslice.TpuRayCluster("training", {
    name: "training",
    project: project,
    zone: "us-east5-b",
    acceleratorType: "v6e-16",
    capacity: "spot",
    labels: { team: "ml-platform" },
    existingNetwork: { network: vpc.name, subnetwork: subnet.name },
});

export const jobs_api_address = cluster.jobsApiAddress;
export const dashboard_tunnel_command = cluster.dashboardTunnelCommand;
