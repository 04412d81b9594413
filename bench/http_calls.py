"""Calls on one keep-alive connection to the simulator's HTTP servers, with the request handler
they ship (`KeepAliveHandler`: TCP_NODELAY) and with the same handler sending as
`BaseHTTPRequestHandler` does by default (Nagle's algorithm on), in one process.

Every answer is two writes, headers then body. With Nagle on, the body of each answer after a
connection's first waits for the client's delayed ACK of the headers; the recovery controller,
`rayslice status`, google-auth and uv all keep their connections open. This prints the median
milliseconds a call takes on each server both ways, and their ratio.

    python bench/http_calls.py [--calls N] [--repeats R]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path

from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.metadata_server import FLAVOR, FLAVOR_HEADER, MetadataServer
from rayslice.local.simulation.package_index import IndexServer

NODE = "/v2/projects/p/locations/z/nodes/n"


def _emulator(_: Path) -> ThreadingHTTPServer:
    server = CloudApiEmulator(("127.0.0.1", 0))
    server.add_node("p", "z", "n")
    server.tokens.add("t")
    return server


def _metadata(_: Path) -> ThreadingHTTPServer:
    return MetadataServer(("127.0.0.1", 0), {"instance": {"hostname": "host-w0"}})


def _index(work: Path) -> ThreadingHTTPServer:
    (work / "wheels").mkdir()
    return IndexServer(("127.0.0.1", 0), work / "wheels", 0.0, work / "counts.json")


# Server, and the GET each call makes (path, headers).
SERVERS: dict[str, tuple[Callable[[Path], ThreadingHTTPServer], str, dict[str, str]]] = {
    "cloud API emulation": (_emulator, NODE, {"Authorization": "Bearer t"}),
    "metadata server": (_metadata, "/computeMetadata/v1/instance/hostname", {FLAVOR_HEADER: FLAVOR}),
    "package index": (_index, "/simple/", {}),
}


@contextmanager
def serving(make: Callable[[Path], ThreadingHTTPServer], nagle: bool) -> Iterator[ThreadingHTTPServer]:
    """The server, its handler as shipped or (`nagle`) a subclass that leaves Nagle's algorithm on."""
    with tempfile.TemporaryDirectory() as work:
        server = make(Path(work))
        if nagle:
            shipped = server.RequestHandlerClass
            assert isinstance(shipped, type)
            server.RequestHandlerClass = type("WithNagle", (shipped,), {"disable_nagle_algorithm": False})
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield server
        finally:
            server.shutdown()
            server.server_close()


def ms_per_call(server: ThreadingHTTPServer, path: str, headers: dict[str, str], calls: int) -> float:
    """Milliseconds per GET, `calls` of them on one connection."""
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(str(host), int(port), timeout=10)
    try:
        started = time.perf_counter()
        for _ in range(calls):
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise SystemExit(f"GET {path} answered {response.status}")
        return (time.perf_counter() - started) * 1000 / calls
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per connection (default: 100)")
    parser.add_argument("--repeats", type=int, default=3, help="connections per way, the median kept")
    args = parser.parse_args(argv)
    print(f"{'server':<22} {'shipped ms/call':>16} {'Nagle on ms/call':>17} {'ratio':>7}")
    for name, (make, path, headers) in SERVERS.items():
        figures = {}
        for nagle in (False, True):
            with serving(make, nagle) as server:
                runs = [ms_per_call(server, path, headers, args.calls) for _ in range(args.repeats)]
            figures[nagle] = statistics.median(runs)
        shipped, with_nagle = figures[False], figures[True]
        print(f"{name:<22} {shipped:16.2f} {with_nagle:17.2f} {with_nagle / shipped:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
