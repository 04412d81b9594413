"""platform=compute under Pulumi's mocks: issue 9's acceptance, through `rayslice preview --output json`."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pulumi
import pytest

from rayslice import cli, names
from rayslice.infra.mocks import run_offline
from rayslice.infra.program import main
from rayslice.names import ATTR_SLICE_HOSTS, ATTR_SLICE_NAME

STACKS = Path(__file__).resolve().parents[3] / "infra"  # the project\'s example stacks
POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
MIG = "gcp:compute/instanceGroupManager:InstanceGroupManager"
PER_INSTANCE = "gcp:compute/perInstanceConfig:PerInstanceConfig"
SLEEP = "time:index/sleep:Sleep"


def _preview_json(capsys, *args: str) -> list[dict]:
    assert cli.main(["preview", *args, "--output", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _of(resources: list[dict], type_token: str) -> list[dict]:
    return [r for r in resources if r["type"] == type_token]


def test_v6e_16_example_acceptance(capsys):
    resources = _preview_json(capsys, "--stack-file", str(STACKS / "Pulumi.example-compute-v6e-16.yaml"))
    (policy,) = _of(resources, POLICY)
    assert policy["inputs"]["workloadPolicy"] == {"acceleratorTopology": "4x4", "type": "HIGH_THROUGHPUT"}
    (template,) = _of(resources, TEMPLATE)
    assert template["inputs"]["machineType"] == "ct6e-standard-4t"
    assert template["inputs"]["scheduling"]["provisioningModel"] == "SPOT"  # the example is spot
    # Google's "Request TPU Spot VMs" page stops preempted hosts (issue 19, defect 6).
    assert template["inputs"]["scheduling"]["instanceTerminationAction"] == "STOP"
    assert template["inputs"]["disks"][0]["diskType"] == "hyperdisk-balanced"
    (mig,) = _of(resources, MIG)
    # Target size 0: the 4 per-instance configs each add a host (createInstances), 4 in all.
    assert mig["inputs"]["targetSize"] == 0
    assert len(_of(resources, PER_INSTANCE)) == 4
    # No bulk mode with a Spot template (defect 2); the MIG does not repair single hosts (defect 6).
    assert "targetSizePolicies" not in mig["inputs"]
    assert mig["inputs"]["instanceLifecyclePolicy"] == {"defaultActionOnFailure": "DO_NOTHING"}
    assert all(not r["violations"] for r in resources)
    assert not _of(resources, "gcp:tpu/v2Vm:V2Vm")
    hosts = [*_of(resources, TEMPLATE), *_of(resources, "gcp:compute/instance:Instance")]
    assert hosts and all(
        not nic.get("accessConfigs") for h in hosts for nic in h["inputs"]["networkInterfaces"]
    )
    # No rule admits the whole address space (the controller VM's one rule denies it everything).
    for rule in _of(resources, "gcp:compute/firewall:Firewall"):
        if rule["inputs"].get("denies"):
            assert not rule["inputs"].get("allows") and rule["inputs"]["targetTags"] == [
                "jax-compute-v6e-16-controller"
            ]
            continue
        for cidr in rule["inputs"].get("sourceRanges", []):
            assert ipaddress.ip_network(cidr).prefixlen > 0, rule["name"]


def test_hosts_have_sequential_names_listed_in_metadata(capsys):
    resources = _preview_json(capsys, "--stack-file", str(STACKS / "Pulumi.example-compute-v6e-16.yaml"))
    names = sorted(r["inputs"]["name"] for r in _of(resources, PER_INSTANCE))  # registered in any order
    expected = [f"jax-compute-v6e-16-slice-0-w{i}" for i in range(4)]
    assert names == expected
    (template,) = _of(resources, TEMPLATE)
    metadata = template["inputs"]["metadata"]
    assert metadata[ATTR_SLICE_HOSTS] == ",".join(expected)
    assert metadata[ATTR_SLICE_NAME] == "jax-compute-v6e-16-slice-0"
    # The Cloud TPU API's own attributes are the API's to set, never rayslice's.
    assert not {"agent-worker-number", "worker-network-endpoints", "instance-id"} & set(metadata)
    for config in _of(resources, PER_INSTANCE):
        [ip] = config["inputs"]["preservedState"]["internalIps"]
        assert ip["interfaceName"] == "nic0" and ip["autoDelete"] == "NEVER"


def test_ironwood_example(capsys):
    resources = _preview_json(capsys, "--stack-file", str(STACKS / "Pulumi.example-compute-tpu7x-16.yaml"))
    (policy,) = _of(resources, POLICY)
    assert policy["inputs"]["workloadPolicy"]["acceleratorTopology"] == "2x2x2"
    (template,) = _of(resources, TEMPLATE)
    assert template["inputs"]["machineType"] == "tpu7x-standard-4t"
    assert template["inputs"]["disks"][0]["sourceImage"].endswith("/family/ubuntu-accel-2404-amd64-tpu-tpu7x")
    assert template["inputs"]["scheduling"]["provisioningModel"] == "STANDARD"
    assert "reservationAffinity" not in template["inputs"]
    (mig,) = _of(resources, MIG)
    assert (mig["inputs"]["targetSize"], len(_of(resources, PER_INSTANCE))) == (0, 2)
    assert "targetSizePolicies" not in mig["inputs"]  # bulk mode refuses STANDARD templates
    # On-demand too: Compute Engine recovers the slice whole; the MIG's REPAIR would recreate one host.
    assert mig["inputs"]["instanceLifecyclePolicy"] == {"defaultActionOnFailure": "DO_NOTHING"}


RESERVED = ["--set", "acceleratorType=v6e-16", "--set", "zone=us-east5-b", "--set", "capacity=reserved"]


def test_reserved_capacity_consumes_the_named_reservation(capsys):
    """Issue 19, defect 3: the reservation-bound model with a specific reservation, and DELETE."""
    resources = _preview_json(capsys, *RESERVED, "--set", "reservation=team-v6e")
    (template,) = _of(resources, TEMPLATE)
    assert template["inputs"]["reservationAffinity"] == {
        "type": "SPECIFIC_RESERVATION",
        "specificReservation": {
            "key": "compute.googleapis.com/reservation-name",
            "values": ["team-v6e"],
        },
    }
    assert template["inputs"]["scheduling"]["provisioningModel"] == "RESERVATION_BOUND"
    assert template["inputs"]["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert all(not r["violations"] for r in resources)


def test_reserved_capacity_without_a_reservation_name_is_refused(capsys):
    """The spec refuses it before the program runs (a RESERVATION_BOUND MIG consumes one named
    reservation); the rule Google's page sets is tested on the bodies in tests/cloud."""
    assert cli.main(["preview", *RESERVED, "--output", "json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "capacity=reserved on compute needs reservation=<name" in captured.err


def test_v5p_boots_from_balanced_persistent_disk(capsys):
    """Issue 19, defect 7: Google lists Balanced Persistent Disk, not Hyperdisk, for v5p."""
    resources = _preview_json(capsys, "--set", "acceleratorType=v5p-16", "--set", "zone=us-east5-a")
    (template,) = _of(resources, TEMPLATE)
    assert template["inputs"]["machineType"].startswith("ct5p-")
    assert template["inputs"]["disks"][0]["diskType"] == "pd-balanced"
    assert all(not r["violations"] for r in resources)


def test_pulumi_keeps_the_target_size_the_per_instance_configs_raised():
    """Without ignoreChanges, the next `pulumi up` would shrink the MIG back to 0 hosts."""
    run = run_offline(
        lambda: main().exports, {"rayslice:acceleratorType": "v6e-16", "rayslice:zone": "us-east5-b"}
    )
    (mig,) = run.of_type(MIG)
    assert mig.ignore_changes == ("targetSize",)


def test_single_host_slice_is_a_one_instance_mig(capsys):
    resources = _preview_json(capsys, "--set", "acceleratorType=v6e-4", "--set", "zone=us-east5-b")
    (mig,) = _of(resources, MIG)
    assert mig["inputs"]["targetSize"] == 0  # its one per-instance config adds the host
    assert [r["inputs"]["name"] for r in _of(resources, PER_INSTANCE)] == ["rayslice-slice-0-w0"]


def test_outputs_use_compute_engine_ssh():
    config = {"rayslice:acceleratorType": "v6e-16", "rayslice:zone": "us-east5-b", "gcp:project": "team-p1"}
    out = run_offline(lambda: main().exports, config).value
    assert out["ssh_commands"] == {
        "rayslice-slice-0": "gcloud compute ssh rayslice-slice-0-w0 --zone=us-east5-b --project=team-p1 "
        "--tunnel-through-iap"
    }
    [ips] = out["slice_host_ips"].values()
    assert len(ips) == 4 and out["head_internal_ip"] == ips[0]
    assert out["dashboard_tunnel_command"].startswith("gcloud compute ssh rayslice-slice-0-w0 ")


def test_hosts_wait_for_grants_and_iam_propagation():
    run = run_offline(
        lambda: main().exports, {"rayslice:acceleratorType": "v6e-16", "rayslice:zone": "us-east5-b"}
    )
    (sleep,) = run.of_type(SLEEP)
    assert sleep.inputs["createDuration"] == "60s"


def test_config_change_rolls_the_whole_slice_keeping_names(capsys):
    resources = _preview_json(capsys, "--set", "acceleratorType=v6e-16", "--set", "zone=us-east5-b")
    (mig,) = _of(resources, MIG)
    assert mig["inputs"]["updatePolicy"] == {
        "maxSurgeFixed": 0,
        "maxUnavailableFixed": 4,
        "minimalAction": "REPLACE",
        "replacementMethod": "RECREATE",
        "type": "PROACTIVE",
    }
    assert mig["customTimeouts"] == {"create": "60m", "update": "60m", "delete": "30m"}
    (template,) = _of(resources, TEMPLATE)
    assert template["replaceOnChanges"] == ["metadata"]


def test_created_vpc_has_the_multislice_mtu(capsys):
    resources = _preview_json(capsys, "--set", "acceleratorType=v6e-16", "--set", "zone=us-east5-b")
    (vpc,) = _of(resources, "gcp:compute/network:Network")
    assert vpc["inputs"]["mtu"] == 8896


@pytest.fixture
def pulumi_warnings(monkeypatch) -> list[str]:
    """What the program passes to `pulumi.log.warn`, in order (the preview shows these to the user)."""
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, resource=None, **_: warnings.append(message))
    return warnings


def test_multislice_on_an_existing_vpc_warns_about_its_mtu(pulumi_warnings):
    config = {
        "rayslice:acceleratorType": "v6e-16",
        "rayslice:zone": "us-east5-b",
        "rayslice:slices": "2",
        "rayslice:network": "shared-vpc",
        "rayslice:subnetwork": "tpu-subnet",
    }
    run = run_offline(lambda: main().exports, config)
    assert not run.of_type("gcp:compute/network:Network")  # an existing VPC is never modified
    [warning] = [w for w in pulumi_warnings if "MTU" in w]
    assert "gcloud compute networks update shared-vpc --mtu=8896" in warning


@pytest.mark.parametrize(
    "ray_auth, network, warned",
    [("none", "shared-vpc", True), ("token", "shared-vpc", False), ("none", None, False)],
)
def test_rayauth_none_on_an_existing_vpc_warns_that_its_rules_may_open_rays_ports(
    pulumi_warnings, ray_auth, network, warned
):
    config = {
        "rayslice:acceleratorType": "v6e-4",
        "rayslice:zone": "us-east5-b",
        "rayslice:rayAuth": ray_auth,
    }
    if network is not None:
        config["rayslice:network"] = network
    run_offline(lambda: main().exports, config)
    found = [w for w in pulumi_warnings if "rayAuth=none" in w]
    assert len(found) == int(warned)
    if warned:
        assert "'shared-vpc'" in found[0] and "default-allow-internal" in found[0]
        assert "gcloud compute firewall-rules list --filter=network:shared-vpc" in found[0]
        assert all(
            str(port) in found[0] for port in (names.GCS_PORT, names.DASHBOARD_PORT, names.CLIENT_PORT)
        )


def test_single_slice_on_an_existing_vpc_does_not_warn(pulumi_warnings):
    config = {
        "rayslice:acceleratorType": "v6e-16",
        "rayslice:zone": "us-east5-b",
        "rayslice:network": "shared-vpc",
    }
    run_offline(lambda: main().exports, config)
    assert not [w for w in pulumi_warnings if "MTU" in w]
