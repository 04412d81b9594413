"""What an emulated project holds and what both emulated APIs share: the resources (a
`rayslice.cloud.twin.CloudTwin`), guest attributes, long-running operations, fault knobs and the
simulator's hooks.

Operations finish after `op_polls` reads; when one finishes, its `finish` step changes the
resources (and calls the simulator's hooks), and its error, if any, lands in the operation as
each API reports errors.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rayslice.cloud.twin import CloudTwin

TPU_OPERATION_METADATA = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
TPU_NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"


@dataclass
class _Operation:
    api: str
    body: dict[str, Any]
    polls_left: int
    finish: Callable[[], str | None]  # runs when the operation completes; returns an error or None
    code: str = "RESOURCE_OPERATION_FAILED"  # a Compute operation's error code, should it fail


class EmulatedProject:
    """The emulated project's state and the operation machinery both APIs use."""

    def __init__(self, *, op_polls: int = 1, address_range: str | None = None):
        self.op_polls = op_polls
        # The project's resources and Google's behaviour and rules: the same twin the Pulumi
        # program is applied to (`rayslice.infra.preview.deploy`), so recovery and the simulator
        # act on what the program declared. `address_range`: where every subnetwork takes its
        # addresses (the simulator's free range; `CloudTwin`).
        self.state = CloudTwin(address_range=address_range)
        self.guest: dict[str, dict[str, dict[str, str]]] = {}  # instance -> namespace -> key -> value
        self.tpu_guest: dict[tuple[str, int], dict[str, dict[str, str]]] = {}  # (node, worker) -> ...
        self.guest_source: Callable[[str], dict[str, dict[str, str]] | None] | None = None
        self.worker_guest_source: Callable[[str, int], dict[str, dict[str, str]] | None] | None = None
        self.fail_creates = 0  # the next N create/insert operations end in an error
        # The simulator's hooks: a slice's hosts power off when its deletion finishes and boot
        # when its recreation finishes (called with the slice name, under the emulation's lock).
        self.on_slice_down: Callable[[str], None] | None = None
        self.on_slice_up: Callable[[str], None] | None = None
        self._operations: dict[str, _Operation] = {}
        self._ids = itertools.count(1)
        self.lock = threading.RLock()

    @property
    def twin(self) -> CloudTwin:
        """The project's resources, as `rayslice.cloud.twin` keeps them."""
        return self.state

    def _tpu_operation(
        self, project: str, zone: str, verb: str, target: str, finish: Callable[[], str | None]
    ) -> dict[str, Any]:
        name = f"projects/{project}/locations/{zone}/operations/operation-{next(self._ids)}"
        body = {
            "name": name,
            "done": False,
            "metadata": {
                "@type": TPU_OPERATION_METADATA,
                "createTime": "2026-01-01T00:00:00Z",
                "target": target,
                "verb": verb,
                "apiVersion": "v2",
            },
        }
        self._operations[name] = _Operation("tpu", body, self.op_polls, finish)
        return self._maybe_finish(name)

    def _compute_operation(
        self,
        project: str,
        zone: str,
        kind: str,
        target: str,
        finish: Callable[[], str | None],
        code: str = "RESOURCE_OPERATION_FAILED",
    ) -> dict[str, Any]:
        number = next(self._ids)
        name = f"operation-{number}"
        body = {
            "kind": "compute#operation",
            "id": str(number),
            "name": name,
            "operationType": kind,
            "status": "RUNNING",
            "progress": 0,
            "targetLink": target,
            "zone": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/operations/{name}",
        }
        self._operations[f"{project}/{zone}/{name}"] = _Operation(
            "compute", body, self.op_polls, finish, code
        )
        return self._maybe_finish(f"{project}/{zone}/{name}")

    def _maybe_finish(self, key: str) -> dict[str, Any]:
        operation = self._operations[key]
        if operation.polls_left <= 0 and not _finished(operation):
            error = operation.finish()
            if operation.api == "tpu":
                operation.body["done"] = True
                if error:
                    operation.body["error"] = {"code": 13, "message": error}
                else:
                    operation.body["response"] = {"@type": TPU_NODE_TYPE}
            else:
                operation.body.update(status="DONE", progress=100)
                if error:
                    operation.body["error"] = {"errors": [{"code": operation.code, "message": error}]}
        operation.polls_left -= 1
        return copy.deepcopy(operation.body)

    @staticmethod
    def _hook(hook: Callable[[str], None] | None, name: str) -> None:
        if hook is not None:
            hook(name)

    def _take_failure(self) -> bool:
        if self.fail_creates > 0:
            self.fail_creates -= 1
            return True
        return False


def _finished(operation: _Operation) -> bool:
    return bool(operation.body.get("done")) or operation.body.get("status") == "DONE"
