"""What rayslice's Pulumi dynamic providers share (`rayslice.infra.tpu_vm.queued`,
`rayslice.infra.compute.bulk_hosts`): each sends its calls through `CloudClient` in the
resource's project and zone, and has no update: any change of what Google received replaces the
resource, the old one deleted first (neither a queued resource nor a bulk MIG's hosts can be
changed in place, and the new one would clash with the old: same name, or a bulk MIG that takes
hosts only from target size 0)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi.dynamic

from rayslice.cloud.rest import default_session, operation_error
from rayslice.errors import CloudError
from rayslice.recovery.cloud import CloudClient, Location


class ReplacingProvider(pulumi.dynamic.ResourceProvider):
    """A dynamic provider whose resources are replaced, old one first, on any change of the
    inputs named in `compared`."""

    compared: Sequence[str] = ()

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        changed = [key for key in self.compared if olds.get(key) != news.get(key)]
        return pulumi.dynamic.DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=True)


def client(props: dict[str, Any]) -> CloudClient:
    """The client a provider's calls go through: Application Default Credentials, the resource's
    project and zone, the endpoints `CloudClient` reads from the environment."""
    return CloudClient(default_session(), Location(str(props["project"]), str(props["zone"])))


def succeeded(done: Mapping[str, Any], what: str) -> None:
    """Raise `CloudError` naming `what` if the finished operation `done` carries an error: a
    provider's call failed (Pulumi then shows the message and keeps the state as it was)."""
    error = operation_error(done)
    if error:
        raise CloudError(what, None, error)
