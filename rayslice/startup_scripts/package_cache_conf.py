"""gunicorn's configuration file for the head's package cache: one fix to proxpi 1.3.1, nothing else.

The boot script writes this file on the head and starts ``gunicorn -c <this file>
proxpi.server:app``; gunicorn runs it before it starts its worker, so the worker's proxpi is
the fixed one. Everything else (bind address, one worker with threads, timeouts) is on the
command line and in proxpi's PROXPI_* environment.

The fix: proxpi's file cache puts a download's thread in its table of downloads in flight
before it starts the thread (``_FileCache._start_downloading`` in ``proxpi/_cache.py``). A
second request for the same file that arrives in between joins a thread that has not started;
``threading.Thread.join`` raises RuntimeError ("cannot join thread before it is started"),
proxpi logs "Failed to download" and redirects that host to the index: the host fetches its own
copy, which is what the cache is for. At a cold boot every host asks for the same files at
once, so this happens (measured with the simulator: 36 MB of one host's downloads went to the
index). Here a download's thread waits, when joined, until it has started.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

_cache: Any = importlib.import_module("proxpi._cache")  # proxpi is installed on the head only


class _StartedThread(_cache.Thread):
    """proxpi's download thread, joinable before it starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._begun = threading.Event()

    def start(self) -> None:
        super().start()
        self._begun.set()

    def join(self, timeout: float | None = None) -> None:
        self._begun.wait(timeout)
        super().join(timeout)


_cache.Thread = _StartedThread
