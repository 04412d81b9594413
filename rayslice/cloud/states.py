"""Google's own names for what happened to a resource, shared by the cloud twin (which emulates
them), the recovery controller and `rayslice status` (which read them): one spelling, and no
reader imports the emulator to get it.

- GKE's NodePool.status and StatusCondition.code (container v1 discovery document):
  ``PROVISIONING``, ``RUNNING``, ``ERROR``, ``STOPPING``; ``GCE_STOCKOUT`` "indicates that Google
  Compute Engine resources are temporarily unavailable".

- ``compute.instances.preempted``: the ``operationType`` of the zone operation Compute Engine
  records when it preempts a Spot instance (compute v1 discovery document, Operation.operationType;
  Google's sample "List preemption history", compute_preemptible_history in
  GoogleCloudPlatform/python-docs-samples, lists zone operations filtered on it).
"""

from __future__ import annotations

PREEMPTED_OPERATION = "compute.instances.preempted"
POOL_PROVISIONING, POOL_RUNNING, POOL_ERROR, POOL_STOPPING = "PROVISIONING", "RUNNING", "ERROR", "STOPPING"
GCE_STOCKOUT = "GCE_STOCKOUT"
