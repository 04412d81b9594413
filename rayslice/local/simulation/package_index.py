"""The simulated internet's package index: a wheelhouse served as a PEP 503 simple index.

The simulator's hosts have no internet. For the bring-up benchmark's internet mode and the
package cache's tests (`internet`), this server plays PyPI: it runs in a namespace of its own
on the simulation's bridge and serves

* ``/simple/``: every project of the wheelhouse, one link each (PEP 503, "Simple Repository
  API": an HTML page of anchors whose text is the project's name);
* ``/simple/<project>/`` (with or without the trailing slash, as proxpi asks): an anchor per
  file, its href ending in ``#sha256=<hex>`` (PEP 503) so pip and uv check what they get; the
  href is an absolute path (``/files/<name>``), valid whichever of the two URLs was asked;
* ``/files/<name>``: the file (GET and HEAD; proxpi sends a HEAD before it downloads).

It is the far end of a slow link: every answer waits ``--latency-ms`` first (this machine's
kernel has no netem to delay packets; `internet` shapes the bandwidth with HTB), and it counts
the bytes of every answer by client address into ``--counts`` (JSON, replaced whole as each
answer starts, so a reader that has the answer sees it counted), which is how the benchmark
tells what each host fetched from the internet.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import re
import shutil
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from rayslice.local.google.http_handler import KeepAliveHandler

# PEP 503's name normalization: runs of -, _ and . become one -, lowercased.
_NORMALIZE = re.compile(r"[-_.]+")
SUFFIXES = (".whl", ".tar.gz", ".zip")


def normalize(name: str) -> str:
    return _NORMALIZE.sub("-", name).lower()


def project_of(filename: str) -> str:
    """The normalized project name of a distribution file (wheel: before the first ``-``,
    PEP 427; sdist: before the last ``-``, its version)."""
    if filename.endswith(".whl"):
        return normalize(filename.split("-", 1)[0])
    stem = filename.removesuffix(".tar.gz").removesuffix(".zip")
    return normalize(stem.rsplit("-", 1)[0])


def scan(wheelhouse: Path) -> dict[str, dict[str, str]]:
    """project -> {file name: sha256} for every distribution file in `wheelhouse`."""
    projects: dict[str, dict[str, str]] = {}
    for path in sorted(wheelhouse.iterdir()):
        if path.is_file() and path.name.endswith(SUFFIXES):
            digest = hashlib.sha256()
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            projects.setdefault(project_of(path.name), {})[path.name] = digest.hexdigest()
    return projects


class IndexServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], wheelhouse: Path, latency_s: float, counts: Path):
        self.wheelhouse = wheelhouse
        self.projects = scan(wheelhouse)
        self.latency_s = latency_s
        self.counts_path = counts
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self._write_counts()
        super().__init__(address, _Handler)

    def count(self, client: str, sent: int) -> None:
        with self.lock:
            self.counts[client] = self.counts.get(client, 0) + sent
            self._write_counts()

    def _write_counts(self) -> None:
        tmp = self.counts_path.with_name(self.counts_path.name + ".tmp")
        tmp.write_text(json.dumps(self.counts))
        os.replace(tmp, self.counts_path)


class _Handler(KeepAliveHandler):
    server: IndexServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, *, body: bool) -> None:
        time.sleep(self.server.latency_s)
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        if path == "/simple/":
            links = "".join(f'<a href="/simple/{p}/">{p}</a>\n' for p in self.server.projects)
            self._page(links, body)
        elif path.startswith("/simple/") and path.count("/") in (2, 3):
            files = self.server.projects.get(normalize(path.removeprefix("/simple/").strip("/")))
            if files is None:
                self._status(404, body)
                return
            links = "".join(
                f'<a href="/files/{html.escape(name)}#sha256={digest}">{html.escape(name)}</a>\n'
                for name, digest in files.items()
            )
            self._page(links, body)
        elif path.startswith("/files/") and path.count("/") == 2:
            name = path.removeprefix("/files/")
            if not any(name in files for files in self.server.projects.values()):
                self._status(404, body)
                return
            self._file(self.server.wheelhouse / name, body)
        else:
            self._status(404, body)

    def _page(self, links: str, body: bool) -> None:
        data = f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.server.count(self.client_address[0], len(data))
            self.wfile.write(data)

    def _file(self, path: Path, body: bool) -> None:
        size = path.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        if body:
            self.server.count(self.client_address[0], size)
            with path.open("rb") as f:
                shutil.copyfileobj(f, self.wfile, 1 << 16)

    def _status(self, code: int, body: bool) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--wheelhouse", type=Path, required=True)
    parser.add_argument("--bind", required=True, help="address to listen on")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="wait before every answer")
    parser.add_argument("--counts", type=Path, required=True, help="JSON: bytes served per client address")
    args = parser.parse_args(argv)
    server = IndexServer((args.bind, args.port), args.wheelhouse, args.latency_ms / 1000, args.counts)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
