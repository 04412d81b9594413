"""Firewall rules of a TPU VM cluster: open inside, closed outside.

Ray (GCS, raylets, object managers, workers, Jobs API), the JAX coordinator (8476, 8482 since
0.8.1), megascale (8081) and the TPU runtime all talk between the cluster's own hosts on many
ports, several chosen at random; one rule allows all TCP/UDP between hosts that carry the
cluster's network tag instead of chasing port lists (stale port lists are a known cause of JAX
hangs, e.g. jax#35905 after the coordinator port moved). From outside, SSH comes only from
IAP's TCP-forwarding range, and the Ray dashboard / Jobs API only from the ranges the user
lists. No rule admits 0.0.0.0/0: the spec refuses dashboard ranges that cover the whole address
space, and nothing else takes a range from the user.

The recovery controller's VM (`rayslice.infra.controller_vm`) carries neither tag, only its own,
and two rules deny it every ingress from anywhere, IPv4 and IPv6, at the highest priority: it
talks to Google's APIs and its metadata server (which no firewall rule governs) and to nothing
else, and no rule of an existing network (``default-allow-internal``, ``default-allow-ssh``, an
IPv6 rule of a dual-stack subnet) can open it.

A rule takes IPv4 or IPv6 source ranges, never both: Google's "Use VPC firewall rules" page
(cloud.google.com/firewall/docs/using-firewalls, "Create VPC firewall rules") says "A firewall
rule can contain either IPv4 or IPv6 ranges, but not both", while the compute v1 discovery
document's Firewall.sourceRanges says "Both IPv4 and IPv6 are supported" (revision 20261106). So
a rule whose ranges hold both families is sent as two (`one_family_each`): the IPv4 one under its
own name, the IPv6 one with ``-v6`` added.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from rayslice.names import DASHBOARD_PORT
from rayslice.spec import ClusterSpec

# Google's documented source range of IAP TCP forwarding (`gcloud ... --tunnel-through-iap`).
IAP_SOURCE_RANGE = "35.235.240.0/20"
SSH_PORT = 22
EVERYWHERE = ("0.0.0.0/0", "::/0")  # every IPv4 address, every IPv6 address
# Compute Engine firewall priorities run from 0 (first) to 65535; the default is 1000. At equal
# priority a deny rule wins over an allow rule. Source: Google's "VPC firewall rules" page
# (cloud.google.com/firewall/docs/firewalls, "Priority"); the compute v1 discovery document's
# Firewall.priority says the same range and default. The twin checks the body's fields against
# that document (cloud/bodies.py); no twin rule models rule evaluation order.
FIRST_PRIORITY = 0


@dataclass(frozen=True)
class Rule:
    """One ingress rule, as plain data so tests and the preview can read it."""

    suffix: str
    description: str
    protocols: tuple[tuple[str, tuple[str, ...]], ...]  # (protocol, ports); no ports: all
    target_tags: tuple[str, ...]
    source_tags: tuple[str, ...] = ()
    source_ranges: tuple[str, ...] = ()
    deny: bool = False  # the protocols are denied, not allowed
    priority: int | None = None  # None: Compute Engine's default


def cluster_tag(spec: ClusterSpec) -> str:
    """The network tag every host of the cluster carries."""
    return f"{spec.name}-host"


def head_tag(spec: ClusterSpec) -> str:
    """The network tag of the host(s) that may run the Ray head (dashboard, Jobs API)."""
    return f"{spec.name}-head"


def controller_tag(spec: ClusterSpec) -> str:
    """The network tag of the recovery controller's VM (and of nothing else)."""
    return f"{spec.name}-controller"


def slice_tags(spec: ClusterSpec, index: int) -> list[str]:
    """Network tags of a slice's hosts; with head=slice, slice 0 also carries the head tag."""
    if spec.head == "slice" and index == 0:
        return [cluster_tag(spec), head_tag(spec)]
    return [cluster_tag(spec)]


def firewall_rules(spec: ClusterSpec) -> list[Rule]:
    """The cluster's ingress rules; the dashboard rule exists only when ranges are listed."""
    rules = [
        Rule(
            suffix="internal",
            description="rayslice: all TCP/UDP (and ping) between the cluster's hosts: "
            "Ray, JAX, megascale, TPU runtime",
            protocols=(("tcp", ()), ("udp", ()), ("icmp", ())),
            source_tags=(cluster_tag(spec),),
            target_tags=(cluster_tag(spec),),
        ),
        Rule(
            suffix="iap-ssh",
            description="rayslice: SSH through Identity-Aware Proxy only",
            protocols=(("tcp", (str(SSH_PORT),)),),
            source_ranges=(IAP_SOURCE_RANGE,),
            target_tags=(cluster_tag(spec),),
        ),
    ]
    if spec.dashboard_source_ranges:
        rules.append(
            Rule(
                suffix="dashboard",
                description="rayslice: Ray dashboard / Jobs API from the listed ranges",
                protocols=(("tcp", (str(DASHBOARD_PORT),)),),
                source_ranges=tuple(spec.dashboard_source_ranges),
                target_tags=(head_tag(spec),),
            )
        )
    if spec.runs_recovery:
        rules.append(
            Rule(
                suffix="controller-deny",
                description="rayslice: nothing reaches the recovery controller's VM",
                protocols=(("all", ()),),
                source_ranges=EVERYWHERE,
                target_tags=(controller_tag(spec),),
                deny=True,
                priority=FIRST_PRIORITY,
            )
        )
    return [part for rule in rules for part in one_family_each(rule)]


def one_family_each(rule: Rule) -> list[Rule]:
    """`rule` as Compute Engine takes it: one rule per IP version of its source ranges (a rule
    holds one family only; see the module's docstring). Tags alone, or one family: as it is."""
    v4 = tuple(r for r in rule.source_ranges if ipaddress.ip_network(r).version == 4)
    v6 = tuple(r for r in rule.source_ranges if ipaddress.ip_network(r).version == 6)
    if not (v4 and v6):
        return [rule]
    return [
        dataclasses.replace(rule, source_ranges=v4),
        dataclasses.replace(rule, suffix=f"{rule.suffix}-v6", source_ranges=v6),
    ]


@dataclass(frozen=True)
class ClusterFirewallArgs:
    spec: ClusterSpec
    network: pulumi.Input[str]


class ClusterFirewall(pulumi.ComponentResource):
    """The rules of `firewall_rules`, created in the cluster's network."""

    rule_names: pulumi.Output[list[str]]

    def __init__(self, name: str, args: ClusterFirewallArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:infra:ClusterFirewall", name, None, opts)
        spec = args.spec
        created = [
            gcp.compute.Firewall(
                f"{name}-{rule.suffix}",
                name=f"{spec.name}-fw-{rule.suffix}",
                project=spec.project,
                network=args.network,
                direction="INGRESS",
                description=rule.description,
                allows=None
                if rule.deny
                else [
                    gcp.compute.FirewallAllowArgs(protocol=p, ports=list(ports) or None)
                    for p, ports in rule.protocols
                ],
                denies=[
                    gcp.compute.FirewallDenyArgs(protocol=p, ports=list(ports) or None)
                    for p, ports in rule.protocols
                ]
                if rule.deny
                else None,
                priority=rule.priority,
                source_tags=list(rule.source_tags) or None,
                source_ranges=list(rule.source_ranges) or None,
                target_tags=list(rule.target_tags),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for rule in firewall_rules(spec)
        ]
        self.rule_names = pulumi.Output.all(*[fw.name for fw in created])
        # Repeated from the annotation: registered outputs are what `pulumi stack` shows.
        self.register_outputs({"rule_names": self.rule_names})
