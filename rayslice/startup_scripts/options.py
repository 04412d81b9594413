"""How a script is rendered: the few knobs where a real host and a simulated one differ.

Both `rayslice.startup_scripts` (rendering) and `variables` (what the templates get) read these,
so they live apart from both.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayslice.errors import InvalidInput


@dataclass(frozen=True)
class PackageSource:
    """Where hosts get their packages, parsed once from ``None`` | ``wheels:DIR`` | ``venv:DIR``.

    ``pypi`` installs from PyPI or the spec's packageIndex; ``wheels`` installs offline from a
    local wheelhouse; ``venv`` reuses an existing venv that already has everything (no install).
    """

    mode: str
    location: str = ""

    @classmethod
    def parse(cls, text: str | None) -> PackageSource:
        if text is None:
            return cls("pypi")
        mode, sep, location = text.partition(":")
        if not sep or mode not in ("wheels", "venv") or not location:
            raise InvalidInput(f"package source must be wheels:DIR or venv:DIR, not {text!r}")
        return cls(mode, location)


@dataclass(frozen=True)
class RenderOptions:
    """Where a real host and a simulated one differ; the defaults are a real TPU VM.

    supervisor: ``systemd`` (a unit with Restart=always) or ``process`` (a restart loop in a
        plain background process, for hosts without systemd such as the simulator).
    package_source: None installs from PyPI (or the spec's packageIndex); ``wheels:DIR`` installs
        offline from a local wheelhouse; ``venv:DIR`` reuses an existing venv that already has
        everything (no install at all).
    root: prefix of every path the script writes (state, logs, venv, token file, Ray's temp dir).
    object_store_bytes: Ray's object store size per node; 0 lets the script take a quarter of the
        host's memory. Simulated hosts share one /dev/shm, so the simulator sets it small.
    compilation_cache: where Ray's jobs keep JAX's persistent compilation cache
        (`rayslice.compilation_cache`), an absolute path every host sees (the simulator's shared
        folder); empty: the bucket that infra names in the host's metadata, if any.
    record: the cluster's record (`rayslice.observability.record`), a folder every machine sees
        and may create files in (the simulator's record folder, as its machines see it); empty:
        the gs:// prefix that infra names in the machine's metadata, if any.
    """

    supervisor: str = "systemd"
    package_source: str | None = None
    root: str = ""
    object_store_bytes: int = 0
    compilation_cache: str = ""
    record: str = ""

    def __post_init__(self) -> None:
        if self.supervisor not in ("systemd", "process"):
            raise InvalidInput(f"supervisor must be systemd or process, not {self.supervisor!r}")
        PackageSource.parse(self.package_source)  # refuses anything but None, wheels:DIR, venv:DIR
        for knob, value in (("compilation_cache", self.compilation_cache), ("record", self.record)):
            if value and not value.startswith("/"):
                raise InvalidInput(f"{knob} must be an absolute path every host sees, not {value!r}")
