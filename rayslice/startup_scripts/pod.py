"""The pod start command on GKE: the container flavour of the boot script.

On a TPU VM the boot script reads the host's identity from GCE metadata. A KubeRay pod has no
such metadata, and KubeRay does not set `TPU_WORKER_ID` / `TPU_WORKER_HOSTNAMES` itself (the
separate kuberay-tpu-webhook does). rayslice derives them in the container instead, from what
KubeRay 1.7 already puts on every multi-host worker pod: the labels
``ray.io/worker-group-replica-index`` (which slice) and ``ray.io/replica-host-index`` (which host
of the slice), passed in through the downward API. Each (slice, host) pair has its own headless
Service that selects exactly that pod, so the hostnames are stable DNS names that Python computes
here, once: the script never rebuilds a name from a pattern.

The script itself (``pod_start.sh.j2``) goes through the same Jinja environment as the boot
script, installs the same requirement lines from the same package sources, then runs the
``ray start`` command KubeRay generated from the RayCluster's ``rayStartParams``.
"""

from __future__ import annotations

from rayslice import names
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts.locks import Lock
from rayslice.startup_scripts.options import PackageSource
from rayslice.startup_scripts.templating import render_template
from rayslice.startup_scripts.variables import PYTHON_VERSION, package_variables

TEMPLATE = "pod_start.sh.j2"

# Multislice: the port the megascale coordinator (worker 0 of slice 0) listens on.

# Labels KubeRay >= 1.5 (feature gate RayMultiHostIndexing, on by default in 1.7) sets on worker pods.
LABEL_REPLICA_INDEX = "ray.io/worker-group-replica-index"
LABEL_HOST_INDEX = "ray.io/replica-host-index"  # multi-host groups only

# Environment the RayCluster manifest gives the container (downward API or literal values).
ENV_ROLE = "RAYSLICE_ROLE"  # "head" or "worker"
ENV_REPLICA_INDEX = "RAYSLICE_REPLICA_INDEX"  # <- label ray.io/worker-group-replica-index
ENV_HOST_INDEX = "RAYSLICE_HOST_INDEX"  # <- label ray.io/replica-host-index
ENV_POD_IP = "RAYSLICE_POD_IP"  # <- status.podIP
# Read by the script, not set by the manifest: seconds to wait for the pod's own DNS name.
ENV_DNS_DEADLINE = "RAYSLICE_DNS_DEADLINE_S"
DNS_DEADLINE_S = 300


def host_service_name(spec: ClusterSpec, slice_index: int, host: int) -> str:
    """The headless Service (and so the DNS name) of one TPU host: ``<name>-s<slice>-h<host>``."""
    return f"{spec.name}-s{slice_index}-h{host}"


def slice_hostnames(spec: ClusterSpec, slice_index: int) -> list[str]:
    """`TPU_WORKER_HOSTNAMES` of one slice, ordered by TPU worker id."""
    return [host_service_name(spec, slice_index, host) for host in range(spec.tpu.hosts)]


def pod_variables(
    spec: ClusterSpec, package_source: str | None = None, lock: Lock | None = None
) -> dict[str, object]:
    """Every value the pod start script uses.

    `package_source` has the boot script's meaning (`RenderOptions.package_source`): None installs
    from PyPI or the spec's packageIndex, ``wheels:DIR`` offline from a wheelhouse, ``venv:DIR``
    runs Ray from an existing venv without installing (tests, or an image built with everything).
    """
    return {
        **package_variables(spec, PackageSource.parse(package_source), lock),
        "hosts": spec.tpu.hosts,
        "num_slices": spec.slices,
        "slice_names": [spec.slice_name(i) for i in range(spec.slices)],
        "slice_hostnames": [",".join(slice_hostnames(spec, i)) for i in range(spec.slices)],
        "megascale_coordinator": host_service_name(spec, 0, 0),
        "megascale_port": names.MEGASCALE_PORT,
        "dns_deadline_s": DNS_DEADLINE_S,
        "env_role": ENV_ROLE,
        "env_replica_index": ENV_REPLICA_INDEX,
        "env_host_index": ENV_HOST_INDEX,
        "env_pod_ip": ENV_POD_IP,
        "env_dns_deadline": ENV_DNS_DEADLINE,
    }


def render_pod_start(spec: ClusterSpec, package_source: str | None = None, lock: Lock | None = None) -> str:
    """The start script every Ray container of a GKE cluster runs (head and TPU workers);
    `lock` is the stack's lock (`stack_locks`), if it has one."""
    return render_template(TEMPLATE, **pod_variables(spec, package_source, lock))


def ray_image(spec: ClusterSpec) -> str:
    """The pinned Ray image: the spec's Ray version on the Python the boot script installs."""
    return f"rayproject/ray:{spec.ray_version}-py{PYTHON_VERSION.replace('.', '')}"
