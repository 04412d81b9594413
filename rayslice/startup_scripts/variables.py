"""Everything the boot scripts need, computed in Python so the templates only lay it out."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

from rayslice import capacity_table, catalog, compilation_cache, names, shipping
from rayslice.errors import InvalidInput
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts import locks
from rayslice.startup_scripts.options import PackageSource, RenderOptions

# The guide's two requirement sets, torch pinned exactly: torch_xla 2.9.0 is built against torch
# 2.9.0 (its wheel does not declare it, so `torch~=2.9.0` locked torch 2.9.1); libtpu wheels for
# torch_xla come from Google's find-links pages, as in the guide. The jax preset also carries
# what the bundled JAX training jobs import (jax_train, jax_trainer): optax for the optimizer,
# orbax-checkpoint for their checkpoints, pinned to the minor releases they were tested with; and
# etils' `epath-gcs` extra, through which JAX reads a compilation cache in a bucket (gs://): JAX's
# cache opens a non-local directory with etils.epath (jax/_src/lru_cache.py: "Please install the
# `etils[epath]` package..."), whose gs:// backend is fsspec's gcsfs (etils/epath/backend.py,
# `_FileSystemSpecBackend`; etils 1.15's extra `epath-gcs` requires gcsfs).
PRESETS: dict[str, tuple[str, ...]] = {
    "jax": (
        "jax[tpu]>=0.10.2,<0.11",
        "optax>=0.2.8,<0.3",
        "orbax-checkpoint>=0.12.8,<0.13",
        "etils[epath-gcs]>=1.15,<2",
    ),
    "xla": ("torch==2.9.0", "torch_xla[tpu]==2.9.0"),
}
PRESET_FIND_LINKS: dict[str, tuple[str, ...]] = {
    "jax": (),
    "xla": (
        "https://storage.googleapis.com/libtpu-releases/index.html",
        "https://storage.googleapis.com/libtpu-wheels/index.html",
    ),
}

# uv, pinned by version and by the sha256 of each wheel a host may install (pip
# --require-hashes refuses anything else). Hashes of the files PyPI serves for uv 0.13.9,
# computed here with `pip download uv==0.13.9 --no-deps --only-binary :all: --platform …` and
# `sha256sum`. TPU hosts and the head VM are x86_64 (an Arm headMachineType is refused,
# `catalog.ARM_MACHINE_FAMILIES`); the aarch64 wheel's hash predates that refusal, and dropping it
# would change every rendered boot script, so every deployed host.
UV_VERSION = "0.13.9"
UV_WHEEL_SHA256 = (
    "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",  # manylinux_2_17_x86_64
    "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",  # manylinux_2_17_aarch64
)

# Secret Manager's REST endpoint; a host reads `projects/*/secrets/*/versions/latest:access`,
# whose answer is {"name": …, "payload": {"data": <base64>}} (Secret Manager API reference,
# projects.secrets.versions.access).
SECRET_MANAGER_API = "https://secretmanager.googleapis.com/v1"
# uv reads a named index's credentials from UV_INDEX_<NAME>_USERNAME / _PASSWORD (uv docs,
# "Package indexes" → "Providing credentials directly"); the index is passed as NAME=URL.
INDEX_NAME = "rayslice"

# The head's package cache (`startup.sh.j2`, run-cache): proxpi, a maintained caching proxy of a
# PEP 503 index (github.com/EpicWink/proxpi; its PROXPI_* settings are in its README), served by
# gunicorn. Installed on the head from the index itself, into a venv of its own.
CACHE_REQUIREMENTS = ("proxpi==1.3.1", "gunicorn==27.0.1")
# ... and theirs, each pinned to the sha256 of its wheels (`scripts/lock_presets.py package-cache`
# writes it from PyPI), installed with --require-hashes --no-deps: the cache holds the index's
# credentials and serves every host, so no index chooses what it runs. Resolved for the oldest
# Python the head may make the cache's venv with (an offline head's image python3, `choose_python`).
CACHE_LOCK = locks.ShippedLock("package-cache", CACHE_REQUIREMENTS)
# uv's name for the cache as an index: not INDEX_NAME, so the index's credentials are never sent to it.
CACHE_INDEX_NAME = "rayslice-cache"
# How long a host waits for the cache to answer before it installs from the index itself (at a
# cold boot the head installs the cache first, a few MB), and how long one request may wait while
# the cache downloads a file for it (the largest wheels are hundreds of MB over the head's link).
CACHE_WAIT_S = 120
CACHE_DOWNLOAD_TIMEOUT_S = 900
# uv's and pip's read timeout against the index itself (uv's default is 30 s).
INDEX_TIMEOUT_S = 60
# gunicorn's configuration file on the head: it fixes a race in proxpi (see the file).
PACKAGE_CACHE_CONF = Path(__file__).with_name("package_cache_conf.py")

# Seconds, each overridable on the host by the RAYSLICE_*_S variable of the same name (tests).
METADATA_DEADLINE_S = 300  # boot gives up (exit 1, logged) when the metadata server never answers
TOKEN_DEADLINE_S = 600  # one round of Secret Manager retries; the supervisor then starts over
RETRY_MAX_DELAY_S = 60  # backoff cap of every retried step
SUPERVISOR_RESTART_DELAY_S = 5
# Exit statuses of the supervised run: TEMPFAIL is restarted, CONFIG ends supervision (sysexits.h).
EXIT_TEMPFAIL = 75
EXIT_PERMANENT = 78
PYTHON_VERSION = "3.11"


# Scripts the boot script carries: each file's text goes into it (base64, one line, so the quoting
# filter takes it), and the host writes it out and runs it with the venv's Python.
# The hosts' preemption watcher.
PREEMPTION_WATCHER = Path(__file__).with_name("preemption_watcher.py")
# An elastic cluster's head publishes Ray's demand for the controller every this many seconds
# (RAYSLICE_DEMAND_INTERVAL_S overrides it on the host).
DEMAND_PUBLISHER = Path(__file__).with_name("demand_publisher.py")
DEMAND_INTERVAL_S = 5
# The TPU metrics exporter every host runs (`tpu_metrics`; on a host without chips it exits).
TPU_METRICS = Path(__file__).with_name("tpu_metrics.py")
# How long a TPU host's run_ray waits for its exporter before starting Ray without
# TPU_DEVICE_PLUGIN_ADDR: Ray's agent gives the endpoint one try and stops asking if it fails.
TPU_METRICS_WAIT_S = 30


# The record shipper every machine runs (`rayslice.observability.shipper`): its import closure in
# rayslice (checked by tests/startup_scripts/test_record_shipper.py), carried as a zipapp.
RECORD_SHIPPER_MODULES = (
    "rayslice/__init__.py",
    "rayslice/errors.py",
    "rayslice/observability/__init__.py",
    "rayslice/observability/gcs.py",
    "rayslice/observability/nofollow.py",
    "rayslice/observability/record.py",
    "rayslice/observability/redaction.py",
    "rayslice/observability/shipper.py",
    "rayslice/observability/untrusted.py",
)
RECORD_SHIPPER_ENTRY = "rayslice.observability.shipper"
# How often it ships what the logs gained (RAYSLICE_RECORD_INTERVAL_S overrides it on a machine).
RECORD_INTERVAL_S = 5
RECORD_SHIPPER_MAIN = (
    '"""rayslice record shipper (see rayslice/observability/shipper.py)."""\n'
    "import sys\n\n"
    f"from {RECORD_SHIPPER_ENTRY} import main\n\n"
    "sys.exit(main())\n"
)


def _carried(script: Path) -> str:
    return base64.b64encode(script.read_bytes()).decode()


def preemption_watcher(spec: ClusterSpec) -> str:
    """The watcher as the boot script carries it: only slices whose cell lists a Spot preemption
    get a notice, so only their script has one to start (empty otherwise)."""
    preemptible = capacity_table.cell_for(spec).action(capacity_table.PREEMPTION) is not None
    return _carried(PREEMPTION_WATCHER) if preemptible else ""


def demand_publisher(spec: ClusterSpec) -> str:
    """The demand publisher as the boot script carries it: only an elastic cluster's controller
    reads the demand, so only its head has one to start (empty otherwise)."""
    return _carried(DEMAND_PUBLISHER) if spec.elastic else ""


def tpu_metrics_variables(spec: ClusterSpec) -> dict[str, object]:
    """The exporter and what it labels its samples with: `model` as GKE's device plugin names
    the accelerator (Ray shows it as the TPU type), the generation's name where GKE has none."""
    generation = catalog.generation(spec.tpu.generation)
    return {
        "tpu_metrics": _carried(TPU_METRICS),
        "tpu_metrics_port": names.TPU_METRICS_PORT,
        "tpu_metrics_model": generation.gke_accelerator or generation.name,
        "tpu_metrics_wait_s": TPU_METRICS_WAIT_S,
    }


# Ray's extras every host installs: `default` for the dashboard, the Jobs API and the autoscaler
# SDK; `train` for `ray.train` (JaxTrainer, ray.train.report, elastic scaling), which refuses to
# import without pandas, pyarrow and tensorboardX (Ray's setup.py, extra "train").
RAY_EXTRAS = "default,train"


def lock_requirements(preset: str, ray_version: str) -> list[str]:
    """The lines a preset's lock is resolved from: the preset's and Ray's."""
    return [*PRESETS[preset], f"ray[{RAY_EXTRAS}]=={ray_version}"]


def requirement_lines(spec: ClusterSpec) -> list[str]:
    """The pip requirement lines every host installs, in install order."""
    return [*lock_requirements(spec.preset, spec.ray_version), *spec.requirements]


def whole_lock_header(
    preset: str, ray_version: str, requirements: tuple[str, ...] = (), index: str | None = None
) -> dict[str, str]:
    """The header of a lock of a preset's lines with Ray `ray_version` (and `requirements`),
    resolved together: a shipped preset lock (`scripts/lock_presets.py`, PyPI) or the stack lock
    of a Ray release no preset lock was made for (`stack_locks`, the spec's index). Both are
    resolved without the `xla` preset's find-links pages (docs/boot-script.md, "The xla preset"),
    so a lock for another Ray release comes from the same sources as the shipped one."""
    lines = [*lock_requirements(preset, ray_version), *requirements]
    return locks.header(preset, lines, PYTHON_VERSION, index, ())


def _for_the_hosts(lock: locks.Lock, what: str, remedy: str) -> locks.Lock:
    """`lock`, if it was resolved for the hosts' Python and platform and holds only pins, hashes
    and comments (`locks.foreign_line`); else refused (exit 2) before anything is rendered, so
    before anything is created: its files would not install, or something no hash pins would."""
    problem = locks.foreign_line(lock.text)
    if problem:
        raise InvalidInput(f"{what} cannot be installed: {problem}; {remedy}")
    if (lock.header["python"], lock.header["platform"]) != (PYTHON_VERSION, locks.PLATFORM):
        raise InvalidInput(
            f"{what} is for Python {lock.header['python']} on {lock.header['platform']}, but the hosts "
            f"run Python {PYTHON_VERSION} on {locks.PLATFORM}; {remedy}"
        )
    return lock


def preset_lock(spec: ClusterSpec) -> locks.Lock | None:
    """The shipped lock of the spec's preset and Ray (None for a Ray release it was not made for),
    refused if it does not fit the hosts."""
    lock = locks.preset_lock(spec.preset, lock_requirements(spec.preset, spec.ray_version))
    if lock is None:
        return None
    return _for_the_hosts(
        lock, f"the {spec.preset} preset's lock", "regenerate it with scripts/lock_presets.py"
    )


def host_lock(spec: ClusterSpec, stack_lock: locks.Lock | None = None) -> locks.Lock | None:
    """The lock a host installs: the stack's (`stack_locks`: resolved on the deployer's machine)
    if there is one, else the preset's. A stack lock made for another Python or platform (one
    a program built or passed itself) is refused as a preset lock is."""
    if stack_lock is None:
        return preset_lock(spec)
    return _for_the_hosts(
        stack_lock, "the stack lock", "make it with rayslice.startup_scripts.stack_locks.StackLocks.lock"
    )


def host_requirements(spec: ClusterSpec, stack_lock: locks.Lock | None = None) -> list[str]:
    """What a host resolves itself: nothing beside a stack lock, the user's lines beside a preset
    lock (where no stack lock was made: the simulator's wheelhouse hosts), every line without one."""
    if stack_lock is not None:
        return []
    return list(spec.requirements) if preset_lock(spec) else requirement_lines(spec)


def install_fingerprint(
    spec: ClusterSpec, source: PackageSource, stack_lock: locks.Lock | None = None
) -> str:
    """Changes whenever a host would install something different (the reboot fast-path key). With
    a lock, its digest stands for what it pins: a new lock changes it, an unchanged one does not."""
    lock = host_lock(spec, stack_lock)
    payload = {
        "lock": lock.digest if lock else None,
        "requirements": host_requirements(spec, stack_lock),
        "find_links": lock.find_links if lock else PRESET_FIND_LINKS[spec.preset],
        "index": spec.package_index,
        "source": [source.mode, source.location],
        "python": PYTHON_VERSION,
        "uv": UV_VERSION,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def package_variables(
    spec: ClusterSpec, source: PackageSource, stack_lock: locks.Lock | None = None
) -> dict[str, object]:
    """The variables of the install block both templates include (``_install.sh.j2``): the lock
    (base64, one line, so the quoting filter takes it; empty without one) and what is resolved
    beside it."""
    lock = host_lock(spec, stack_lock)
    return {
        "package_mode": source.mode,
        "package_dir": source.location,
        "package_index": spec.package_index or "",
        "index_name": INDEX_NAME,
        "find_links": lock.find_links if lock else list(PRESET_FIND_LINKS[spec.preset]),
        "requirements": host_requirements(spec, stack_lock),
        "lock": base64.b64encode(lock.text.encode()).decode() if lock else "",
        "lock_digest": lock.digest if lock else "",
        "lock_python": lock.header["python"] if lock else "",
    }


def cache_variables(spec: ClusterSpec, source: PackageSource) -> dict[str, object]:
    """The package cache's variables: on only when hosts install from an index (not from a
    wheelhouse or a prepared venv) and the spec keeps `packageCache` on."""
    cache = spec.package_cache and source.mode == "pypi"
    lock = CACHE_LOCK.read() if cache else None
    return {
        "package_cache": "1" if cache else "0",
        "package_cache_conf": _carried(PACKAGE_CACHE_CONF) if cache else "",
        "index_timeout_s": INDEX_TIMEOUT_S,
        "package_cache_port": names.PACKAGE_CACHE_PORT,
        "cache_index_name": CACHE_INDEX_NAME,
        "cache_requirements": list(CACHE_REQUIREMENTS),
        "cache_lock": base64.b64encode(lock.text.encode()).decode() if lock else "",
        "cache_lock_digest": lock.digest if lock else "",
        "cache_wait_s": CACHE_WAIT_S,
        "cache_download_timeout_s": CACHE_DOWNLOAD_TIMEOUT_S,
    }


def compilation_cache_variables(options: RenderOptions) -> dict[str, object]:
    """JAX's persistent compilation cache for Ray's jobs (`rayslice.compilation_cache`): the
    rendered location (the simulator's shared folder; empty on the cloud, where the host reads
    its bucket's from metadata) and the settings beside it."""
    return {
        "compilation_cache": options.compilation_cache,
        "attr_compilation_cache": names.ATTR_COMPILATION_CACHE,
        "compilation_cache_variable": compilation_cache.CACHE_DIR_VARIABLE,
        "compilation_cache_settings": [f"{k}={v}" for k, v in compilation_cache.SETTINGS.items()],
    }


def record_variables(options: RenderOptions) -> dict[str, object]:
    """The record shipper (a reproducible zipapp, base64) and where it writes: the rendered folder
    (the simulator's record) or, empty, the gs:// prefix infra names in the machine's metadata."""
    bundle = shipping.zipapp(RECORD_SHIPPER_MODULES, RECORD_SHIPPER_MAIN)
    return {
        "record_shipper": base64.b64encode(bundle).decode("ascii"),
        "record": options.record,
        "attr_record": names.ATTR_RECORD,
        "record_interval_s": RECORD_INTERVAL_S,
    }


def host_types(spec: ClusterSpec) -> list[str]:
    """Every name a host of the spec's slice may report as its ``accelerator-type``: the spec's
    own and the host's spelling of it (`catalog.reported_name`: a TPU7x host reports ``v7x-16``
    for the ``tpu7x-16`` that Compute Engine is asked for)."""
    spellings = (spec.accelerator_type, catalog.canonical_name(spec.accelerator_type))
    return list(dict.fromkeys((*spellings, catalog.reported_name(spec.accelerator_type))))


def script_variables(
    spec: ClusterSpec, options: RenderOptions, stack_lock: locks.Lock | None = None
) -> dict[str, object]:
    source = PackageSource.parse(options.package_source)
    return {
        **package_variables(spec, source, stack_lock),
        **cache_variables(spec, source),
        **tpu_metrics_variables(spec),
        **compilation_cache_variables(options),
        **record_variables(options),
        "accelerator_type": spec.accelerator_type,
        "host_types": host_types(spec),
        "platform": spec.platform,
        "platform_label": names.PLATFORM_LABEL,
        "topology": spec.tpu.topology,
        "hosts": spec.tpu.hosts,
        "chips_per_host": spec.tpu.chips_per_host,
        "tpu_resources": json.dumps({"TPU": spec.tpu.chips_per_host}),
        "root": options.root,
        "supervisor": options.supervisor,
        "install_fingerprint": install_fingerprint(spec, source, stack_lock),
        "python_version": PYTHON_VERSION,
        "uv_requirement": f"uv=={UV_VERSION}",
        "uv_hashes": [f"--hash=sha256:{digest}" for digest in UV_WHEEL_SHA256],
        "ray_auth_mode": "token" if spec.ray_auth == "token" else "disabled",
        "gcs_port": names.GCS_PORT,
        "dashboard_port": names.DASHBOARD_PORT,
        "client_port": names.CLIENT_PORT,
        "object_store_bytes": options.object_store_bytes or 0,
        "metadata_deadline_s": METADATA_DEADLINE_S,
        "token_deadline_s": TOKEN_DEADLINE_S,
        "retry_max_delay_s": RETRY_MAX_DELAY_S,
        "restart_delay_s": SUPERVISOR_RESTART_DELAY_S,
        "exit_tempfail": EXIT_TEMPFAIL,
        "exit_permanent": EXIT_PERMANENT,
        "secret_manager_api": SECRET_MANAGER_API,
        "guest_namespace": names.GUEST_ATTRIBUTE_NAMESPACE,
        "state_key": names.STATE_KEY,
        "attr_head_mode": names.ATTR_HEAD_MODE,
        "attr_head_address": names.ATTR_HEAD_ADDRESS,
        "attr_slice_index": names.ATTR_SLICE_INDEX,
        "attr_num_slices": names.ATTR_NUM_SLICES,
        "attr_config_hash": names.ATTR_CONFIG_HASH,
        "attr_role": names.ATTR_ROLE,
        "head_vm_role": names.HEAD_VM_ROLE,
        "image_builder_role": names.IMAGE_BUILDER_ROLE,
        "state_image_ready": names.STATE_IMAGE_READY,
        "attr_token_secret": names.ATTR_TOKEN_SECRET,
        "attr_index_credentials_secret": names.ATTR_INDEX_CREDENTIALS_SECRET,
        "attr_slice_name": names.ATTR_SLICE_NAME,
        "attr_slice_hosts": names.ATTR_SLICE_HOSTS,
        "preemption_watcher": preemption_watcher(spec),
        "preemption_notice_s": names.PREEMPTION_NOTICE_S,
        "demand_publisher": demand_publisher(spec),
        "demand_key": names.DEMAND_KEY,
        "demand_interval_s": DEMAND_INTERVAL_S,
        "slice_name_label": names.SLICE_NAME_LABEL,
    }
