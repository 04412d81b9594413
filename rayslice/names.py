"""Ports, names and scopes that more than one part of rayslice must agree on; defined once here.

The boot script, the firewall, the KubeRay manifests, the simulator and `rayslice run` all read
these. A value that only one module uses stays in that module.
"""

from __future__ import annotations

# Ray's ports. The dashboard port also serves the Jobs API that `rayslice run` submits to.
GCS_PORT = 6379
DASHBOARD_PORT = 8265
CLIENT_PORT = 10001
# jax.distributed's coordinator: JAX's own default moved to 8482 in 0.8.1, but GCP's default TPU
# firewall opens 8476, so rayslice pins it.
JAX_COORDINATOR_PORT = 8476
# Multislice (megascale) DCN traffic, the port MEGASCALE_PORT names.
MEGASCALE_PORT = 8081

# Each TPU host's metrics endpoint (`rayslice.startup_scripts.tpu_metrics`): 2112 is the port of
# GKE's TPU device plugin, the one Ray's reporter agent expects in TPU_DEVICE_PLUGIN_ADDR (Ray 2.60
# reporter_agent.py: "{HOST_IP}:2112"). Bound to the host's own address; only the firewall's
# internal rule (between the cluster's hosts) reaches it, never a source range outside.
TPU_METRICS_PORT = 2112

# The head's package cache (proxpi, `startup.sh.j2` run-cache): every host of the cluster installs
# through it. 3141 is devpi-server's default port, the one PyPI mirrors usually take.
PACKAGE_CACHE_PORT = 3141

# How long a Spot VM runs after its preemption notice (metadata `instance/preempted` turns TRUE,
# ACPI G2 soft off) before Compute Engine stops it: "up to 30 seconds" (Google's "Spot VMs" ->
# "Preemption process"). A host's preemption watcher gives Ray this deadline when it drains the
# node; `rayslice local preempt` waits this long between the notice and the power-off by default.
PREEMPTION_NOTICE_S = 30
# Where a job tells a host's preemption watcher that a Ray node's just-in-time checkpoint is
# committed, so that Ray may stop there at once: the key is the prefix and the node's id (hex), in
# this namespace of the GCS's key-value store (the watcher, which runs without rayslice, keeps a
# copy that tests/startup_scripts/test_preemption_watcher.py checks).
JIT_CHECKPOINT_NAMESPACE = "rayslice"
JIT_CHECKPOINT_KEY_PREFIX = "jit-checkpoint/"

# OAuth scope of every identity rayslice creates; IAM roles, not scopes, limit what it can do.
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

# A Compute Engine host's network interface, as per-instance configs name it (preservedState.internalIPs).
NIC = "nic0"

# Guest attributes a host publishes (instance/guest-attributes/<namespace>/<key>).
GUEST_ATTRIBUTE_NAMESPACE = "rayslice"
STATE_KEY = "state"
# Values of the state key: a host is WAITING on something outside it (``waiting: head``),
# RETRYING a step that failed transiently (``retrying: install (attempt 3)``), JOINED, or FAILED
# for a reason no retry can fix (``failed: <reason>``).
STATE_JOINED = "joined"
STATE_IMAGE_READY = "image ready"  # an image builder's last state, before it powers off
STATE_WATCHING = "watching"  # the controller VM's state once the recovery controller runs
STATE_WAITING_PREFIX = "waiting: "
STATE_RETRYING_PREFIX = "retrying: "
STATE_FAILED_PREFIX = "failed: "
# The head of an elastic cluster publishes Ray's pending demand and each slice's use under this
# key (JSON, `rayslice.recovery.demand`); the controller reads it through the Compute API.
DEMAND_KEY = "demand"

# Instance metadata attributes that infra writes and the boot script reads.
ATTR_HEAD_MODE = "rayslice-head-mode"
ATTR_HEAD_ADDRESS = "rayslice-head-address"
ATTR_SLICE_INDEX = "rayslice-slice-index"
ATTR_NUM_SLICES = "rayslice-num-slices"
ATTR_CONFIG_HASH = "rayslice-config-hash"
ATTR_ROLE = "rayslice-role"  # HEAD_VM_ROLE on the CPU head VM; absent on TPU hosts
ATTR_TOKEN_SECRET = "rayslice-token-secret"  # Secret Manager secret *name*, never the token
# Secret Manager secret *name* holding the package index's credentials (``USERNAME:PASSWORD``);
# hosts read it into uv's index credential variables, never into metadata or argv.
ATTR_INDEX_CREDENTIALS_SECRET = "rayslice-index-credentials-secret"
# The gs:// location of the cluster's JAX compilation cache (`rayslice.compilation_cache`), in
# the bucket infra declares; the boot script hands it to Ray's jobs.
ATTR_COMPILATION_CACHE = "rayslice-compilation-cache"
# The gs:// prefix of the cluster's record (`rayslice.observability.record`), in the record bucket
# infra declares or names; every machine's record shipper writes there as it runs.
ATTR_RECORD = "rayslice-record"
# Where Google's attributes do not identify a host's worker (`platforms.VmPlatform`'s
# `rayslice_names_hosts`: Compute Engine), infra writes the slice's name and its hosts' instance
# names (comma-separated, in worker order); a host's worker number is the position of its own
# instance/name in that list.
ATTR_SLICE_NAME = "rayslice-slice-name"
ATTR_SLICE_HOSTS = "rayslice-slice-hosts"
# The controller VM of a cluster with recovery (`ClusterSpec.runs_recovery`) gets the controller
# (`rayslice.recovery.bundle`, base64) and what it needs to find this cluster's slices; no
# other VM carries these.
ATTR_RECOVERY_BUNDLE = "rayslice-recovery-bundle"
ATTR_CLUSTER = "rayslice-cluster"
ATTR_PLATFORM = "rayslice-platform"
ATTR_CAPACITY = "rayslice-capacity"  # the stack's capacity cell key (capacity_table), on the controller VM
ATTR_ELASTIC = "rayslice-elastic"  # an elastic cluster's scaling policy (JSON), on the controller VM
HEAD_VM_ROLE = "head-vm"
HEAD_VM_SLICE_INDEX = -1  # the slice index the CPU head VM's attributes carry
# The VM that runs only the recovery controller: no Ray, no user code (`controller_name`).
CONTROLLER_VM_ROLE = "controller-vm"
# The instance `rayslice image` boots to bake a host image: its boot script installs the hosts'
# packages, publishes STATE_IMAGE_READY and powers the instance off (`rayslice.infra.image`).
IMAGE_BUILDER_ROLE = "image-builder"

# Ray's TPU slice label (ray.util.tpu and the workloads read it).
SLICE_NAME_LABEL = "ray.io/tpu-slice-name"
# The Ray node label the boot script puts on every TPU host's node, valued with the spec's
# `platform`: the bundled jobs look the slice's shape up in the catalog of that platform.
PLATFORM_LABEL = "rayslice.io/platform"


def slice_name(cluster: str, index: int) -> str:
    """Slice `index` of cluster `cluster`: its TPU VM, MIG or GKE node pool."""
    return f"{cluster}-slice-{index}"


def head_name(cluster: str) -> str:
    """The CPU head VM (head=vm)."""
    return f"{cluster}-head"


def controller_name(cluster: str) -> str:
    """The VM that runs the recovery controller of a cluster with recovery."""
    return f"{cluster}-controller"


def gke_namespace(cluster: str) -> str:
    """The Kubernetes namespace of a GKE cluster's Ray objects: infra creates it, `rayslice
    status` names it in the kubectl command that lists the Ray pods."""
    return f"rayslice-{cluster}"


def host_name(slice_name: str, worker: int) -> str:
    """Instance name of host `worker` of a slice, wherever rayslice names hosts.

    Infra names a Compute Engine slice's hosts so (its MIG's per-instance configs): sequential
    and predictable, so it can list a slice's hosts in ``ATTR_SLICE_HOSTS`` before they exist.
    The Cloud TPU API names a TPU VM's workers itself and nothing in rayslice reads those names;
    the simulator names the hosts of both platforms by this rule.
    """
    return f"{slice_name}-w{worker}"


def host_worker(slice_name: str, name: str) -> int | None:
    """The worker number `host_name` gave instance `name` of slice `slice_name`; None for a name
    the MIG made itself (a flex-start slice's hosts) or one of another slice."""
    worker = name.rpartition("-w")[2]
    return int(worker) if worker.isdecimal() and host_name(slice_name, int(worker)) == name else None


def address_name(host: str) -> str:
    """The reserved internal address of a Compute Engine host (``<host>-ip``): infra reserves it
    for every host of every slice, and the host keeps it through recreations (its per-instance
    config's preserved state, made by Pulumi or, for an elastic slice, by the controller)."""
    return f"{host}-ip"


def request_name(slice_name: str) -> str:
    """The request that waits for a slice's capacity (``<slice>-request``): a flex-start MIG's
    resize request on compute, a queued resource on tpu-vm. Infra declares it, the recovery
    controller makes it again when it recreates the slice, status reads it."""
    return f"{slice_name}-request"


def slice_host_names(slice_name: str, hosts: int) -> list[str]:
    """`host_name` of each of a slice's `hosts` hosts, worker 0 first."""
    return [host_name(slice_name, worker) for worker in range(hosts)]
