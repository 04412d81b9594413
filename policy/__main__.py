"""Entry point Pulumi runs for ``--policy-pack``: serves `rayslice_rules.POLICIES` over gRPC."""

from pulumi_policy import PolicyPack
from rayslice_rules import PACK_NAME, POLICIES

PolicyPack(name=PACK_NAME, policies=POLICIES)
