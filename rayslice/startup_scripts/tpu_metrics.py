"""A TPU host's metrics endpoint: libtpu's figures in the format of GKE's TPU device plugin.

Ray's dashboard agent fills its TPU gauges and panels from a device plugin's Prometheus endpoint
(Ray 2.60 ``dashboard/modules/reporter/reporter_agent.py``, ``_get_tpu_usage``): it reads
``http://$TPU_DEVICE_PLUGIN_ADDR/metrics`` and keeps the samples named ``tensorcore_utilization``,
``memory_bandwidth_utilization``, ``duty_cycle``, ``memory_used`` and ``memory_total`` that carry
the labels ``accelerator_id`` (``<id>-<chip index>``: it parses the text after the first ``-`` as
the chip), ``model`` and ``tpu_topology``. GKE runs that plugin; a TPU VM or a Compute Engine
TPU host has none, so the boot script runs this exporter on every host and starts Ray with
``TPU_DEVICE_PLUGIN_ADDR`` pointing at it.

The figures come from libtpu's monitoring library, called as its users call it (tpu-info 0.14,
google-cloud-mldiagnostics 0.5.10 ``libtpu_metric.py``): ``from libtpu.sdk import tpumonitoring``,
``list_supported_metrics()``, ``get_metric(name).data()`` (a list of strings, one per chip or
TensorCore) and ``.description()``. They are read anew at each scrape. libtpu's runtime figures
(duty cycle, HBM) come from the runtime inside the workload's process (its metrics service,
``TPU_RUNTIME_METRICS_PORTS``, 8431 by default in tpu-info's client); from another process, such
as this one, the library returns empty lists while no workload runs (wandb/wandb#11528 saw the
same), and so does this endpoint. On a real v5e test host every ``data()`` came back empty even
under load (that host allows no sockets): the real path is built on the documented interface and
tested against the simulated library (`rayslice.local.host.tpu_runtime`).

Ray's names carry the chip figures; every other metric the library lists whose entries are plain
numbers is served as ``libtpu_<name>{index="i"}`` with the library's description, for a Prometheus
or Cloud Monitoring scrape. Distributions and labelled entries (latencies, queue sizes) are left
out: their text form is not documented.

The endpoint serves what a few scrapers ask (Ray's agent, a Prometheus, `rayslice status`), and
any job on the cluster can connect to it, so it bounds what a connection can hold (`BoundedServer`):
at most `MAX_HANDLERS` are handled at once, each for at most `HANDLER_DEADLINE_S` however slowly
its client sends. A connection past the bound waits its turn in the listen queue instead of being
refused, because Ray's agent stops asking for TPU figures after its first failed scrape.

A host without libtpu or without chips (the CPU head VM) serves nothing: the exporter says so once
in the boot log and exits with the boot script's permanent status, so its supervisor does not
start it again until the next boot.

This file runs on the hosts, which do not install rayslice: the boot script writes it from its
rendered text and runs it with the venv's Python (standard library only).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import http.server
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

# libtpu name -> Ray's name (what GKE's device plugin serves). Ray reads tensorcore_utilization
# and memory_bandwidth_utilization as host metrics and the rest as runtime ones, and drops every
# sample when the two groups count different chips; libtpu has no memory bandwidth figure.
RAY_NAMES = {
    "tensorcore_util": "tensorcore_utilization",
    "duty_cycle_pct": "duty_cycle",
    "hbm_capacity_usage": "memory_used",
    "hbm_capacity_total": "memory_total",
}
RAY_HELP = {
    "tensorcore_utilization": "TensorCore utilization of the chip, percent (libtpu tensorcore_util)",
    "duty_cycle": "Share of time the chip ran a program, percent (libtpu duty_cycle_pct)",
    "memory_used": "HBM in use on the chip, bytes (libtpu hbm_capacity_usage)",
    "memory_total": "HBM of the chip, bytes (libtpu hbm_capacity_total)",
}
EXTRA_PREFIX = "libtpu_"


def host_chips(dev: str = "/dev") -> int:
    """A host's chips as Ray and libtpu find them: ``/dev/accel*``, else ``/dev/vfio/<group>``."""
    accel = [p for p in glob.glob(os.path.join(dev, "accel*")) if not os.path.isdir(p)]
    if accel:
        return len(accel)
    return len([p for p in glob.glob(os.path.join(dev, "vfio", "*")) if os.path.basename(p).isdigit()])


def read_library(monitoring: Any) -> dict[str, tuple[str, list[str]]]:
    """Every metric the library lists: name -> (description, data). A metric whose read fails
    counts as empty (the library raises while its service is not up)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for name in monitoring.list_supported_metrics():
        try:
            metric = monitoring.get_metric(name)
            data = metric.data()
            description = metric.description()
        except Exception:
            data, description = [], ""
        found[str(name)] = (str(description or ""), [str(v) for v in (data or [])])
    return found


def _number(text: str) -> float | None:
    try:
        value = float(text.strip().strip("'\""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


# How a chip's several entries combine: libtpu reports tensorcore_util per TensorCore, and HBM
# per device where a chip is two (tpu-info's get_chip_usage repeats the per-chip duty cycle to
# match the per-device memory); a chip's utilization is its entries' mean, its HBM their sum.
SUMMED = {"hbm_capacity_usage", "hbm_capacity_total"}


def per_chip(values: list[float], chips: int, summed: bool = False) -> list[float]:
    """Figures per chip from per-chip or per-core/per-device entries; a list that does not divide
    into the chips is dropped."""
    if chips <= 0 or not values or len(values) % chips:
        return []
    per = len(values) // chips
    groups = [values[i * per : (i + 1) * per] for i in range(chips)]
    return [sum(g) if summed else sum(g) / per for g in groups]


def _value(number: float) -> str:
    """Exactly: a byte count keeps every digit (``%g`` would round it to six)."""
    return str(int(number)) if number.is_integer() else repr(number)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(
    metrics: dict[str, tuple[str, list[str]]], chips: int, host_id: str, model: str, topology: str
) -> str:
    """The Prometheus text a scrape gets: Ray's families per chip, then the other numeric ones."""
    lines: list[str] = []
    for libtpu_name, ray_name in RAY_NAMES.items():
        numbers = [_number(v) for v in metrics.get(libtpu_name, ("", []))[1]]
        if any(n is None for n in numbers):
            continue
        values = per_chip([n for n in numbers if n is not None], chips, libtpu_name in SUMMED)
        if not values:
            continue
        lines += [f"# HELP {ray_name} {RAY_HELP[ray_name]}", f"# TYPE {ray_name} gauge"]
        for chip, value in enumerate(values):
            labels = (
                f'accelerator_id="{_escape(host_id)}-{chip}",make="cloud-tpu",'
                f'model="{_escape(model)}",tpu_topology="{_escape(topology)}"'
            )
            lines.append(f"{ray_name}{{{labels}}} {_value(value)}")
    for name, (description, data) in sorted(metrics.items()):
        numbers = [_number(v) for v in data]
        if not numbers or any(n is None for n in numbers):
            continue
        family = EXTRA_PREFIX + "".join(c if c.isalnum() or c == "_" else "_" for c in name)
        text = " ".join((description or name).split())
        lines += [f"# HELP {family} {_escape(text)}", f"# TYPE {family} gauge"]
        lines += [f'{family}{{index="{i}"}} {_value(n)}' for i, n in enumerate(numbers) if n is not None]
    return "\n".join(lines) + "\n" if lines else ""


def handler(page: Callable[[], str]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def handle(self) -> None:
            # A scraper that hangs up before its page is written (Ray's agent timing out on a
            # busy host, Prometheus stopping) is not this server's error: drop the connection
            # instead of printing a traceback into the boot log at every scrape.
            # A connection cut at its deadline (`BoundedServer`) ends the same way.
            try:
                super().handle()
            except OSError:
                self.close_connection = True

        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            try:
                body = page().encode()
            except Exception as exc:  # a scrape gets an error, the server lives on
                self.send_error(500, f"reading libtpu failed: {exc!r}")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # every 5 s from Ray's agent: nothing worth a log line

    return Handler


# Connections handled at once: Ray's agent, a Prometheus and `rayslice status` need one each.
MAX_HANDLERS = 8
# How long one connection may take, from its accept to its page written: a scrape takes
# milliseconds, and `rayslice status` gives up on a host after 2 s.
HANDLER_DEADLINE_S = 10.0


class BoundedServer(http.server.ThreadingHTTPServer):
    """A threading HTTP server whose connections cannot pile up: at most `max_handlers` threads
    at once (past that, accepting waits for one to end), each connection shut down `deadline_s`
    after its accept, however slowly its client sends (a per-read timeout alone would let a
    client that sends a byte at a time hold its thread for ever)."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler_class: type[http.server.BaseHTTPRequestHandler],
        *,
        max_handlers: int = MAX_HANDLERS,
        deadline_s: float = HANDLER_DEADLINE_S,
    ) -> None:
        super().__init__(address, handler_class)
        self.deadline_s = deadline_s
        self._slots = threading.BoundedSemaphore(max_handlers)
        self._deadlines: dict[socket.socket, float] = {}
        self._lock = threading.Lock()

    def active(self) -> int:
        """The connections being handled now."""
        with self._lock:
            return len(self._deadlines)

    def process_request(self, request: Any, client_address: Any) -> None:
        # The serving thread waits here for a free slot, cutting late connections meanwhile.
        while not self._slots.acquire(timeout=min(0.5, self.deadline_s)):
            self.service_actions()
        request.settimeout(self.deadline_s)
        with self._lock:
            self._deadlines[request] = time.monotonic() + self.deadline_s
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def _release(self, request: socket.socket) -> None:
        with self._lock:
            self._deadlines.pop(request, None)
        self._slots.release()

    def service_actions(self) -> None:
        """Shut down every connection past its deadline: its handler's read or write ends."""
        now = time.monotonic()
        with self._lock:
            late = [request for request, deadline in self._deadlines.items() if deadline <= now]
        for request in late:
            with contextlib.suppress(OSError):  # already closed by its handler
                request.shutdown(socket.SHUT_RDWR)


def log(path: str | None, message: str) -> None:
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} rayslice: tpu metrics: {message}\n"
    sys.stderr.write(line)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", required=True, help="the host's own address (never 0.0.0.0)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host-id", required=True, help="accelerator_id prefix: no '-' in it")
    parser.add_argument("--model", required=True, help="the model label (GKE's accelerator name)")
    parser.add_argument("--topology", required=True)
    parser.add_argument("--chips", type=int, required=True, help="the host's chips (the catalog's)")
    parser.add_argument(
        "--exit-nothing", type=int, required=True, help="status when there is nothing to serve"
    )
    parser.add_argument("--log-file")
    args = parser.parse_args(argv)
    if "-" in args.host_id:
        parser.error("--host-id must not contain '-': Ray reads the chip after the first '-'")
    try:
        from libtpu.sdk import tpumonitoring  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        log(args.log_file, f"no libtpu here ({exc}): this host serves no TPU metrics")
        return args.exit_nothing
    if host_chips() == 0:
        log(args.log_file, "no TPU chips here (/dev/accel*, /dev/vfio): this host serves no TPU metrics")
        return args.exit_nothing

    def page() -> str:
        return render(read_library(tpumonitoring), args.chips, args.host_id, args.model, args.topology)

    server = BoundedServer((args.bind, args.port), handler(page))
    log(args.log_file, f"serving {args.chips} chip(s) at http://{args.bind}:{args.port}/metrics")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
