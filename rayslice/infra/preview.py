"""What `pulumi up` would create, computed without a cloud (`rayslice preview`, in `commands`).

Runs the real Pulumi program (`rayslice.infra.program.main`) under Pulumi's mocks with the
stack file's config and ``--set`` overrides, and renders every resource it registers with its
inputs. No Pulumi CLI, credentials or network are needed, so infrastructure repos can run it in
CI; the one exception is a stack with `requirements` whose lock (``rayslice-locks/<stack>.lock``,
`rayslice.startup_scripts.stack_locks`) is missing or stale: it is resolved against the index
first (wheels only: nothing is built). Resources that a config change replaces
(``replaceOnChanges``) and custom create/delete timeouts are shown with them, so a user sees
before ``pulumi up`` that changing requirements, rayVersion, preset or the boot script recreates
the slices.

Output formats live in `FORMATS` (name -> renderer of a `Preview`): ``tree``, ``json``, and
``yaml``, the Kubernetes manifests of platform=gke for ``kubectl apply`` users.

Every Compute Engine and TPU resource goes to a cloud twin (`rayslice.cloud.twin`) as the REST
call the provider sends, and what Google would refuse is what the twin refused plus its audit of
the finished deployment (`Preview.violations`): one runner of Google's documented rules
(`rayslice.cloud.rules`, whose definitions the policy pack in ``policy/`` runs in ``pulumi
preview``) for `rayslice preview`, the simulator and recovery alike. ``json`` carries each
resource's violations. `deploy` applies the program to a given twin, which the simulator then
boots from.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayslice import spec
from rayslice.cloud import rules
from rayslice.cloud.twin import CloudTwin
from rayslice.cloud.twin.state import CloudRuleError
from rayslice.errors import InvalidInput
from rayslice.infra.gke.kuberay import APPLY_ORDER, manifests_yaml
from rayslice.infra.mocks import Registration, run_offline
from rayslice.infra.program import LockSource, main

# Strings longer than this are shown as their size and hash (the startup script, mostly).
_LONG = 160
SECRET_SHOWN = "[secret]"
KUBERNETES = "kubernetes:"  # type tokens of the Kubernetes provider's resources
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
DYNAMIC = "pulumi-python"  # the package of a dynamic provider's resources (``pulumi.dynamic``)


def stack_config(stack_file: str | None, overrides: list[str]) -> dict[str, str]:
    """Pulumi config (``rayslice:KEY`` -> string) from a stack file and ``--set`` pairs.

    Values are stringified the way the Pulumi CLI hands them to a program: structured values
    as JSON, booleans as ``true``/``false``.
    """
    raw = dict(spec.read_stack_file(stack_file)) if stack_file else {}
    raw.update(spec.parse_overrides(overrides))
    return pulumi_config(raw)


def pulumi_config(values: Mapping[str, Any]) -> dict[str, str]:
    """Pulumi config from config keys and values (a stack file's, or `ClusterSpec.as_config`'s,
    as the simulator deploys its spec); keys without a value (None) are left unset."""
    return {
        f"{spec.NAMESPACE}:{key}": _config_string(value) for key, value in values.items() if value is not None
    }


def _config_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return str(value)


def display_type(token: str) -> str:
    """``gcp:tpu/v2Vm:V2Vm`` -> ``gcp.tpu.V2Vm`` (the class a Python program would use); a dynamic
    resource's ``pulumi-python:dynamic/tpu:QueuedResource`` -> ``dynamic.tpu.QueuedResource``."""
    package, module, kind = token.split(":")
    if package == DYNAMIC:
        return ".".join(part for part in (*module.split("/"), kind) if part)
    lower = kind[:1].lower() + kind[1:]
    module = module.removesuffix(f"/{lower}")
    return ".".join(part for part in (package, module, kind) if part and part != "index")


def shown_inputs(registration: Registration) -> dict[str, Any]:
    """A resource's inputs as printed: secrets masked, long strings summarised."""
    return {
        key: SECRET_SHOWN if key in registration.secret_inputs else _map_leaves(value, _summarised)
        for key, value in sorted(registration.inputs.items())
    }


def _map_leaves(value: Any, leaf: Callable[[Any], Any]) -> Any:
    if isinstance(value, dict):
        return {k: _map_leaves(v, leaf) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_map_leaves(v, leaf) for v in value]
    return leaf(value)


def _wire_number(value: Any) -> Any:
    """The engine's wire format has only floats; whole ones were ints in the program."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _summarised(value: Any) -> Any:
    value = _wire_number(value)
    if isinstance(value, str) and len(value) > _LONG:
        digest = hashlib.sha256(value.encode()).hexdigest()[:12]
        return f"<{len(value.encode())} bytes, sha256 {digest}>"
    return value


def lifecycle_notes(registration: Registration) -> list[str]:
    """What a change does to a resource, and how long Pulumi waits for it, in words."""
    notes = []
    if registration.replace_on_changes == ("*",):  # Pulumi's "every input"
        notes.append("replaced, not updated, when any input changes")
    elif registration.replace_on_changes:
        keys = ", ".join(registration.replace_on_changes)
        notes.append(f"replaced, not updated, when any of these inputs change: {keys}")
    if registration.ignore_changes:
        keys = ", ".join(registration.ignore_changes)
        notes.append(f"after creation, Pulumi leaves these inputs as the cloud has them: {keys}")
    timeouts = {k: v for k, v in registration.custom_timeouts.items() if v}
    if timeouts:
        notes.append("timeouts: " + ", ".join(f"{k} {v}" for k, v in sorted(timeouts.items())))
    return notes


def render_tree(registrations: list[Registration]) -> str:
    """Each resource under its parent, with one line per input."""
    urns = {r.urn for r in registrations}
    children: dict[str, list[Registration]] = {}
    for r in registrations:
        children.setdefault(r.parent if r.parent in urns else "", []).append(r)
    lines: list[str] = []

    def show(r: Registration, head: str, inner: str) -> None:
        lines.append(f"{head}{display_type(r.type)}  {r.name}")
        bar = "│   " if children.get(r.urn) else "    "
        for key, value in shown_inputs(r).items():
            lines.append(f"{inner}{bar}{key}: {json.dumps(value, separators=(', ', ': '))}")
        for note in lifecycle_notes(r):
            lines.append(f"{inner}{bar}({note})")
        kids = sorted(children.get(r.urn, []), key=lambda k: (k.custom, k.type, k.name))
        for i, kid in enumerate(kids):
            last = i == len(kids) - 1
            show(kid, inner + ("└── " if last else "├── "), inner + ("    " if last else "│   "))

    for root in children.get("", []):
        show(root, "", "")
    foreign = foreign_grants(registrations)
    if foreign:
        lines.append(
            "\ngrants on resources this stack does not declare (each reaches every job on the cluster):"
        )
        lines += [f"  {grant}" for grant in foreign]
    custom = sum(r.custom for r in registrations)
    lines.append(
        f"\n{custom} cloud resources in {len(registrations) - custom} components "
        "(preview under Pulumi mocks, no cloud API; names and inputs are real, outputs are fake)"
    )
    return "\n".join(lines)


# The IAM grants on one bucket or secret, by type token, with the input naming what they are on,
# and the type and input of what a stack may declare under that name (pulumi-gcp 10.2).
FOREIGN_GRANTS = {
    "gcp:storage/bucketIAMMember:BucketIAMMember": ("bucket", "gcp:storage/bucket:Bucket", "name"),
    "gcp:secretmanager/secretIamMember:SecretIamMember": (
        "secretId",
        "gcp:secretmanager/secret:Secret",
        "secretId",
    ),
}


def foreign_grants(registrations: Sequence[Registration]) -> list[str]:
    """Every grant on a bucket or secret the stack does not declare (one it names by config:
    ``recordBucket``, ``packageIndexCredentialsSecret``), as a line: role, resource, member and
    condition. Such a grant extends the cluster's accounts, and so every job, to a resource
    someone else manages; a preview shows each."""
    declared = {
        (r.type, str(r.inputs.get(field)))
        for r in registrations
        for _, kind, field in FOREIGN_GRANTS.values()
        if r.type == kind
    }
    found = []
    for r in registrations:
        if r.type not in FOREIGN_GRANTS:
            continue
        on, kind, _ = FOREIGN_GRANTS[r.type]
        target = str(r.inputs.get(on))
        if (kind, target) in declared:
            continue
        condition = (r.inputs.get("condition") or {}).get("expression")
        where = f" if {condition}" if condition else " (no condition)"
        found.append(
            f"{r.inputs.get('role')} on {display_type(kind)} {target} to {r.inputs.get('member')}{where}"
        )
    return sorted(found)


@dataclass(frozen=True)
class Preview:
    """What `pulumi up` would create, and what Google would refuse of it."""

    registrations: list[Registration]  # in the order the program registered them
    # The cloud twin's refusals and its audit of the finished deployment, each naming the
    # resource by its Pulumi URN (`rayslice.cloud.twin.CloudTwin.violations`).
    violations: list[rules.Violation]


def render_json(registrations: list[Registration], violations: Sequence[rules.Violation] = ()) -> str:
    """Machine-readable: one object per resource (type token, name, parent URN, inputs, and the
    `violations` that name it, each with its rule and source)."""
    found: dict[str, list[dict[str, str]]] = {}
    for violation in violations:
        found.setdefault(violation.urn, []).append(violation.as_json())
    return json.dumps(
        [
            {
                "type": r.type,
                "name": r.name,
                "urn": r.urn,
                "parent": r.parent,
                "custom": r.custom,
                "inputs": shown_inputs(r),
                "replaceOnChanges": list(r.replace_on_changes),
                "customTimeouts": {k: v for k, v in r.custom_timeouts.items() if v},
                "violations": found.get(r.urn, []),
            }
            for r in registrations
        ],
        indent=2,
    )


def render_yaml(registrations: list[Registration]) -> str:
    """The Kubernetes objects of platform=gke as one YAML stream for ``kubectl apply -f -``.

    Read back from what the program registered with the Kubernetes provider, so the stream is
    what `pulumi up` applies. The engine registers in no fixed order, so objects are sorted by
    kind (`APPLY_ORDER`) and then by name, numbers compared as numbers (``-s0-h2`` before
    ``-s0-h10``). The operator's Helm release is left out: it is a chart, not a manifest.
    """
    objects = sorted(
        (
            _manifest(r)
            for r in registrations
            if r.custom and r.type.startswith(KUBERNETES) and r.type != HELM_RELEASE
        ),
        key=lambda o: (APPLY_ORDER.index(o["kind"]), _natural(o["metadata"]["name"])),
    )
    if not objects:
        raise InvalidInput(
            "--output yaml prints the Kubernetes manifests of platform=gke, and this "
            "configuration declares none (its slices are VMs, not pods); use --output tree "
            "or json, or set platform=gke"
        )
    return manifests_yaml(objects)


def _natural(text: str) -> list[tuple[int, int | str]]:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text)]


def _manifest(registration: Registration) -> dict[str, Any]:
    """A registered Kubernetes object as its manifest: apiVersion, kind and metadata first."""
    inputs = {
        key: SECRET_SHOWN if key in registration.secret_inputs else _map_leaves(value, _wire_number)
        for key, value in registration.inputs.items()
    }
    head = ("apiVersion", "kind", "metadata")
    return {
        **{k: inputs[k] for k in head if k in inputs},
        **{k: v for k, v in sorted(inputs.items()) if k not in head},
    }


FORMATS: dict[str, Callable[[Preview], str]] = {
    "tree": lambda found: render_tree(found.registrations),
    "json": lambda found: render_json(found.registrations, found.violations),
    "yaml": lambda found: render_yaml(found.registrations),
}


def preview(
    config: dict[str, str], program: Callable[[], Any] | None = None, locks: LockSource | None = None
) -> Preview:
    """Run `program` (the cluster's by default, with the stack's lock from `locks`;
    `rayslice.infra.image.main` for the host image) offline with `config`, its Compute Engine and
    TPU resources applied to a fresh cloud twin (`rayslice.infra.mocks`): what it registered, and
    what the twin refused."""
    run = run_offline(program or functools.partial(main, locks), config)
    return Preview(run.registrations, run.twin.violations())


def _no_stack_lock(_: spec.ClusterSpec) -> None:
    """The simulator's hosts install from a local wheelhouse and resolve the stack's own
    `requirements` from it (`Simulation` renders their script without a stack lock), so the
    program it deploys makes no stack lock either. That holds for a `rayVersion` without a
    preset lock too: its hosts resolve every line from the wheelhouse, which is the one index
    they have; a lock resolved from the spec's index would name files the wheelhouse need not
    hold, and one resolved from the wheelhouse on this same machine would pin what the hosts
    resolve from it anyway."""
    return None


def deploy(config: dict[str, str], twin: CloudTwin) -> list[Registration]:
    """Apply the Pulumi program with `config` to `twin`, as `pulumi up` applies it to Google's
    project: the simulator boots the hosts the twin then holds (`twin.hosts()`).

    Raises `CloudRuleError` naming every request the twin refused and every rule the finished
    deployment breaks (a MIG with more or fewer hosts than its topology), with their sources."""
    run = run_offline(functools.partial(main, _no_stack_lock), config, twin)
    found = twin.violations()
    if found:
        raise CloudRuleError(found)
    return run.registrations
