"""The controller VM's boot script and metadata: the recovery controller alone, apart from Ray.

The controller holds project-wide rights on TPU nodes or MIGs (`rayslice.recovery.permissions`),
so it runs where no Ray process and no user code runs: a small VM of its own, with its own
service account, that boots this script instead of the hosts' one. The script installs the two
libraries the controller imports (`bundle.RUNTIME_REQUIREMENTS`) and theirs from a lock shipped
with rayslice (`LOCK`: exact versions, the sha256 of each file, installed with pip's
``--require-hashes --no-deps``, wheels only), writes the controller from metadata
(`names.ATTR_RECOVERY_BUNDLE`) and runs it under a supervisor. The bundle's sha256 is rendered
into the script, and the script refuses a bundle whose hash differs: a bundle changed in
metadata after deployment never runs. So nothing this VM runs, with its project-wide rights, is
chosen by a package index: every file is named by a hash rendered into its boot script.
"""

from __future__ import annotations

import base64
import hashlib

from rayslice import capacity_table, catalog, names
from rayslice.recovery import bundle
from rayslice.recovery.scaling import ScalingPolicy
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts import locks
from rayslice.startup_scripts.options import PackageSource, RenderOptions
from rayslice.startup_scripts.templating import render_template
from rayslice.startup_scripts.variables import (
    EXIT_PERMANENT,
    EXIT_TEMPFAIL,
    METADATA_DEADLINE_S,
    RETRY_MAX_DELAY_S,
    SUPERVISOR_RESTART_DELAY_S,
    package_variables,
    record_variables,
)

TEMPLATE = "controller.sh.j2"
# The supervised services (a systemd unit on a VM, a restart loop on the simulator): the
# controller, and the shipper of its log and decisions to the record (`rayslice.observability.shipper`).
SERVICE = "rayslice-recovery"
RECORD_SERVICE = "rayslice-record"
# The controller's libraries, locked (`scripts/lock_presets.py controller` writes it from PyPI):
# resolved for the VM's python3 (`bundle.PYTHON`, the oldest of `locks.IMAGE_PYTHONS`), with the
# wheels of the later ones kept beside, for a simulator whose controller venv is made from its
# machine's python3.
LOCK = locks.ShippedLock("controller", bundle.RUNTIME_REQUIREMENTS)


def controller_lock() -> locks.Lock:
    """The shipped lock the controller VM installs."""
    return LOCK.read()


def controller_index(spec: ClusterSpec) -> str:
    """The index the controller VM installs its lock from: the spec's packageIndex when it is
    https, else PyPI (empty). Never a plain-http one, even with allowInsecurePackageIndex: the
    hashes would refuse a changed file, but the VM that holds project-wide rights takes nothing
    over a connection anyone on the path can read and rewrite."""
    index = spec.package_index or ""
    return index if index.startswith("https://") else ""


def controller_attributes(spec: ClusterSpec) -> dict[str, str]:
    """The ``rayslice-*`` metadata attributes of the controller VM: the controller itself and
    what it needs to find this cluster's slices."""
    return {
        names.ATTR_ROLE: names.CONTROLLER_VM_ROLE,
        names.ATTR_RECOVERY_BUNDLE: bundle.encoded(),
        names.ATTR_CLUSTER: spec.name,
        names.ATTR_PLATFORM: spec.platform,
        names.ATTR_NUM_SLICES: str(spec.slices),
        names.ATTR_CAPACITY: capacity_table.capacity_of(spec),
        **({names.ATTR_ELASTIC: scaling_policy(spec).to_json()} if spec.elastic else {}),
    }


def scaling_policy(spec: ClusterSpec) -> ScalingPolicy:
    """What an elastic cluster's controller needs of the spec (its bundle has no spec model):
    the range, the idle time, the slice's shape as Ray and the MIG see it, and the price cap."""
    assert spec.min_slices is not None and spec.zone is not None
    region = catalog.region_of(spec.zone)
    price = catalog.slice_hour_price(spec.tpu, region, spec.capacity)
    ceiling = spec.max_usd_per_hour
    cap = int(ceiling // price) if ceiling is not None and price is not None else None
    return ScalingPolicy(
        min_slices=spec.min_slices,
        idle_timeout_s=float(spec.idle_timeout_seconds),
        accelerator_type=catalog.reported_name(spec.accelerator_type),
        chips_per_slice=spec.tpu.chips,
        hosts_per_slice=spec.tpu.hosts,
        head_instance=names.head_name(spec.name),
        region=region,
        price_cap_slices=cap,
        ceiling=f"maxUsdPerHour={ceiling} ({catalog.format_price(price)} a slice)" if cap is not None else "",
        run_duration_s=spec.max_run_seconds,  # flex-start: slices come by resizing bulk MIGs from 0
    )


def install_fingerprint(source: PackageSource, index: str, lock: locks.Lock) -> str:
    """Changes whenever the controller VM would install something different."""
    text = repr((lock.digest, source.mode, source.location, index))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def controller_variables(spec: ClusterSpec, options: RenderOptions) -> dict[str, object]:
    source = PackageSource.parse(options.package_source)
    lock = controller_lock()
    index = controller_index(spec)
    return {
        # The shared install block, with the controller's own lock, its index and no TPU find-links.
        **package_variables(spec, source),
        **record_variables(options),
        "record_service": RECORD_SERVICE,
        "package_index": index,
        "find_links": [],
        "requirements": list(bundle.RUNTIME_REQUIREMENTS),  # named in the log; the lock is installed
        "lock": base64.b64encode(lock.text.encode()).decode(),
        "lock_digest": lock.digest,
        "lock_python": lock.header["python"],
        "root": options.root,
        "supervisor": options.supervisor,
        "service": SERVICE,
        "install_fingerprint": install_fingerprint(source, index, lock),
        "bundle_sha256": hashlib.sha256(bundle.build()).hexdigest(),
        "metadata_deadline_s": METADATA_DEADLINE_S,
        "retry_max_delay_s": RETRY_MAX_DELAY_S,
        "restart_delay_s": SUPERVISOR_RESTART_DELAY_S,
        "exit_tempfail": EXIT_TEMPFAIL,
        "exit_permanent": EXIT_PERMANENT,
        "guest_namespace": names.GUEST_ATTRIBUTE_NAMESPACE,
        "state_key": names.STATE_KEY,
        "state_watching": names.STATE_WATCHING,
        "attr_recovery_bundle": names.ATTR_RECOVERY_BUNDLE,
        "attr_cluster": names.ATTR_CLUSTER,
        "attr_platform": names.ATTR_PLATFORM,
        "attr_num_slices": names.ATTR_NUM_SLICES,
        "attr_capacity": names.ATTR_CAPACITY,
        "attr_elastic": names.ATTR_ELASTIC,
    }


def render_controller(spec: ClusterSpec, options: RenderOptions | None = None) -> str:
    """The controller VM's boot script; without `options`, for a real VM."""
    return render_template(TEMPLATE, **controller_variables(spec, options or RenderOptions()))
