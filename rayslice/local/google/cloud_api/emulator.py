"""A local emulation of ONLY the cloud API calls that recovery and `rayslice status` make.

Served over real HTTP so the real client (`rayslice.recovery.cloud`, an ``AuthorizedSession``)
reaches it through its normal endpoint override (``CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU`` =
``<url>/``, ``CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE`` = ``<url>/compute/v1/``) and nothing
else. It emulates:

- Cloud TPU v2: ``projects.locations.nodes`` get / list / delete / create / getGuestAttributes,
  and ``projects.locations.operations.get`` (long-running operations, ``done`` after
  `op_polls` reads);
- Compute Engine v1: ``instanceGroupManagers`` get / delete / insert / listManagedInstances /
  listPerInstanceConfigs / createInstances / deleteInstances / deletePerInstanceConfigs,
  ``instanceGroupManagerResizeRequests.insert`` (a bulk MIG's refused), ``zoneOperations.get`` and
  ``instances.getGuestAttributes``;
- GKE (container v1): ``projects.locations.clusters.nodePools`` get / list (reached through
  ``CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER`` = ``<url>/``);
- an OAuth token endpoint (``POST /token``, the JWT-bearer grant of service-account keys), so a
  client holds a real ``service_account`` ADC file whose ``token_uri`` points here (an
  ``authorized_user`` file cannot: google-auth always sends its refresh to Google's own token
  endpoint). The emulation made the key pair and checks the assertion's signature and audience;
  every API call must carry a token it issued (401 otherwise, as Google answers).

Who may call: the machine itself (the server's own address or 127.0.0.1: the simulator, the
owner's `rayslice status`, tests) and the addresses in `clients` (the simulated host that runs
the recovery controller); any other caller gets 403 before its body is read, whatever token it
holds. Admin calls (preemption) come from the machine only. What it keeps is bounded: a body
over `MAX_BODY` bytes is refused with 413 unread, and `calls` keeps the latest `MAX_CALLS` calls
holding at most `MAX_STORED_BYTES` of bodies, so no caller can grow the emulation without bound.
The admin calls are `rayslice local preempt` (``/rayslice-local/preempt/<slice>``) and
`rayslice local capacity` (``/rayslice-local/capacity``: a zone's free hosts of a type in the twin,
`rayslice.cloud.capacity`, which fulfils the requests that now fit).

The parts: the route table and what a served call records (`routes`), the project both APIs
act on and its long-running operations (`project`), the TPU API (`tpu`), the Compute Engine API
(`compute`), the token endpoint (`oauth`) and, here, the HTTP server that ties them together.

Each route names its discovery method id (`ROUTES`); tests/recovery/test_api_shapes.py checks
the route table against the paths and HTTP methods of the discovery documents that
google-api-python-client ships, and walks every request body and response body recorded in
`calls` against the schemas, so the emulation cannot drift from the real API.

`preempt` does what a preemption does to the resource (TPU node state PREEMPTED; a MIG's
instances gone or TERMINATED); every call is recorded in `calls`, so tests can assert what was
(and was not) touched. Guest attributes come from `guest` or, for a simulated host, from
`guest_source` (the simulator's metadata servers keep them).
"""

from __future__ import annotations

import argparse
import json
import secrets
import traceback
from collections.abc import Callable, Collection, Sequence
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rayslice.cloud.rules import DELETE, STOP
from rayslice.cloud.twin.state import TwinHost
from rayslice.local.google.cloud_api.compute import ComputeApi
from rayslice.local.google.cloud_api.container import ContainerApi
from rayslice.local.google.cloud_api.iam import EmulatedIam
from rayslice.local.google.cloud_api.oauth import ServiceAccountTokens
from rayslice.local.google.cloud_api.project import EmulatedProject
from rayslice.local.google.cloud_api.routes import ApiError, Call, match_route
from rayslice.local.google.cloud_api.tpu import TpuApi
from rayslice.local.google.http_handler import KeepAliveHandler

ADMIN_ROOT = "/rayslice-local/"  # the simulator's own calls (not Google APIs): machine and token only
ADMIN_PREFIX = ADMIN_ROOT + "preempt/"
CAPACITY_PATH = ADMIN_ROOT + "capacity"  # POST ?hosts=N[&zone=Z][&type=T]: `rayslice local capacity`
NOTICE_PARAMETER = "notice_s"
MAX_NOTICE_S = 3600.0  # a preemption request holds its HTTP call this long at most
ADMIN_HEADER = "X-Rayslice-Simulator"
MAX_BODY = 1 << 20  # bytes of one request body (a TPU node's create body with its startup script: ~60 KiB)
MAX_CALLS = 1000  # calls kept in `calls`, the latest
MAX_STORED_BYTES = 32 << 20  # request bytes kept in `calls` (the latest calls' bodies)
_NOT_SIMULATOR = 403, {"error": {"code": 403, "message": "not the simulator", "status": "PERMISSION_DENIED"}}


class CloudApiEmulator(
    TpuApi, ComputeApi, ContainerApi, ServiceAccountTokens, EmulatedIam, ThreadingHTTPServer
):
    """The emulated APIs on `address`; `url` is its base. Thread-safe; stop with `shutdown()`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int] = ("127.0.0.1", 0),
        *,
        op_polls: int = 1,
        clients: Collection[str] = (),
        address_range: str | None = None,
    ):
        ThreadingHTTPServer.__init__(self, address, _Handler)
        ServiceAccountTokens.__init__(self)
        EmulatedIam.__init__(self)  # a bound token's calls are checked against its role (`iam`)
        EmulatedProject.__init__(self, op_polls=op_polls, address_range=address_range)
        # ``POST /rayslice-local/preempt/<slice>`` with header ADMIN_HEADER: `rayslice local preempt`.
        self.admin_token = ""
        # ``?notice_s=S``: the hosts get the preemption notice S seconds before they power off.
        self.admin_preempt: Callable[[str, float], Sequence[str]] | None = None
        # ``POST /rayslice-local/capacity?hosts=N&zone=Z&type=T``: `rayslice local capacity`; zone
        # and type may be left out (the simulation's own); returns what was set.
        self.admin_capacity: Callable[[int, str | None, str | None], dict[str, Any]] | None = None
        self.calls: list[Call] = []
        self._stored: list[int] = []  # request bytes of each entry of `calls`
        self.clients = frozenset(clients)  # admitted callers besides the machine itself

    def from_machine(self, peer: str) -> bool:
        """Whether a connection from `peer` comes from this machine: the server's own address (a
        host cannot send from it: the kernel drops a packet whose source is a local address) or
        the loopback address."""
        return peer in (self.server_address[0], "127.0.0.1", "::1")

    def admits(self, peer: str) -> bool:
        """Whether `peer` may call the API at all (the machine, or an admitted client)."""
        return peer in self.clients or self.from_machine(peer)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host if isinstance(host, str) else host.decode()}:{port}"

    def environment(self) -> dict[str, str]:
        """The endpoint overrides that send the real client here."""
        return {
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": f"{self.url}/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{self.url}/compute/v1/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER": f"{self.url}/",
        }

    def preempt(self, project: str, zone: str, name: str, *, mode: str = "gone") -> list[TwinHost]:
        """A preemption: the node turns PREEMPTED; a MIG's hosts are gone (``gone``) or TERMINATED
        (``terminated``) with no repair, or (``spot``) each stopped or deleted per its template's
        termination action and then left or repaired per the MIG's lifecycle policy (the twin's
        `preempt`). The hosts it hit, as they were; the twin's ``on_host_down`` ran for each."""
        with self.lock:
            key = (project, zone, name)
            if key in self.state.nodes:
                hit = self.state.preempt(project, zone, name)
                for worker in [w for (n, w) in self.tpu_guest if n == name]:
                    self.tpu_guest.pop((name, worker))
                return hit
            if key in self.state.migs:
                forced = {"gone": DELETE, "terminated": STOP}.get(mode)
                return self.state.preempt(project, zone, name, action=forced, repair=forced is None)
            raise KeyError(f"no slice {name} in {project}/{zone}")

    def mutations(self) -> list[Call]:
        """Every served call that could change something (not GET, not a read-only POST)."""
        reads = {"getGuestAttributes", "listManagedInstances", "listPerInstanceConfigs"}
        return [
            c
            for c in self.calls
            if c.method in ("POST", "DELETE", "PATCH", "PUT")
            and c.method_id is not None
            and c.method_id.rsplit(".", 1)[-1] not in reads
        ]

    def refusal(self, method: str, target: str, peer: str, length: int) -> tuple[int, Any] | None:
        """The answer to a request that must not be read at all (its caller or its size), else None."""
        path = urlsplit(target).path
        if not self.admits(peer) or (path.startswith(ADMIN_ROOT) and not self.from_machine(peer)):
            answer = ApiError(403, "PERMISSION_DENIED", f"caller {peer} may not call this emulation")
            with self.lock:
                self._record(Call(method, path, {}, None, None, 403, answer.body()), 0)
            return 403, answer.body()
        if length > MAX_BODY:
            return 413, ApiError(413, "INVALID_ARGUMENT", f"request body over {MAX_BODY} bytes").body()
        return None

    def serve(self, method: str, target: str, headers: dict[str, str], raw: bytes) -> tuple[int, Any]:
        """Answer one request whose caller `refusal` admitted."""
        url = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path == "/token" and method == "POST":
            return self._token({k: v[-1] for k, v in parse_qs(raw.decode()).items()})
        if url.path.startswith(ADMIN_ROOT) and method == "POST":
            if not self._is_admin(headers):
                return _NOT_SIMULATOR
            if url.path == CAPACITY_PATH:
                return self._admin_capacity(query)
            if url.path.startswith(ADMIN_PREFIX):
                return self._admin(url.path[len(ADMIN_PREFIX) :], query)
        route, params = match_route(method, url.path)
        body: Any = None
        with self.lock:
            self.state.catch_up()  # what fell due since the last request happens first (the twin's clock)
            call = Call(method, url.path, query, route.method_id if route else None, None, 0, None)
            self._record(call, len(raw))
            try:
                if route is None:
                    raise ApiError(404, "NOT_FOUND", f"{method} {url.path} is not an emulated API method")
                authorization = headers.get("authorization", "")
                if not authorization.startswith("Bearer ") or authorization[7:] not in self.tokens:
                    raise ApiError(
                        401, "UNAUTHENTICATED", "Request is missing valid authentication credentials."
                    )
                body = json.loads(raw) if raw else None
                call.request = body
                self.authorize(authorization[7:], route.method_id, body, params)
                status, answer = 200, getattr(self, route.handler)(params, query, body)
            except ApiError as exc:
                status, answer = exc.code, exc.body()
            except (ValueError, TypeError, KeyError) as exc:
                status, answer = 400, ApiError(400, "INVALID_ARGUMENT", f"bad request: {exc}").body()
            call.status, call.response = status, answer
            return status, answer

    def _record(self, call: Call, size: int) -> None:
        """Append `call` to `calls`, dropping the oldest beyond MAX_CALLS or MAX_STORED_BYTES."""
        self.calls.append(call)
        self._stored.append(size)
        while len(self.calls) > MAX_CALLS or (len(self.calls) > 1 and sum(self._stored) > MAX_STORED_BYTES):
            del self.calls[0], self._stored[0]

    def _is_admin(self, headers: dict[str, str]) -> bool:
        """Whether an admin call carries `admin_token` (set once the simulation serves)."""
        given = headers.get(ADMIN_HEADER.lower(), "")
        return bool(self.admin_token) and secrets.compare_digest(given, self.admin_token)

    def _admin_capacity(self, query: dict[str, str]) -> tuple[int, Any]:
        """The simulator's capacity call: the zone's free hosts of a type, in the twin."""
        if self.admin_capacity is None:
            return _NOT_SIMULATOR
        try:
            hosts = int(query.get("hosts", ""))
        except ValueError:
            hosts = -1
        if hosts < 0:
            message = "hosts must be a whole number of hosts, 0 or more"
            return 400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}
        with self.lock:
            return 200, self.admin_capacity(hosts, query.get("zone") or None, query.get("type") or None)

    def _admin(self, name: str, query: dict[str, str]) -> tuple[int, Any]:
        """The simulator's own preemption request (not a Google API)."""
        if self.admin_preempt is None:
            return _NOT_SIMULATOR
        try:
            notice_s = float(query.get(NOTICE_PARAMETER, "0"))
        except ValueError:
            notice_s = -1.0
        if not 0 <= notice_s <= MAX_NOTICE_S:
            message = f"{NOTICE_PARAMETER} must be a number of seconds from 0 to {MAX_NOTICE_S:.0f}"
            return 400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}
        try:
            return 200, {"preempted": name, "hosts": list(self.admin_preempt(name, notice_s))}
        except KeyError as exc:
            return 404, {"error": {"code": 404, "message": str(exc.args[0]), "status": "NOT_FOUND"}}


class _Handler(KeepAliveHandler):
    server: CloudApiEmulator

    def _answer(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        refused = self.server.refusal(self.command, self.path, self.client_address[0], length)
        if refused is None and length < 0:
            refused = 400, ApiError(400, "INVALID_ARGUMENT", "bad Content-Length").body()
        if refused is not None:  # the body stays unread: the connection ends with the answer
            self.close_connection = True
            self._send(*refused)
            return
        raw = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            answer = self.server.serve(self.command, self.path, headers, raw)
        except Exception as exc:  # a fault of the emulation or of a simulator hook (a host's boot)
            # Answered as Google answers its own faults, so the caller reads the cause instead of
            # a connection closed without an answer; the traceback goes to the emulation's log.
            traceback.print_exc()
            failed = ApiError(500, "INTERNAL", f"the emulation failed: {type(exc).__name__}: {exc}")
            answer = 500, failed.body()
        self._send(*answer)

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        return None


def main(argv: list[str] | None = None) -> None:
    """Serve the emulation on HOST:PORT until killed (the simulator starts it this way)."""
    parser = argparse.ArgumentParser(prog="python -m rayslice.local.google.cloud_api.emulator")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = CloudApiEmulator((args.host, args.port))
    print(server.url, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
