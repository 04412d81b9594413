"""bench/http_calls.py: each simulator server it measures sends its answers at once (TCP_NODELAY
on the connection), the baseline it compares with does not, and the report has a row per server.
How long a call takes is the benchmark's to say, not a test's."""

from __future__ import annotations

import socket

import pytest

from rayslice.local.google.http_handler import KeepAliveHandler
from tests.bench import load

http_calls = load("http_calls")


@pytest.mark.parametrize("name", http_calls.SERVERS)
@pytest.mark.parametrize("nagle", [False, True], ids=["shipped", "baseline"])
def test_the_shipped_handler_turns_nagle_off_and_the_baseline_leaves_it_on(name, nagle):
    make, path, headers = http_calls.SERVERS[name]
    seen: list[int] = []
    with http_calls.serving(make, nagle) as server:
        handler = server.RequestHandlerClass
        assert issubclass(handler, KeepAliveHandler) and handler.protocol_version == "HTTP/1.1"

        class Spy(handler):  # type: ignore[misc, valid-type]
            def handle(self) -> None:
                seen.append(self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                super().handle()

        server.RequestHandlerClass = Spy
        http_calls.ms_per_call(server, path, headers, calls=3)
    assert len(seen) == 1  # three calls on one kept-alive connection
    assert bool(seen[0]) is not nagle


def test_the_report_has_a_row_per_server_with_both_figures_and_their_ratio(capsys):
    assert http_calls.main(["--calls", "2", "--repeats", "1"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert "ratio" in header
    assert [row[:22].strip() for row in rows] == list(http_calls.SERVERS)
    for row in rows:
        shipped, with_nagle, ratio = (float(x) for x in row[22:].split())
        assert shipped > 0 and with_nagle > 0
        assert ratio == pytest.approx(with_nagle / shipped, rel=0.05, abs=0.1)
