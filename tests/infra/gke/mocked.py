"""The GKE program under Pulumi's mocks, shared by the GKE tests: run it, record what it
registered, fake the few outputs it reads back (a cluster's endpoints, an account's email, an
existing cluster's settings).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pulumi

from rayslice import spec as specs
from rayslice.infra import TpuRayCluster, TpuRayClusterArgs
from rayslice.infra.mocks import install_mocks

CLUSTER = "gcp:container/cluster:Cluster"
SUBNET = "gcp:compute/subnetwork:Subnetwork"
NETWORK_TYPES = (
    "gcp:compute/network:Network",
    SUBNET,
    "gcp:compute/router:Router",
    "gcp:compute/routerNat:RouterNat",
)
NODE_POOL = "gcp:container/nodePool:NodePool"
POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"
RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
ACCOUNT = "gcp:serviceaccount/account:Account"
IAM_MEMBER = "gcp:projects/iAMMember:IAMMember"
SLEEP = "time:index/sleep:Sleep"
RELEASE = "kubernetes:helm.sh/v3:Release"
SERVICE = "kubernetes:core/v1:Service"
NAMESPACE = "kubernetes:core/v1:Namespace"
SERVICE_ACCOUNT = "kubernetes:core/v1:ServiceAccount"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"

ZONES = {"v6e": "us-east5-b", "v5p": "us-east5-a", "tpu7x": "us-central1-c"}


class Recorder(pulumi.runtime.Mocks):
    """Records every registered resource; fakes the few outputs the program reads back."""

    def __init__(self, existing: dict[str, Any] | None = None) -> None:
        self.resources: dict[str, list[pulumi.runtime.MockResourceArgs]] = defaultdict(list)
        self.kubeconfig: pulumi.Output[str] | None = None  # the component's, after `deploy`
        self.exports: dict[str, Any] = {}
        # What getCluster reports for an existing gkeCluster: by default one fit for rayslice.
        self.existing = {
            "workloadIdentityConfigs": [{"workloadPool": "mock-project.svc.id.goog"}],
            "datapathProvider": "ADVANCED_DATAPATH",
            **(existing or {}),
        }

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources[args.typ].append(args)
        outputs = dict(args.inputs)
        if args.typ == CLUSTER:
            outputs.update(endpoint="203.0.113.10", masterAuth={"clusterCaCertificate": "Q0E="})
            outputs["privateClusterConfig"] = {
                **args.inputs["privateClusterConfig"],
                "privateEndpoint": "10.0.0.2",
            }
        if args.typ == ACCOUNT:
            outputs["email"] = f"{args.inputs['accountId']}@mock-project.iam.gserviceaccount.com"
            outputs["member"] = f"serviceAccount:{outputs['email']}"
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        if args.token == "gcp:organizations/getClientConfig:getClientConfig":
            return {"project": "mock-project"}
        if args.token == "gcp:container/getCluster:getCluster":
            return {
                "endpoint": "203.0.113.20",
                "masterAuths": [{"clusterCaCertificate": "Q0E="}],
                **self.existing,
            }
        raise AssertionError(f"unexpected call {args.token}")


def deploy(cluster_spec: specs.ClusterSpec, recorder: Recorder | None = None) -> Recorder:
    """Run the cluster component under mocks; return what it registered."""
    recorder = recorder or Recorder()
    install_mocks(recorder, project="rayslice", stack="test")

    @pulumi.runtime.test
    def program() -> pulumi.Output:
        component = TpuRayCluster("gke", TpuRayClusterArgs(spec=cluster_spec)).platform
        recorder.kubeconfig = component.kubeconfig
        recorder.exports = component.exports
        return pulumi.Output.all(component.kubeconfig, *[p.name for p in component.gke.tpu_pools])

    program()
    return recorder


def resolved(output: Any) -> Any:
    """The value of an Output the program produced (the mocks have resolved it by now)."""
    box: list[Any] = []

    @pulumi.runtime.test
    def read() -> pulumi.Output:
        return pulumi.Output.from_input(output).apply(box.append)

    read()
    return box[0]


def gke_spec(accelerator: str, **extra: Any) -> specs.ClusterSpec:
    zone = ZONES[accelerator.split("-")[0]]
    return specs.load(
        {"platform": "gke", "acceleratorType": accelerator, "zone": zone, "name": "demo", **extra}
    )
