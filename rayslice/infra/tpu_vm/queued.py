"""A tpu-vm slice asked for through a Cloud TPU queued resource (``queued: true``).

Why a dynamic provider and not pulumi-gcp's ``tpu.V2QueuedResource``: that type's node has four
fields (runtime version, accelerator type, description, network config), so a slice created
through it would boot without rayslice's metadata, service account, labels, tags, topology or
Secure Boot, and it has no Spot, named reservation or deadline (docs/decisions.md). The
`QueuedResource` here sends the Cloud TPU API's ``queuedResources.create`` itself, with the whole
node a direct create (`gcp.tpu.V2Vm`) would send: its inputs are the QueuedResource body's own
fields plus the node in V2Vm's properties, which `rayslice.cloud.bodies` turns into the REST body
with the V2Vm converter, the same function the cloud twin and `rayslice preview` apply.

What the request carries per capacity is the stack's cell of `rayslice.capacity_table`
(``queuedResources.create``'s body there, each field with its source): the Spot tier
(``spot: {}``), a reservation (``reservationName``: the named one, or ``.../reservations/-`` for
any matching one, as gcloud's ``--reserved`` sends it), ``provisioningModel: RESERVATION_BOUND``
for a calendar-mode reservation, and ``provisioningModel: FLEX_START`` with
``runDuration.maxRunDuration`` from ``maxRunHours``. A request with a provisioning model or a
run duration goes to v2alpha1, the only version that has them (tpu v2alpha1 discovery document,
QueuedResource); any other to v2. ``queueDeadlineHours`` becomes
``queueingPolicy.validUntilDuration`` ("A relative time after which resources should not be
created. If the request cannot be fulfilled by this time the request will be failed"), a
google-duration of seconds.

The node is named by ``nodeId`` (the slice's name, so the recovery controller and `rayslice
status` find it as they find a directly created one); the request itself is
`names.request_name` (``<slice>-request``).

``pulumi up`` returns once Google has accepted the request (its create operation is done; at
most `ACCEPT_TIMEOUT_S`), not when it is ACTIVE: capacity may come hours later, and the hosts
boot with the same startup script then. Any change of the request replaces it (a queued
resource has no update method in the discovery document), deleting the old one first with
``force`` (queuedResources.delete: "all running nodes belonging to this queued resource will be
deleted first"). The provider's calls go through `rayslice.recovery.cloud.CloudClient` (google-auth
and requests, Application Default Credentials) to the endpoint ``CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU``
names, else Google's. Under Pulumi's mocks (`rayslice preview`, the tests, the simulator) the
provider is never run: the mocks apply the same request to the cloud twin.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi.dynamic
import pulumi_gcp as gcp

from rayslice import capacity_table
from rayslice.capacity_table import cell_for
from rayslice.cloud import bodies, rules
from rayslice.infra.providers import ReplacingProvider, succeeded
from rayslice.infra.providers import client as _client
from rayslice.names import request_name
from rayslice.spec import SECONDS_PER_HOUR, ClusterSpec

ACCEPT_TIMEOUT_S = 600.0  # how long `pulumi up` waits for Google to accept a request
# The inputs a change of which replaces the request (every input Google receives).
_COMPARED = sorted(bodies.consumed(bodies.QUEUED_RESOURCE) | {"project", "zone"})


def _duration(hours: int) -> str:
    """A google-duration of whole seconds (``"3600s"``)."""
    return f"{hours * SECONDS_PER_HOUR}s"


def request_fields(spec: ClusterSpec, project: pulumi.Input[str]) -> dict[str, Any]:
    """The QueuedResource fields that depend on the capacity and the deadline (module docstring);
    ``apiVersion`` says which version of the API takes them."""
    (call,) = cell_for(spec).calls
    values = {
        capacity_table.ZONE: spec.zone,
        capacity_table.RESERVATION_NAME: spec.reservation,
        capacity_table.MAX_RUN_SECONDS: spec.max_run_seconds,
    }
    fields: dict[str, Any] = {
        key: _in_project(value, project) for key, value in capacity_table.fill(call.body, values).items()
    }
    alpha = any(key in fields for key in rules.ALPHA_ONLY_QUEUED_FIELDS)
    fields["apiVersion"] = "v2alpha1" if alpha else "v2"
    if spec.queue_deadline_hours is not None:
        fields["queueingPolicy"] = {"validUntilDuration": _duration(spec.queue_deadline_hours)}
    return fields


def _in_project(value: Any, project: pulumi.Input[str]) -> Any:
    """A reservation path with the project filled in (the project may be known only to Pulumi)."""
    if not isinstance(value, str) or capacity_table.PROJECT not in value:
        return value
    head, tail = value.split(capacity_table.PROJECT, 1)
    return pulumi.Output.concat(head, project, tail)


class QueuedResourceProvider(ReplacingProvider):
    """Creates and deletes one queued resource through the Cloud TPU API (module docstring)."""

    compared = _COMPARED

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        request = bodies.request(bodies.QUEUED_RESOURCE, props)
        assert request is not None and request.name
        client = _client(props)
        operation = client.create_queued_resource(
            request.name, request.body, [request.name], version=bodies.TPU_API_VERSIONS[request.api]
        )
        done = client.wait_tpu_operation(operation, ACCEPT_TIMEOUT_S)
        succeeded(done, f"create queued resource {request.name}")
        return pulumi.dynamic.CreateResult(id_=_path(props), outs=dict(props))

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        name = str(props["name"])
        client = _client(props)
        if client.get_queued_resource(name) is None:
            return
        done = client.wait_tpu_operation(
            client.delete_queued_resource(name, [name], force=True), ACCEPT_TIMEOUT_S
        )
        succeeded(done, f"delete queued resource {name}")


def _path(props: dict[str, Any]) -> str:
    return f"projects/{props['project']}/locations/{props['zone']}/queuedResources/{props['name']}"


class QueuedResource(pulumi.dynamic.Resource, module="tpu", name="QueuedResource"):
    """One queued resource (type token `bodies.QUEUED_RESOURCE`)."""

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None):
        super().__init__(QueuedResourceProvider(), name, props, opts)


def queued_slice(
    name: str,
    spec: ClusterSpec,
    slice_name: str,
    node: dict[str, Any],
    opts: pulumi.ResourceOptions,
) -> QueuedResource:
    """The request for slice `slice_name` whose node is `node` (V2Vm's properties)."""
    # The request's parent names the project: the stack's, else the provider's default one.
    project: pulumi.Input[str] = spec.project or gcp.organizations.get_client_config_output().project
    return QueuedResource(
        name,
        {
            "project": project,
            "zone": spec.zone,
            "name": request_name(slice_name),
            "nodeId": slice_name,
            "node": node,
            **request_fields(spec, project),
        },
        opts,
    )
