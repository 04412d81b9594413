"""Google's own names for what happened to a resource, shared by the cloud twin (which emulates
them), the recovery controller and `rayslice status` (which read them): one spelling, and no
reader imports the emulator to get it.

- Compute Engine's Instance.status (compute v1 discovery document): ``RUNNING``; ``TERMINATED``
  "The instance has stopped (either by explicit action or underlying failure)".

- Cloud TPU's Node.state (tpu v2 discovery document): ``READY``, ``PREEMPTED``, ``CREATING``,
  ``REPAIRING``, ``UNKNOWN`` (after a failed repair).

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
INSTANCE_RUNNING, INSTANCE_TERMINATED = "RUNNING", "TERMINATED"
NODE_READY, NODE_PREEMPTED = "READY", "PREEMPTED"
# Node.state (tpu v2 discovery): CREATING "TPU node is being created"; REPAIRING "TPU node is being
# repaired and may be unusable"; UNKNOWN "TPU node has unknown state after a failed repair".
NODE_CREATING, NODE_REPAIRING, NODE_UNKNOWN = "CREATING", "REPAIRING", "UNKNOWN"
