"""A stateful twin of one Google Cloud project's Compute Engine, Cloud TPU and GKE resources.

The Pulumi program's resources are applied to it (`rayslice.infra.mocks`, through the REST
bodies of `rayslice.cloud.bodies`), and the emulated HTTP APIs of the simulator
(`rayslice.local.google.cloud_api`) act on the same instance, so what `rayslice preview` checks,
what the simulator boots and what recovery recreates is one state. It keeps Google's documented
behaviour, each with its source beside the code, and refuses a request that breaks one of the
rules of `rayslice.cloud.rules` (the same functions the policy pack runs) with a
`CloudRuleError` naming the resource, the rule and the source.

It is split by API, as the emulated servers are: `state` (what every API shares: the rules'
view of the resources, subnetworks' addresses, capacity, clock, hooks, hosts), `compute`
(instances, MIGs, resize requests, addresses, images), `tpu` (nodes and queued resources) and
`container` (GKE node pools, over Compute Engine's MIGs). `CloudTwin` is the whole project: one
object whose attributes the emulated servers and the tests read, each API's methods on it.

What happens between calls is on the twin's clock (`rayslice.cloud.twin.clock`): tests own it,
`advance` runs what falls due, and `bill` (`rayslice.cloud.billing`) says what the timeline cost.

Core-level (no platform code): `rayslice preview` (infra) and the simulator (local) both use it.
"""

from __future__ import annotations

from rayslice.cloud.twin.container import ContainerTwin
from rayslice.cloud.twin.tpu import TpuTwin


class CloudTwin(TpuTwin, ContainerTwin):
    """One project's resources across the three APIs. A slice that is a TPU node is the Cloud
    TPU API's, any other (a MIG, a node pool's MIG) Compute Engine's: `preempt` and `hosts` ask
    each API in that order."""
