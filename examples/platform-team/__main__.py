"""The ML platform team's program: its own VPC, and a rayslice cluster on a TPU slice inside it.

rayslice is a library here: the cluster's spec is built in Python rather than read from stack
config, and the cluster joins the team's VPC instead of creating one. Passing the VPC's names as
Pulumi outputs (`ExistingNetwork(vpc.name, subnet.name)`) makes every host and firewall rule
wait for them. See docs/use-as-a-library.md in the rayslice repository.
"""

import pulumi
import pulumi_gcp as gcp

from rayslice import spec
from rayslice.infra import ExistingNetwork, TpuRayCluster, TpuRayClusterArgs

REGION = "us-east5"
project = pulumi.Config("gcp").require("project")

# The team's network, shared with its other workloads. Egress is the network owner's job: TPU
# hosts get no external IP and install their packages at boot, hence the Cloud NAT. MTU 8896 is
# what multislice DCN traffic wants (rayslice warns about an existing VPC it cannot check).
vpc = gcp.compute.Network("platform-vpc", name="platform-vpc", auto_create_subnetworks=False, mtu=8896)
subnet = gcp.compute.Subnetwork(
    "platform-tpu",
    name="platform-tpu",
    network=vpc.id,
    region=REGION,
    ip_cidr_range="10.20.0.0/20",
    private_ip_google_access=True,
)
router = gcp.compute.Router("platform-router", name="platform-router", network=vpc.id, region=REGION)
gcp.compute.RouterNat(
    "platform-nat",
    name="platform-nat",
    router=router.name,
    region=REGION,
    nat_ip_allocate_option="AUTO_ONLY",
    source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
)

# The same keys a stack file would set (docs/configuration.md), validated the same way.
training = spec.load(
    {
        "name": "training",
        "project": project,
        "zone": f"{REGION}-b",
        "acceleratorType": "v6e-16",
        "capacity": "spot",
        "labels": {"team": "ml-platform"},
    }
)
cluster = TpuRayCluster(
    "training", TpuRayClusterArgs(spec=training, network=ExistingNetwork(vpc.name, subnet.name))
)
pulumi.export("jobs_api_address", cluster.jobs_api_address)
pulumi.export("dashboard_tunnel_command", cluster.exports["dashboard_tunnel_command"])
