"""The request handler of the simulator's HTTP servers: the metadata server, the cloud API
emulation and the package index.

Clients of the real servers keep their connections open (HTTP/1.1), and `BaseHTTPRequestHandler`
sends an answer in two writes, the headers and then the body. With Nagle's algorithm on, the
body of every answer after a connection's first waits for the client's delayed ACK of the
headers, about 40 ms on Linux: a controller step of a few cloud calls took 0.1 s instead of
milliseconds, and a metadata or index answer was slower than Google's. So the socket sends at
once.

A client that hangs up before its answer is written (a wait-for-change it gave up on, a host
that powered off mid-request) is not the server's error: a real server just drops the
connection, and so does this one, instead of printing a traceback into the test log.
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler


class QuietOnHangUpHandler(BaseHTTPRequestHandler):
    """Drops a connection whose client hung up, without a traceback."""

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError):  # the client is gone: nobody to answer
            self.close_connection = True


class KeepAliveHandler(QuietOnHangUpHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # TCP_NODELAY on each accepted connection (StreamRequestHandler)
