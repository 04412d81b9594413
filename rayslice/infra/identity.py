"""Who the hosts, the head VM and the recovery controller are: dedicated service accounts with
only what each needs.

A host writes logs and metrics and, with ``rayAuth=token``, reads the cluster's Ray token. The
account gets exactly those three permissions, the last one on the one secret only (not on
the project). The token is a `random.RandomPassword`: generated at the stack's first
``pulumi up`` and then kept in the stack's state (encrypted as a secret), so every later run
and every rebooted host sees the same token. It reaches hosts only through Secret Manager:
metadata carries the secret's *name*, and no output carries the value.

The CPU head VM boots the same script as the hosts and runs as the hosts' account: Ray and
every job's driver run there, so it holds nothing a host does not. A cluster with recovery
(`ClusterSpec.runs_recovery`) gets one more account, ``<cluster>-controller``, for the recovery
controller's own VM (`rayslice.infra.controller_vm`), and only that account gets the
controller's custom roles (`rayslice.recovery.permissions`, the one list of what the controller
calls) plus ``roles/iam.serviceAccountUser`` on the hosts' account only, because a recreated
slice runs as the hosts' account, and object creation on the cluster's record bucket, where it
writes its decisions. It gets nothing else: no logging, metrics or secret grant (the controller
calls none of them). The hosts' own grants do not change.

Where the cluster keeps a record (`rayslice.infra.record_bucket`), the hosts' account (the head
VM's too) and the controller's may create objects in that bucket, nothing more
(`RECORD_BUCKET_ROLES`), and only under their own folders of the cluster's record (an IAM
condition on the object's name: the hosts' ``hosts/``, the controller's ``events/`` and its
VM's ``hosts/<vm>/``): each machine only adds its logs there, none may read, replace or delete
what any machine wrote, and no job can write the controller's events or another cluster's record.

Custom roles are soft-deleted: pulumi-gcp's ``gcp.projects.IAMCustomRole`` reference warns that
"a deleted role is permanently deleted after 7 days, but it can take up to 30 more days (i.e.
between 7 and 37 days after deletion) before the role name is made available again", and that
new roles cannot share that name meanwhile
(https://www.pulumi.com/registry/packages/gcp/api-docs/projects/iamcustomrole/). A role ID
that is only the cluster's name would make ``pulumi destroy`` then ``pulumi up`` fail for up
to 37 days; each role ID therefore ends in a `random.RandomId` that lives as long as the stack's
resources do (`role_id`).

IAM is eventually consistent: a new account and its grants can take a while to be usable.
pulumi-gcp's own TPU example (``tpu_v2_vm_full``) waits 60 s after creating the account
before creating the VM; rayslice does the same with a `pulumiverse_time.Sleep` after every
grant, and `ready` is what hosts depend on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import partial

import pulumi
import pulumi_gcp as gcp
import pulumi_random as random
import pulumiverse_time as time

from rayslice.infra import record_bucket
from rayslice.infra.compute.template import template_name_prefix
from rayslice.infra.labels import resource_labels
from rayslice.names import controller_name, head_name
from rayslice.observability import record
from rayslice.recovery import kinds, permissions
from rayslice.spec import ClusterSpec

# Project-level roles of the hosts' account: Cloud Logging and Cloud Monitoring writers.
HOST_PROJECT_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter")
SECRET_ACCESSOR_ROLE = "roles/secretmanager.secretAccessor"
# The hosts' roles on the compilation cache's bucket (`rayslice.infra.compilation_cache`), on
# that bucket only (Cloud Storage's "IAM roles for Cloud Storage"): JAX's cache checks that an
# entry exists and reads it (objectViewer: storage.objects.get, and storage.objects.list, which
# gcsfs uses when an object is absent) and writes a new one (objectCreator: storage.objects.create).
# It never replaces or deletes one (jax/_src/lru_cache.py: `put` returns when the entry exists,
# and evicts nothing without a maximum size), so no role that deletes.
CACHE_BUCKET_ROLES = ("roles/storage.objectViewer", "roles/storage.objectCreator")
# On the record's bucket, every machine only creates objects (storage.objects.create), each once:
# the record shipper writes with ifGenerationMatch=0 and never reads, lists or deletes.
RECORD_BUCKET_ROLES = record_bucket.WRITER_ROLES
TOKEN_LENGTH = 48
_ACCOUNT_ID_MAX = 30
# How long hosts wait after the grants (pulumi-gcp's TPU example waits 60 s after the account).
IAM_PROPAGATION_WAIT = "60s"
HOSTS = "hosts"
CONTROLLER = "controller"
GKE_NODES = "gke-nodes"  # GKE's node pools (rayslice.infra.gke.cluster)
# The mark a cut-short account ID carries per suffix. The hosts' has none: their IDs predate
# the other accounts, and a changed ID would replace the hosts' account in existing stacks.
_SHORT_MARK = {HOSTS: "", CONTROLLER: "c", GKE_NODES: "n"}
# IAM role IDs: letters, digits, "_" and ".", at most 64 characters.
_ROLE_ID_MAX = 64
ROLE_SUFFIX_BYTES = 3  # the random end of each role ID: 6 hex characters


def account_id(cluster_name: str, suffix: str = HOSTS) -> str:
    """The ID (6-30 characters) of the cluster's `suffix` service account (`HOSTS`, `CONTROLLER`
    or `GKE_NODES`).

    ``<cluster>-<suffix>`` when it fits. Otherwise the cluster name is cut and given a hash of
    the full name (two long cluster names that share a prefix still get different accounts)
    and the suffix's mark (the accounts of one cluster never collide).
    """
    wanted = f"{cluster_name}-{suffix}"
    if len(wanted) <= _ACCOUNT_ID_MAX:
        return wanted
    digest = hashlib.sha256(cluster_name.encode()).hexdigest()[:6]
    tail = f"-{_SHORT_MARK[suffix]}-{digest}" if _SHORT_MARK[suffix] else f"-{digest}"
    cut = cluster_name[: _ACCOUNT_ID_MAX - len(tail)].rstrip("-")
    return f"{cut}{tail}"


def role_id(cluster_name: str, part: str, random_hex: str) -> str:
    """The ID of the controller's `part` custom role: ``rayslice_<cluster>_<part>_<random_hex>``.

    Hyphens become underscores, which no cluster name contains, so two clusters never share a
    role; a name too long for 64 characters is cut and given a hash of the full name.
    """
    tail = f"_{part}_{random_hex}"
    name = cluster_name.replace("-", "_")
    wanted = f"rayslice_{name}{tail}"
    if len(wanted) <= _ROLE_ID_MAX:
        return wanted
    digest = hashlib.sha256(cluster_name.encode()).hexdigest()[:6]
    room = _ROLE_ID_MAX - len("rayslice_") - len(tail) - len(digest) - 1
    return f"rayslice_{name[:room]}_{digest}{tail}"


def token_secret_id(spec: ClusterSpec) -> str:
    """The Secret Manager secret that holds the Ray token (the name hosts find in metadata)."""
    return f"{spec.name}-ray-token"


@dataclass(frozen=True)
class ClusterIdentityArgs:
    spec: ClusterSpec
    # The compilation cache's bucket (its name), which the hosts' account reads and writes.
    compilation_cache_bucket: pulumi.Input[str] | None = None
    # The record's bucket (its name), where the hosts, the head and the controller create objects,
    # and the cluster's prefix there (``clusters/<cluster>/<run id>``), which their grants' conditions name.
    record_bucket: pulumi.Input[str] | None = None
    record_prefix: pulumi.Input[str] | None = None


class ClusterIdentity(pulumi.ComponentResource):
    """The hosts' service account (the head VM's too), the recovery controller's own one, and,
    with rayAuth=token, the token's secret."""

    service_account_email: pulumi.Output[str]  # the hosts' and the head VM's
    controller_service_account_email: pulumi.Output[str] | None  # None without recovery
    token_secret: str | None  # the secret ID, known before deployment; None without token auth
    ready: time.Sleep  # created IAM_PROPAGATION_WAIT after every grant; hosts and head depend on it

    def __init__(self, name: str, args: ClusterIdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:infra:ClusterIdentity", name, None, opts)
        spec = args.spec
        hosts = self._account(name, spec, HOSTS, "Ray hosts")
        grants: list[pulumi.Resource] = [hosts, *self._project_roles(name, hosts)]
        # Who reads the cluster's secrets, and the resource-name label of each one's grant.
        readers = [("reader", hosts)]
        self.service_account_email = hosts.email
        self.controller_service_account_email = None
        # Who writes the record, the resource-name label of each one's grant, and under which of the
        # cluster's prefixes (`record_bucket.object_condition`).
        recorders = [("record", hosts, [f"{record.HOSTS_DIR}/"])]
        if spec.runs_recovery:
            controller = self._account(name, spec, CONTROLLER, "The recovery controller")
            grants += [controller, *self._controller(name, spec, controller, hosts)]
            self.controller_service_account_email = controller.email
            own = [f"{record.EVENTS_DIR}/", f"{record.HOSTS_DIR}/{controller_name(spec.name)}/"]
            recorders.append(("record-controller", controller, own))
        self.token_secret = None
        if spec.ray_auth == "token":
            self.token_secret = token_secret_id(spec)
            grants.extend(self._token(name, spec, readers))
        if args.compilation_cache_bucket is not None:
            grants += self._bucket_grants(
                args.compilation_cache_bucket, CACHE_BUCKET_ROLES, [(f"{name}-compilation-cache", hosts)]
            )
        if args.record_bucket is not None:
            if args.record_prefix is None:
                raise AssertionError("a record bucket comes with the cluster's prefix in it")
            grants += self._record_grants(name, spec, args.record_bucket, args.record_prefix, recorders)
        if spec.package_index_credentials_secret is not None:
            # The user's own secret (rayslice never creates or reads it): readable by its readers only.
            grants.extend(
                gcp.secretmanager.SecretIamMember(
                    f"{name}-index-credentials-{label}",
                    project=account.project,
                    secret_id=spec.package_index_credentials_secret,
                    role=SECRET_ACCESSOR_ROLE,
                    member=account.member,
                    opts=pulumi.ResourceOptions(parent=self),
                )
                for label, account in readers
            )
        self.ready = time.Sleep(
            f"{name}-iam-propagation",
            create_duration=IAM_PROPAGATION_WAIT,
            opts=pulumi.ResourceOptions(parent=self, depends_on=grants),
        )
        # Repeated from the annotations: registered outputs are what `pulumi stack` shows.
        self.register_outputs(
            {
                "service_account_email": self.service_account_email,
                "controller_service_account_email": self.controller_service_account_email,
                "token_secret": self.token_secret,
            }
        )

    def _account(self, name: str, spec: ClusterSpec, suffix: str, who: str) -> gcp.serviceaccount.Account:
        does = (
            "recreate this cluster's slices"
            if suffix == CONTROLLER
            else "write logs and metrics, read the Ray token"
        )
        return gcp.serviceaccount.Account(
            f"{name}-{suffix}",
            account_id=account_id(spec.name, suffix),
            project=spec.project,
            display_name=f"rayslice {spec.name} {suffix}",
            description=f"{who} of a rayslice cluster: {does}",
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _bucket_grants(
        self,
        bucket: pulumi.Input[str],
        roles: tuple[str, ...],
        grantees: list[tuple[str, gcp.serviceaccount.Account]],
    ) -> list[pulumi.Resource]:
        """`roles` on `bucket` alone (never on the project's storage) for each (resource name
        prefix, account) of `grantees`."""
        return [
            gcp.storage.BucketIAMMember(
                f"{prefix}-{role.split('.')[-1]}",
                bucket=bucket,
                role=role,
                member=account.member,
                opts=pulumi.ResourceOptions(parent=self),
            )
            for prefix, account in grantees
            for role in roles
        ]

    def _record_grants(
        self,
        name: str,
        spec: ClusterSpec,
        bucket: pulumi.Input[str],
        prefix: pulumi.Input[str],
        recorders: list[tuple[str, gcp.serviceaccount.Account, list[str]]],
    ) -> list[pulumi.Resource]:
        """`RECORD_BUCKET_ROLES` on the record's bucket alone, each recorder's only on objects
        under its folders of the cluster's `prefix` (an IAM condition)."""

        def expression(known: list[str], folders: list[str]) -> str:
            return record_bucket.object_condition(known[0], [f"{known[1]}/{f}" for f in folders])

        return [
            gcp.storage.BucketIAMMember(
                f"{name}-{label}-{role.split('.')[-1]}",
                bucket=bucket,
                role=role,
                member=account.member,
                condition=gcp.storage.BucketIAMMemberConditionArgs(
                    title=f"rayslice {spec.name} record: {label}",
                    description="Only these folders of this cluster's record (rayslice.infra.record_bucket)",
                    expression=pulumi.Output.all(bucket, prefix).apply(partial(expression, folders=folders)),
                ),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for label, account, folders in recorders
            for role in RECORD_BUCKET_ROLES
        ]

    def _project_roles(self, name: str, account: gcp.serviceaccount.Account) -> list[pulumi.Resource]:
        """`HOST_PROJECT_ROLES` for `account` (the hosts', which the head VM runs as too)."""
        return [
            gcp.projects.IAMMember(
                f"{name}-{role.split('/')[-1]}",
                project=account.project,
                role=role,
                member=account.member,
                opts=pulumi.ResourceOptions(parent=self),
            )
            for role in HOST_PROJECT_ROLES
        ]

    def _controller(
        self,
        name: str,
        spec: ClusterSpec,
        controller: gcp.serviceaccount.Account,
        hosts: gcp.serviceaccount.Account,
    ) -> list[pulumi.Resource]:
        """The controller's custom roles bound to `controller`, and acting as `hosts`; returns the grants."""
        child = pulumi.ResourceOptions(parent=self)
        suffix = random.RandomId(f"{name}-recovery-role-suffix", byte_length=ROLE_SUFFIX_BYTES, opts=child)
        prefixes = [template_name_prefix(spec.slice_name(i)) for i in range(spec.slices)]
        grants: list[pulumi.Resource] = []
        for part in kinds.role_parts(spec.platform, spec.elastic):
            role = gcp.projects.IAMCustomRole(
                f"{name}-recovery-{part.key}",
                role_id=suffix.hex.apply(partial(role_id, spec.name, part.key)),
                project=spec.project,
                title=f"rayslice {spec.name} recovery ({part.key})",
                description="What rayslice's recovery controller calls to recreate this cluster's "
                "slices (rayslice.recovery.permissions)",
                permissions=list(part.permissions),
                opts=child,
            )
            condition = None
            if part.templates_only:
                condition = gcp.projects.IAMMemberConditionArgs(
                    title=f"rayslice {spec.name} instance templates",
                    description="Only this cluster's slice templates (rayslice.recovery.permissions)",
                    expression=controller.project.apply(
                        partial(permissions.template_condition, prefixes=prefixes)
                    ),
                )
            if part.head_only:
                condition = gcp.projects.IAMMemberConditionArgs(
                    title=f"rayslice {spec.name} head VM",
                    description="Only this cluster's head VM, where Ray's demand is published "
                    "(rayslice.recovery.permissions)",
                    expression=controller.project.apply(
                        partial(permissions.instance_condition, zone=spec.zone, name=head_name(spec.name))
                    ),
                )
            grants += [
                role,
                gcp.projects.IAMMember(
                    f"{name}-recovery-{part.key}-binding",
                    project=controller.project,
                    role=role.name,
                    member=controller.member,
                    condition=condition,
                    opts=child,
                ),
            ]
        # On the hosts' account only (the service account's own policy, not the project's).
        grants.append(
            gcp.serviceaccount.IAMMember(
                f"{name}-controller-acts-as-hosts",
                service_account_id=hosts.name,
                role=permissions.ACT_AS_ROLE,
                member=controller.member,
                opts=child,
            )
        )
        return grants

    def _token(
        self, name: str, spec: ClusterSpec, readers: list[tuple[str, gcp.serviceaccount.Account]]
    ) -> list[pulumi.Resource]:
        """The token, its secret and each reader's grant; returns what hosts must wait for."""
        child = pulumi.ResourceOptions(parent=self)
        token = random.RandomPassword(f"{name}-ray-token", length=TOKEN_LENGTH, special=False, opts=child)
        secret = gcp.secretmanager.Secret(
            f"{name}-ray-token",
            secret_id=self.token_secret,
            project=spec.project,
            replication=gcp.secretmanager.SecretReplicationArgs(
                auto=gcp.secretmanager.SecretReplicationAutoArgs()
            ),
            labels=resource_labels(spec, "ray-token"),
            opts=child,
        )
        in_secret = pulumi.ResourceOptions(parent=secret)
        version = gcp.secretmanager.SecretVersion(
            f"{name}-ray-token-v1",
            secret=secret.id,
            secret_data=token.result,
            opts=in_secret,
        )
        return [
            version,
            *(
                gcp.secretmanager.SecretIamMember(
                    f"{name}-ray-token-{label}",
                    project=secret.project,
                    secret_id=secret.secret_id,
                    role=SECRET_ACCESSOR_ROLE,
                    member=account.member,
                    opts=in_secret,
                )
                for label, account in readers
            ),
        ]
