"""Real Ray nodes on this machine that Ray's own TPU detection labels as TPU hosts.

Each node is a `ray start --block` given `--resources '{"TPU": N}'` and the GKE-style variables
Ray's TPU detection reads before it would ask the metadata server (TPU_ACCELERATOR_TYPE,
TPU_NAME, TPU_WORKER_ID, TPU_TOPOLOGY), so Ray itself adds the `TPU-<type>-head` resource, the
slice-name resource and the `ray.io/tpu-*` labels. Every node has its own HOME, temp dir and
free ports, token auth explicitly off, and its own process group: stopping kills exactly the
processes started here (never `ray stop`, which would kill every Ray on the machine).

The workloads' tests use this until they run on the simulated slice; what differs from the
simulator is only where the TPU facts come from (environment instead of a metadata server) and
that all nodes share one IP.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from rayslice import catalog

RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's minimum is 75 MiB; nodes share /dev/shm
PORT_FLAGS = ("--node-manager-port", "--object-manager-port", "--metrics-export-port",
              "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TpuRayCluster:
    """A head plus workers; `slices` is a list of (slice name, accelerator type)."""

    slices: list[tuple[str, str]]
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rsw", dir="/tmp")))
    gcs_port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def hosts(self) -> list[tuple[str, str, int]]:
        return [(name, accel, w) for name, accel in self.slices
                for w in range(catalog.lookup(accel).hosts)]

    def start(self, timeout_per_node: float = 120) -> "TpuRayCluster":
        """Start the nodes one after another: started together, 2 cores cannot bring up their
        agents before the raylets time out. Stops what was started when one fails."""
        try:
            for i, (name, accel, worker) in enumerate(self.hosts()):
                self._start_node(i, name, catalog.lookup(accel), worker)
                self._wait_for_nodes(i + 1, timeout_per_node)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, index: int, slice_name: str, shape: catalog.TpuType, worker: int) -> None:
        home = self.root / f"n{index}"
        home.mkdir()
        # A job's entrypoint runs `python` from PATH: the cluster's own, as on a host whose boot
        # script puts its venv first.
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env = {**os.environ, "PATH": path, "HOME": str(home), "RAY_AUTH_MODE": "disabled",
               "RAY_USAGE_STATS_ENABLED": "0",
               # agents start slowly on 2 busy cores; the raylet gives up after 30 s by default
               "RAY_agent_register_timeout_ms": "180000", "TPU_ACCELERATOR_TYPE": shape.accelerator_type,
               "TPU_NAME": slice_name, "TPU_WORKER_ID": str(worker), "TPU_TOPOLOGY": shape.topology}
        argv = [RAY, "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "2",
                "--resources", json.dumps({"TPU": shape.chips_per_host}),
                "--object-store-memory", str(OBJECT_STORE_BYTES), "--temp-dir", str(home / "t")]
        for flag in PORT_FLAGS:
            argv += [flag, str(free_port())]
        if index == 0:
            argv += ["--head", "--port", str(self.gcs_port), "--dashboard-host", "127.0.0.1",
                     "--dashboard-port", str(self.dashboard_port),
                     "--ray-client-server-port", str(free_port())]
        else:
            argv += ["--address", self.address]
        log = open(home / "ray-start.log", "wb")
        self.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True))

    def alive_nodes(self) -> list[dict]:
        try:
            with urllib.request.urlopen(f"{self.dashboard_url}/nodes?view=summary", timeout=5) as r:
                summary = json.load(r)["data"]["summary"]
        except OSError:
            return []
        return [n for n in summary if n.get("raylet", {}).get("state") == "ALIVE"]

    def _wait_for_nodes(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.alive_nodes()) < count:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Ray node exited early; logs under {self.root}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(self.alive_nodes())}/{count} Ray nodes after {timeout}s")
            time.sleep(1)

    def stop(self) -> None:
        """SIGTERM then SIGKILL each node's own process group, then remove the nodes' files."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in self.procs:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10  # SIGTERM drains for up to 30 s; not needed here
            while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
                time.sleep(0.5)
        shutil.rmtree(self.root, ignore_errors=True)
