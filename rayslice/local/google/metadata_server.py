"""A fake GCE metadata server that real clients accept (google-auth, Ray's TPU detection, JAX).

Each simulated host runs one, inside its network namespace on 169.254.169.254:80, which the
host's ``/etc/hosts`` names ``metadata.google.internal`` — so clients that hard-code that name
(Ray) work unchanged. It behaves like the real one where clients can tell: ``Metadata-Flavor:
Google`` is required on requests (403 without) and sent on every response; directories answer
with a listing when the path ends in ``/`` and redirect otherwise; ``?recursive=true`` returns
JSON with camelCase keys (attribute names kept); ``?alt=json|text`` choose the format; guest
attributes (``instance/guest-attributes/<ns>/<key>``) take PUT, GET and DELETE. Requests in
proxy form (``GET http://metadata.google.internal/...``) are accepted, so a client that honours
``http_proxy`` can be pointed at a server on any port.

Fault knobs for the simulator and its tests: ``unavailable_for`` answers 503 to everything for
the first N seconds (to exercise the boot script's retries); ``silent_for`` accepts connections
but sends nothing for the first N seconds (``inf``: never), which is how a wedged metadata server
looks to a client without a timeout (Ray's TPU detection has none). Also ``guest_file``, a JSON copy
of the guest attributes rewritten atomically on every change, which the owner reads without
entering the host's namespace. A server started on an existing guest file keeps its values, as
guest attributes survive a real VM's reboot.

Waiting for a change, as Google's server does ("Querying VM metadata" → "Wait for change"):
``?wait_for_change=true`` on a value holds the answer until the value differs from the one whose
``ETag`` the client names in ``last_etag`` (without one: until the next change), or for
``timeout_sec`` seconds, then answers the current value with its ``ETag``. The one value that
changes while a host runs is ``instance/preempted`` (`PREEMPTED_PATH`): ``FALSE``, and ``TRUE``
from a Spot preemption's notice until the host powers off (Google's "Spot VMs" → "Preemption
process": the notice reaches the guest about 30 s before the VM stops, and this key turns TRUE,
"Detect preemption of Spot VMs"). The simulator gives the notice with SIGUSR1 and clears it at the
next boot with SIGUSR2 (`notice_preemption`, `clear_preemption`); `set_value` does either in process.

Run as ``python -m rayslice.local.google.metadata_server --tree FILE --guest-file FILE``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Union
from urllib.parse import parse_qs, urlsplit

from rayslice.local.google.http_handler import KeepAliveHandler

METADATA_IP = "169.254.169.254"
METADATA_HOST = "metadata.google.internal"
API_PREFIX = "/computeMetadata/v1/"
FLAVOR_HEADER = "Metadata-Flavor"
FLAVOR = "Google"
GUEST_ATTRIBUTES = "guest-attributes"
# What a host may store in guest attributes (the server runs as root and writes them to the
# state dir, so a host must not be able to fill the machine's disk): the simulator's own bounds.
MAX_GUEST_VALUE = 256 << 10  # bytes of one value; a longer PUT gets 413 unread
MAX_GUEST_ENTRIES = 1000
MAX_GUEST_BYTES = 8 << 20  # all keys and values together
# Directories whose entry names are user data: recursive JSON keeps them as they are.
_VERBATIM_DIRS = ("attributes", GUEST_ATTRIBUTES)
_JSON_TAG = "$json"
# Google's metadata key that turns TRUE when a preemption notice arrives (default metadata of
# every VM; "Detect preemption of Spot VMs").
PREEMPTED_PATH = ("instance", "preempted")
TRUE, FALSE = "TRUE", "FALSE"
# wait_for_change without timeout_sec: how long the answer is held at most (the real server's
# own limit is not published; clients pass timeout_sec).
MAX_WAIT_S = 3600.0


@dataclass(frozen=True)
class Json:
    """A value served as a JSON document (e.g. a service-account token), left out of recursive views."""

    value: Any


Tree = dict[str, Union["Tree", str, list, Json]]


def dump_tree(tree: Tree) -> str:
    """The tree as JSON text (the server's ``--tree`` file); `Json` leaves are tagged."""
    return json.dumps(tree, default=lambda leaf: {_JSON_TAG: leaf.value}, indent=1, sort_keys=True)


def load_tree(text: str) -> Tree:
    return json.loads(text, object_hook=lambda d: Json(d[_JSON_TAG]) if set(d) == {_JSON_TAG} else d)


@dataclass(frozen=True)
class Response:
    status: int
    body: str = ""
    content_type: str = "application/text"
    location: str | None = None


class MetadataServer(ThreadingHTTPServer):
    """Serves one host's metadata `tree` plus its guest attributes until `shutdown()`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        tree: Tree,
        *,
        guest_file: Path | None = None,
        unavailable_for: float = 0.0,
        silent_for: float = 0.0,
    ):
        self.tree = tree
        self.guest_file = guest_file
        self.unavailable_until = time.monotonic() + unavailable_for
        self.silent_until = time.monotonic() + silent_for
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._version = 0  # counts changes, so a waiter never misses one between look and wait
        self.guest: dict[str, dict[str, str]] = (
            json.loads(guest_file.read_text()) if guest_file is not None and guest_file.exists() else {}
        )
        super().__init__(address, _Handler)
        self._save_guest()  # the file's existence tells the owner the server listens

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        if isinstance(host, bytes):
            host = host.decode()
        return f"http://{host}:{port}"

    def hold_while_silent(self) -> None:
        """Block the calling handler thread until the ``silent_for`` window ends (forever for inf)."""
        while (left := self.silent_until - time.monotonic()) > 0:
            time.sleep(min(left, 60.0))

    def respond(self, method: str, target: str, body: str, headers: dict[str, str]) -> Response:
        """The answer to one request (`target` in origin or proxy form)."""
        if time.monotonic() < self.unavailable_until:
            return Response(503, "metadata server not ready yet (simulated)\n")
        if headers.get(FLAVOR_HEADER.lower()) != FLAVOR:
            return Response(403, f"Missing required header: {FLAVOR_HEADER}: {FLAVOR}\n")
        url = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        path = url.path or "/"
        if path == "/":
            return _listing(["computeMetadata/"], query)
        if path == "/computeMetadata/":
            return _listing(["v1/"], query)
        if not (path + "/").startswith(API_PREFIX):
            return Response(404, f"{path} not found\n")
        relative = path[len(API_PREFIX) :]
        segments = [s for s in relative.split("/") if s]
        if method in ("PUT", "DELETE"):
            return self._write_guest(method, segments, body)
        if method != "GET":
            return Response(405, f"{method} not allowed\n")
        if query.get("wait_for_change") == "true":
            self._wait_for_change(segments, path, query)
        node: object = self._view()
        for segment in segments:
            node = _child(node, segment)
            if node is None:
                return Response(404, f"{path} not found\n")
        return _render(
            node,
            path,
            query,
            directory=not segments or relative.endswith("/"),
            verbatim=bool(segments) and segments[-1] in _VERBATIM_DIRS,
        )

    def set_value(self, segments: tuple[str, ...], value: str) -> None:
        """Change one value of the tree (e.g. `PREEMPTED_PATH`) and wake every wait_for_change."""
        with self._changed:
            node = self.tree
            for segment in segments[:-1]:
                child = node.setdefault(segment, {})
                assert isinstance(child, dict), segments
                node = child
            node[segments[-1]] = value
            self._version += 1
            self._changed.notify_all()

    def _wait_for_change(self, segments: list[str], path: str, query: dict[str, str]) -> None:
        """Hold a ``wait_for_change=true`` request until the value's ETag differs from
        ``last_etag`` (none given: until the next change) or ``timeout_sec`` passes."""
        try:
            timeout = min(float(query.get("timeout_sec", MAX_WAIT_S)), MAX_WAIT_S)
        except ValueError:
            timeout = MAX_WAIT_S
        deadline = time.monotonic() + max(timeout, 0.0)
        last = query.get("last_etag") or self._etag(segments, path, query)
        while True:
            with self._changed:
                version = self._version
            if self._etag(segments, path, query) != last:
                return
            with self._changed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                if self._version == version:
                    self._changed.wait(left)

    def _etag(self, segments: list[str], path: str, query: dict[str, str]) -> str:
        """The ETag the answer would carry now (of its body, as `_Handler` sends it)."""
        node: object = self._view()
        for segment in segments:
            node = _child(node, segment)
            if node is None:
                return ""
        view = {k: v for k, v in query.items() if k in ("alt", "recursive")}
        response = _render(node, path, view, directory=path.endswith("/"), verbatim=False)
        return etag(response.body.encode())

    def _view(self) -> Tree:
        with self._lock:
            guest: Tree = {ns: dict(keys) for ns, keys in self.guest.items()}
        base = self.tree.get("instance", {})
        instance: Tree = {**(base if isinstance(base, dict) else {}), GUEST_ATTRIBUTES: guest}
        return {**self.tree, "instance": instance}

    def _write_guest(self, method: str, segments: list[str], body: str) -> Response:
        if len(segments) != 4 or segments[:2] != ["instance", GUEST_ATTRIBUTES]:
            return Response(
                405, f"{method} is allowed only on instance/{GUEST_ATTRIBUTES}/<namespace>/<key>\n"
            )
        namespace, key = segments[2:]
        with self._lock:
            if method == "PUT":
                entries = {
                    (n, k): len(n) + len(k) + len(v)
                    for n, keys in self.guest.items()
                    for k, v in keys.items()
                }
                entries[namespace, key] = len(namespace) + len(key) + len(body)
                if len(entries) > MAX_GUEST_ENTRIES or sum(entries.values()) > MAX_GUEST_BYTES:
                    return Response(413, "guest attributes full (simulator bound)\n")
                self.guest.setdefault(namespace, {})[key] = body
            elif key not in self.guest.get(namespace, {}):
                return Response(404, f"guest attribute {namespace}/{key} not found\n")
            else:
                del self.guest[namespace][key]
            self._save_guest()
            self._version += 1
            self._changed.notify_all()
        return Response(200)

    def _save_guest(self) -> None:
        """Rewrite the guest file atomically (called with the lock held, or before serving)."""
        if self.guest_file is None:
            return
        tmp = self.guest_file.with_name(self.guest_file.name + ".tmp")
        tmp.write_text(json.dumps(self.guest, indent=1, sort_keys=True))
        os.replace(tmp, self.guest_file)


def etag(payload: bytes) -> str:
    """The ETag of an answer's body: what a client passes back as ``last_etag``."""
    return hashlib.sha256(payload).hexdigest()[:16]


def _child(node: object, segment: str) -> object:
    if isinstance(node, dict):
        return node.get(segment)
    if isinstance(node, list) and segment.isdigit() and int(segment) < len(node) and not _is_value(node):
        return node[int(segment)]
    return None


def _is_value(node: object) -> bool:
    """Strings, `Json` documents and lists of strings are values; dicts and other lists are directories."""
    return isinstance(node, (str, Json)) or (isinstance(node, list) and all(isinstance(x, str) for x in node))


def _render(node: object, path: str, query: dict[str, str], *, directory: bool, verbatim: bool) -> Response:
    alt = query.get("alt")
    if isinstance(node, Json):
        return Response(200, json.dumps(node.value), "application/json")
    if _is_value(node):
        if alt == "json":
            return Response(200, json.dumps(node), "application/json")
        return Response(200, "\n".join(node) + "\n" if isinstance(node, list) else str(node))
    if query.get("recursive") == "true":
        data = _recursive(node, verbatim)
        if alt == "text":
            return Response(200, "".join(f"{k} {v}\n" for k, v in _flatten(data, "")))
        return Response(200, json.dumps(data), "application/json")
    if not directory:
        return Response(301, "", location=path + "/")
    entries = list(node) if isinstance(node, list) else []
    children: dict = node if isinstance(node, dict) else {str(i): child for i, child in enumerate(entries)}
    names = list(children)
    return _listing([n if _is_value(children[n]) else n + "/" for n in names], query)


def _listing(names: list[str], query: dict[str, str]) -> Response:
    if query.get("alt") == "json":
        return Response(200, json.dumps(names), "application/json")
    return Response(200, "".join(f"{n}\n" for n in names))


def _recursive(node: object, verbatim: bool) -> object:
    """The JSON view of a directory: keys camelCased (except user-named entries), `Json` leaves left out."""
    if isinstance(node, dict):
        return {
            (k if verbatim else _camel(k)): _recursive(v, k in _VERBATIM_DIRS)
            for k, v in node.items()
            if not isinstance(v, Json)
        }
    if isinstance(node, list):
        return [_recursive(v, False) for v in node]
    return node


def _camel(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _flatten(data: object, prefix: str) -> list[tuple[str, str]]:
    if isinstance(data, dict):
        return [kv for k, v in data.items() for kv in _flatten(v, f"{prefix}{k}/")]
    if isinstance(data, list) and not all(isinstance(x, str) for x in data):
        return [kv for i, v in enumerate(data) for kv in _flatten(v, f"{prefix}{i}/")]
    value = " ".join(data) if isinstance(data, list) else str(data)
    return [(prefix.rstrip("/"), value)]


class _Handler(KeepAliveHandler):  # keep-alive, as clients expect from the real server
    server_version = "Metadata Server for VM"
    sys_version = ""
    timeout = 60  # an idle keep-alive connection does not hold a thread forever
    server: MetadataServer

    def do_GET(self) -> None:
        self._answer("GET")

    def do_PUT(self) -> None:
        self._answer("PUT")

    def do_DELETE(self) -> None:
        self._answer("DELETE")

    def do_POST(self) -> None:
        self._answer("POST")

    def _answer(self, method: str) -> None:
        self.server.hold_while_silent()
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_GUEST_VALUE:  # unread: the connection ends with the answer
            self.close_connection = True
            response = (
                Response(413, f"request body over {MAX_GUEST_VALUE} bytes\n")
                if length > 0
                else Response(400, "bad Content-Length\n")
            )
        else:
            body = self.rfile.read(length).decode(errors="replace") if length else ""
            headers = {k.lower(): v for k, v in self.headers.items()}
            response = self.server.respond(method, self.path, body, headers)
        payload = response.body.encode()
        self.send_response(response.status)
        self.send_header(FLAVOR_HEADER, FLAVOR)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("ETag", etag(payload))
        if response.location:
            self.send_header("Location", response.location)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        if self.server.guest_file is not None:  # a standalone server logs to its stderr file
            super().log_message(format, *args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, required=True, help="metadata tree (JSON, see dump_tree)")
    parser.add_argument("--guest-file", type=Path, required=True, help="JSON copy of the guest attributes")
    parser.add_argument("--bind", default=METADATA_IP)
    parser.add_argument("--port", type=int, default=80)
    parser.add_argument(
        "--unavailable-for",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="answer 503 to every request for this long after start",
    )
    parser.add_argument(
        "--silent-for",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="accept connections but answer nothing for this long after start (inf: never)",
    )
    args = parser.parse_args(argv)
    server = MetadataServer(
        (args.bind, args.port),
        load_tree(args.tree.read_text()),
        guest_file=args.guest_file,
        unavailable_for=args.unavailable_for,
        silent_for=args.silent_for,
    )
    # The simulator's preemption notice, and its end at the next boot (see the module docstring).
    signal.signal(signal.SIGUSR1, lambda *_: server.set_value(PREEMPTED_PATH, TRUE))
    signal.signal(signal.SIGUSR2, lambda *_: server.set_value(PREEMPTED_PATH, FALSE))
    server.serve_forever()


if __name__ == "__main__":
    main()
