"""The NetworkPolicies of a GKE Ray cluster, evaluated with Kubernetes' rules: who reaches which
port of which Ray pod, and that a pod outside the cluster's namespace cannot get in by copying
the Ray pods' labels.

The evaluator follows the NetworkPolicy API (networking.k8s.io/v1, the field descriptions in
tests/fixtures/kubernetes-1.31/_definitions.json): a pod selected by no Ingress policy admits
everything; a selected pod admits what any rule of any selecting policy admits; the peers of a
rule are ORed; within one peer, namespaceSelector and podSelector are ANDed; a podSelector
without namespaceSelector means the policy's own namespace; label selectors AND their
matchLabels and matchExpressions, and an empty selector selects everything. The tests at the
end show the evaluator tells these cases apart, so a policy that got them wrong would fail.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from rayslice.infra.gke import kuberay
from tests.infra.gke.mocked import gke_spec

NS = "rayslice-demo"  # the cluster's namespace, written out
# The labels KubeRay 1.7 puts on the pods of RayCluster "demo" (and of another RayCluster).
HEAD = {"ray.io/cluster": "demo", "ray.io/node-type": "head", "ray.io/group": "headgroup"}
WORKER = {"ray.io/cluster": "demo", "ray.io/node-type": "worker", "ray.io/group": "tpu-v6e-16"}
OTHER_RAY = {"ray.io/cluster": "other", "ray.io/node-type": "worker", "ray.io/group": "cpu"}
OTHER_APP = {"app": "web"}
METADATA_NAME = "kubernetes.io/metadata.name"


def namespace_labels(name: str, labels: dict[str, str] | None = None) -> dict[str, str]:
    """A namespace's labels as the API server stores them: whatever its owner set, with
    kubernetes.io/metadata.name overwritten by the namespace's name."""
    return {**(labels or {}), METADATA_NAME: name}


def _holds(requirement: dict, labels: dict[str, str]) -> bool:
    key, operator, values = requirement["key"], requirement["operator"], requirement.get("values", [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":  # an absent key satisfies NotIn
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"unknown operator {operator!r}")


def selects(selector: dict, labels: dict[str, str]) -> bool:
    """A LabelSelector: matchLabels and matchExpressions ANDed; ``{}`` selects everything."""
    assert set(selector) <= {"matchLabels", "matchExpressions"}, selector
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()) and all(
        _holds(r, labels) for r in selector.get("matchExpressions", [])
    )


def peer_admits(peer: dict, policy_namespace: str, source: dict) -> bool:
    """One NetworkPolicyPeer: an ipBlock alone, or selectors that are ANDed with each other."""
    assert peer and set(peer) <= {"podSelector", "namespaceSelector", "ipBlock"}, peer
    if "ipBlock" in peer:
        assert set(peer) == {"ipBlock"}, "the API refuses an ipBlock beside a selector"
        block = peer["ipBlock"]
        address = ipaddress.ip_address(source["ip"])
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", [])
        )
    if "namespace" not in source:  # an address outside the cluster is no pod
        return False
    if "namespaceSelector" in peer:
        namespace_ok = selects(peer["namespaceSelector"], source["namespace_labels"])
    else:  # podSelector alone: the policy's own namespace
        namespace_ok = source["namespace"] == policy_namespace
    pods_ok = selects(peer.get("podSelector", {}), source["labels"])
    return namespace_ok and pods_ok


def admitted(policies: list[dict], target: dict, source: dict, port: int) -> bool:
    """Whether `source` may open a TCP connection to `target` (a pod) on `port`."""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == target["namespace"]
        and "Ingress" in p["spec"]["policyTypes"]
        and selects(p["spec"]["podSelector"], target["labels"])
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is not None and not any(p["port"] == port and p["protocol"] == "TCP" for p in ports):
                continue
            peers = rule.get("from")
            if peers is None or any(
                peer_admits(peer, policy["metadata"]["namespace"], source) for peer in peers
            ):
                return True
    return False


def pod(labels: dict[str, str], namespace: str = NS, namespace_extra: dict[str, str] | None = None) -> dict:
    return {
        "labels": labels,
        "namespace": namespace,
        "namespace_labels": namespace_labels(namespace, namespace_extra),
        "ip": "10.64.3.4",
    }


def ip_source(ip: str) -> dict:
    return {"ip": ip}


GCS, DASHBOARD, CLIENT, MEGASCALE, RAYLET = 6379, 8265, 10001, 8081, 43211
PORTS = (GCS, DASHBOARD, CLIENT, MEGASCALE, RAYLET)
RANGES = ["10.8.0.0/16", "192.168.7.0/24"]


def policies_with_ranges() -> list[dict]:
    return kuberay.network_policies(gke_spec("v6e-16", dashboardSourceRanges=RANGES))


@pytest.mark.parametrize(
    "target,source,port,expected",
    [
        (HEAD, pod(WORKER), GCS, True),
        (HEAD, pod(WORKER), CLIENT, True),
        (HEAD, pod(WORKER), RAYLET, True),  # Ray's own ports beyond the well-known ones
        (WORKER, pod(HEAD), RAYLET, True),
        (WORKER, pod(WORKER), MEGASCALE, True),
        (HEAD, pod(OTHER_RAY), GCS, False),
        (HEAD, pod(OTHER_APP), DASHBOARD, False),
        (HEAD, pod(OTHER_APP), CLIENT, False),
        (HEAD, pod(WORKER, namespace="elsewhere"), GCS, False),
        (WORKER, pod(OTHER_APP), MEGASCALE, False),
        (HEAD, ip_source("10.8.1.2"), DASHBOARD, True),  # dashboardSourceRanges
        (HEAD, ip_source("192.168.7.9"), DASHBOARD, True),
        (HEAD, ip_source("10.8.1.2"), GCS, False),
        (HEAD, ip_source("10.8.1.2"), CLIENT, False),
        (HEAD, ip_source("10.9.0.1"), DASHBOARD, False),
        (WORKER, ip_source("10.8.1.2"), DASHBOARD, False),  # the ranges reach the head only
    ],
)
def test_network_policies_admit_only_the_clusters_own_pods_and_the_dashboard_ranges(
    target, source, port, expected
):
    assert admitted(policies_with_ranges(), {"namespace": NS, "labels": target}, source, port) is expected


def test_without_dashboard_ranges_nothing_outside_the_cluster_reaches_the_head():
    policies = kuberay.network_policies(gke_spec("v6e-16"))
    assert [p["metadata"]["name"] for p in policies] == ["demo-ray-pods"]
    head = {"namespace": NS, "labels": HEAD}
    for port in (GCS, DASHBOARD, CLIENT):
        assert not admitted(policies, head, ip_source("10.8.1.2"), port)
        assert not admitted(policies, head, pod(OTHER_APP), port)
        assert admitted(policies, head, pod(WORKER), port)


def test_policies_live_in_the_clusters_namespace_and_name_it_in_their_peer():
    policies = policies_with_ranges()
    namespace = kuberay.namespace_manifest(gke_spec("v6e-16"))["metadata"]["name"]
    assert namespace == NS
    assert {p["metadata"]["namespace"] for p in policies} == {NS}
    [ray_pods] = [p for p in policies if p["metadata"]["name"] == "demo-ray-pods"]
    [rule] = ray_pods["spec"]["ingress"]
    # One peer holding both selectors (ANDed), not two peers (ORed).
    assert rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {METADATA_NAME: NS}},
            "podSelector": {"matchLabels": {"ray.io/cluster": "demo"}},
        }
    ]


# Pods someone else starts with the Ray pods' labels copied: in `default` (where the Ray pods
# used to run), in a namespace of their own, and in one whose owner also copied the cluster
# label and tried to forge the name label onto the namespace.
FOREIGN = [
    pod(labels, namespace, extra)
    for labels in (HEAD, WORKER)
    for namespace, extra in (
        ("default", None),
        ("attacker", None),
        ("attacker", {"ray.io/cluster": "demo", METADATA_NAME: NS}),
    )
]


@pytest.mark.parametrize(
    "source", FOREIGN, ids=lambda s: f"{s['namespace']}-{s['labels']['ray.io/node-type']}"
)
def test_a_foreign_pod_with_the_copied_labels_matches_no_peer_and_reaches_no_port(source):
    policies = policies_with_ranges()
    for policy in policies:
        for rule in policy["spec"]["ingress"]:
            for peer in rule["from"]:
                assert not peer_admits(peer, policy["metadata"]["namespace"], source), peer
    for target in (HEAD, WORKER):
        for port in PORTS:
            assert not admitted(policies, {"namespace": NS, "labels": target}, source, port)
    # The same labels on a pod in the cluster's namespace do get in: the namespace alone decides.
    local = pod(source["labels"])
    assert admitted(policies, {"namespace": NS, "labels": HEAD}, local, GCS)


# ---- the evaluator itself: it tells the cases above apart ----------------------------------


def _with_peers(policy: dict, peers: list[dict], namespace: str | None = None) -> dict:
    changed = {**policy, "spec": {**policy["spec"], "ingress": [{"from": peers}]}}
    if namespace is not None:
        changed["metadata"] = {**policy["metadata"], "namespace": namespace}
    return changed


def test_the_evaluator_admits_everything_when_no_policy_selects_the_pod():
    """Without a policy a pod is open (what the cluster had before)."""
    assert admitted([], {"namespace": NS, "labels": HEAD}, pod(OTHER_APP), GCS)
    other_app = {"namespace": NS, "labels": OTHER_APP}
    assert admitted(kuberay.network_policies(gke_spec("v6e-16")), other_app, pod(OTHER_RAY), 80)


def test_the_evaluator_ors_peers_and_ands_the_selectors_of_one_peer():
    [policy] = kuberay.network_policies(gke_spec("v6e-16"))
    [peer] = policy["spec"]["ingress"][0]["from"]
    head = {"namespace": NS, "labels": HEAD}
    # Split into two peers: every pod of the namespace gets in, Ray label or not.
    split = _with_peers(
        policy, [{"namespaceSelector": peer["namespaceSelector"]}, {"podSelector": peer["podSelector"]}]
    )
    assert admitted([split], head, pod(OTHER_APP), GCS)
    assert not admitted([policy], head, pod(OTHER_APP), GCS)
    # A namespace selector that selects every namespace: the copied label is enough.
    any_namespace = _with_peers(policy, [{"namespaceSelector": {}, "podSelector": peer["podSelector"]}])
    assert admitted([any_namespace], head, pod(WORKER, "attacker"), GCS)
    # The layout this replaced: everything in `default`, the peer a pod selector alone.
    old = _with_peers(policy, [{"podSelector": peer["podSelector"]}], namespace="default")
    assert admitted([old], {"namespace": "default", "labels": HEAD}, pod(WORKER, "default"), GCS)
    assert not admitted([old], {"namespace": "default", "labels": HEAD}, pod(WORKER, "attacker"), GCS)


@pytest.mark.parametrize(
    "selector,labels,expected",
    [
        ({}, {}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
        (
            {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]},
            {"a": "1"},
            False,
        ),
    ],
)
def test_label_selectors_follow_kubernetes(selector: dict[str, Any], labels, expected):
    assert selects(selector, labels) is expected
