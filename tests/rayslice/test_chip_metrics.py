"""`status`'s chips (`rayslice.chip_metrics`): one request per host, all at once, a time-out that
marks a silent host instead of waiting on it, and the endpoint's page read back per chip."""

from __future__ import annotations

import contextlib
import http.server
import socket
import socketserver
import time
from collections.abc import Iterator

from rayslice import chip_metrics
from rayslice.startup_scripts import tpu_metrics
from tests import serving
from tests.startup_scripts.sandbox import free_port

HOSTS = 64
SILENT = {5, 17, 40, 63}  # accept the connection, never answer
TIMEOUT_S = 1.0


def _page(host: int) -> str:
    table = {
        "duty_cycle_pct": [str(host % 100), "0", "0", "0"],
        "tensorcore_util": ["1", "0", "0", "0"],
        "hbm_capacity_usage": [str(host * 2**20), "0", "0", "0"],
        "hbm_capacity_total": [str(32 * 2**30)] * 4,
    }
    return tpu_metrics.render(
        {k: ("", v) for k, v in table.items()}, 4, str(1000 + host), "tpu-v6e-slice", "16x16"
    )


class Server(http.server.ThreadingHTTPServer):
    def server_bind(self) -> None:
        """Without HTTPServer's reverse lookup of the address (a second each for 127.0.0.N)."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


@contextlib.contextmanager
def cluster_of_endpoints(port: int) -> Iterator[dict[str, str]]:
    """64 hosts on loopback addresses 127.0.0.1..64, all at `port`: 60 serve a page, 4 are silent."""
    servers: list[http.server.ThreadingHTTPServer] = []
    silent: list[socket.socket] = []
    addresses = {}
    try:
        for host in range(HOSTS):
            address = f"127.0.0.{host + 1}"
            addresses[f"host-{host}"] = address
            if host in SILENT:
                sock = socket.socket()
                sock.bind((address, port))
                sock.listen(8)  # the kernel completes the handshake; nobody reads or answers
                silent.append(sock)
                continue
            page = _page(host)
            server = Server((address, port), tpu_metrics.handler(lambda p=page: p))
            serving.start(server)
            servers.append(server)
        yield addresses
    finally:
        for server in servers:
            serving.stop(server)
        for sock in silent:
            sock.close()


def test_64_hosts_take_one_time_out_at_most_and_silent_ones_are_marked():
    port = free_port()
    with cluster_of_endpoints(port) as addresses:
        start = time.monotonic()
        answers = chip_metrics.read_hosts(addresses, port=port, timeout_s=TIMEOUT_S)
        took = time.monotonic() - start
        print(f"64 hosts, {len(SILENT)} silent: {took:.2f} s")
    assert took < TIMEOUT_S + 1.5, took  # in parallel: not 4 time-outs in a row, nor 64 requests
    assert list(answers) == list(addresses)
    for host in range(HOSTS):
        answer = answers[f"host-{host}"]
        if host in SILENT:
            assert answer == {"error": f"no answer in {TIMEOUT_S:g} s"}
        else:
            chips = answer["chips"]
            assert [c["chip"] for c in chips] == [0, 1, 2, 3]
            assert chips[0]["duty_cycle_pct"] == float(host % 100) and chips[1]["duty_cycle_pct"] == 0.0
            assert chips[0]["hbm_used"] == host * 2**20 and chips[0]["hbm_total"] == 32 * 2**30
    lines = chip_metrics.chip_lines(answers)
    assert "  host-5: no answer in 1 s" in lines
    assert "  host-2: 0: 2% 0.0/32.0  1: 0% 0.0/32.0  2: 0% 0.0/32.0  3: 0% 0.0/32.0" in lines


def test_a_host_that_refuses_or_serves_nothing_says_which():
    port = free_port()
    assert chip_metrics.read_host("127.0.0.1", port=port, timeout_s=1)["error"].startswith("not serving")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), tpu_metrics.handler(lambda: ""))
    serving.start(server)
    try:
        assert chip_metrics.read_host("127.0.0.1", port=port) == {"chips": []}
        assert chip_metrics.chip_lines({"w0": {"chips": []}})[1].startswith("  w0: no figures")
    finally:
        serving.stop(server)
