"""Who the hosts are: a dedicated service account with only what a host needs, and the Ray token.

A host writes logs and metrics and, with ``rayAuth=token``, reads the cluster's Ray token. The
account gets exactly those three permissions, the last one on the one secret only (not on
the project). The token is a `random.RandomPassword`: generated at the stack's first
``pulumi up`` and then kept in the stack's state (encrypted as a secret), so every later run
and every rebooted host sees the same token. It reaches hosts only through Secret Manager:
metadata carries the secret's *name*, and no output carries the value.

IAM is eventually consistent: a new account and its grants can take a while to be usable.
pulumi-gcp's own TPU example (``tpu_v2_vm_full``) waits 60 s after creating the account
before creating the VM; rayslice does the same with a `pulumiverse_time.Sleep` after every
grant, and `ready` is what hosts depend on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_random as random
import pulumiverse_time as time

from rayslice.infra.labels import resource_labels
from rayslice.spec import ClusterSpec

# Project-level roles of the hosts' account: Cloud Logging and Cloud Monitoring writers.
HOST_PROJECT_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter")
SECRET_ACCESSOR_ROLE = "roles/secretmanager.secretAccessor"
TOKEN_LENGTH = 48
_ACCOUNT_ID_MAX = 30
# How long hosts wait after the grants (pulumi-gcp's TPU example waits 60 s after the account).
IAM_PROPAGATION_WAIT = "60s"


def account_id(cluster_name: str) -> str:
    """The service account ID (6-30 characters) for a cluster name of up to 40 characters.

    Names that do not fit are cut and given a hash of the full name, so two long cluster names
    that share a prefix still get different accounts.
    """
    wanted = f"{cluster_name}-hosts"
    if len(wanted) <= _ACCOUNT_ID_MAX:
        return wanted
    digest = hashlib.sha256(cluster_name.encode()).hexdigest()[:6]
    head = cluster_name[: _ACCOUNT_ID_MAX - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}"


def token_secret_id(spec: ClusterSpec) -> str:
    """The Secret Manager secret that holds the Ray token (the name hosts find in metadata)."""
    return f"{spec.name}-ray-token"


@dataclass(frozen=True)
class ClusterIdentityArgs:
    spec: ClusterSpec


class ClusterIdentity(pulumi.ComponentResource):
    """The hosts' service account and, with rayAuth=token, the token's secret."""

    service_account_email: pulumi.Output[str]
    token_secret: str | None  # the secret ID, known before deployment; None without token auth
    ready: time.Sleep  # created IAM_PROPAGATION_WAIT after every grant; hosts depend on it

    def __init__(self, name: str, args: ClusterIdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:infra:ClusterIdentity", name, None, opts)
        spec = args.spec
        child = pulumi.ResourceOptions(parent=self)
        account = gcp.serviceaccount.Account(
            f"{name}-hosts",
            account_id=account_id(spec.name),
            project=spec.project,
            display_name=f"rayslice {spec.name} hosts",
            description="Ray hosts of a rayslice cluster: write logs and metrics, read the Ray token",
            opts=child,
        )
        grants: list[pulumi.Resource] = [account]
        for role in HOST_PROJECT_ROLES:
            grant = gcp.projects.IAMMember(
                f"{name}-{role.split('/')[-1]}",
                project=account.project,
                role=role,
                member=account.member,
                opts=child,
            )
            grants.append(grant)
        self.service_account_email = account.email
        self.token_secret = None
        if spec.ray_auth == "token":
            self.token_secret = token_secret_id(spec)
            grants.extend(self._token(name, spec, account))
        if spec.package_index_credentials_secret is not None:
            # The user's own secret (rayslice never creates or reads it): hosts may read it only.
            grants.append(
                gcp.secretmanager.SecretIamMember(
                    f"{name}-index-credentials-reader",
                    project=account.project,
                    secret_id=spec.package_index_credentials_secret,
                    role=SECRET_ACCESSOR_ROLE,
                    member=account.member,
                    opts=child,
                )
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
                "token_secret": self.token_secret,
            }
        )

    def _token(
        self, name: str, spec: ClusterSpec, account: gcp.serviceaccount.Account
    ) -> list[pulumi.Resource]:
        """The token, its secret and the hosts' read grant; returns what hosts must wait for."""
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
        reader = gcp.secretmanager.SecretIamMember(
            f"{name}-ray-token-reader",
            project=secret.project,
            secret_id=secret.secret_id,
            role=SECRET_ACCESSOR_ROLE,
            member=account.member,
            opts=in_secret,
        )
        return [version, reader]
