"""Loopback servers the tests run in daemon threads.

Why one helper: `socketserver.BaseServer.shutdown` waits until `serve_forever` next looks for it,
every `poll_interval` (0.5 s by default), so a test with two servers spent up to a second in its
teardown; across the recovery tests' fixtures that was most of their time."""

from __future__ import annotations

import socketserver
import threading
from typing import TypeVar

POLL_S = 0.02  # how often a served loop looks for `shutdown()`

Server = TypeVar("Server", bound=socketserver.BaseServer)


def start(server: Server) -> Server:
    """`server` answering in a daemon thread until `stop`."""
    threading.Thread(target=server.serve_forever, args=(POLL_S,), daemon=True).start()
    return server


def stop(server: socketserver.BaseServer) -> None:
    server.shutdown()
    server.server_close()
