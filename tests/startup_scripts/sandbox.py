"""A sandbox that runs the whole rendered boot script with real bash, stubbed only at the edges.

- One local HTTP server plays the GCE metadata server (instance attributes, the service
  account's access token, guest attributes) and Secret Manager, speaking its documented JSON:
  ``GET /v1/projects/P/secrets/S/versions/latest:access`` → ``{"name": …, "payload": {"data":
  base64}}``, and only with the access token as bearer. Faults are knobs on it.
- ``curl`` is a wrapper that records its argv and sends the script's two fixed hosts to that
  server, then runs the real curl (stdin included, so ``--config -`` is real).
- ``uv`` (pre-placed where the script bootstraps it) and ``ray`` are stubs that record their
  arguments and environment; the stub ``ray start`` prints Ray's "Ray runtime started" line and
  blocks like ``--block`` does. With ``ray_start_failures=N`` its first N starts fail as Ray's
  does when the raylet does not register in time, leaving a daemon behind (``leftovers``).

Everything else (bash, python3, coreutils, the supervisor loop, the files and their modes) is
real. No root is needed; each sandbox kills its supervisor's process group when done.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

from rayslice import spec as spec_module
from rayslice.local.google.http_handler import QuietOnHangUpHandler
from rayslice.local.host.processes import cmdline
from rayslice.startup_scripts import RenderOptions
from rayslice.startup_scripts.templating import render_template
from rayslice.startup_scripts.variables import script_variables
from tests import serving

ACCESS_TOKEN = "ya29.sandbox-access-token-7f3a"
PROJECT = "sandbox-project"
REAL_CURL = shutil.which("curl") or "/usr/bin/curl"


@dataclass
class Faults:
    metadata_503_until: float = 0.0  # monotonic time before which every metadata GET answers 503
    metadata_hangs: bool = False  # every metadata GET is accepted and never answered
    missing: set[str] = field(default_factory=set)  # metadata paths that answer 404
    secret_failures: int = 0  # Secret Manager answers 503 this many times first
    secret_denied: int = 0  # then 403 (IAM not yet propagated) this many times


class StubCloud(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, metadata: dict[str, str], secrets: dict[str, str]):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.metadata = metadata
        self.secrets = secrets
        self.faults = Faults()
        self.states: list[str] = []
        self.gets: Counter[str] = Counter()  # metadata GETs by path (its query left off)
        self.secret_requests = 0
        self.lock = threading.Lock()
        serving.start(self)

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def state(self) -> str:
        return self.states[-1] if self.states else ""


class _Handler(QuietOnHangUpHandler):
    """A boot script's curl that gives up (its --max-time on a loaded machine) hangs up before its
    answer is written: dropped, as the real server drops it, with no traceback in the test log."""

    server: StubCloud

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _send(self, code: int, body: str = "", content_type: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Metadata-Flavor", "Google")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        server = self.server
        if self.path.startswith("/sm/v1/"):
            return self._secret(self.path.removeprefix("/sm/v1/"))
        path = self.path.removeprefix("/computeMetadata/v1/")
        with server.lock:
            server.gets[path.partition("?")[0]] += 1
        if self.headers.get("Metadata-Flavor") != "Google":
            return self._send(403, "Missing Metadata-Flavor:Google header.")
        if server.faults.metadata_hangs:
            time.sleep(30)
            return
        if time.monotonic() < server.faults.metadata_503_until:
            return self._send(503, "unavailable")
        if path in server.faults.missing or path not in server.metadata:
            return self._send(404, "not found")
        return self._send(200, server.metadata[path])

    def do_PUT(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length).decode()
        if self.path.endswith("/guest-attributes/rayslice/state"):
            with self.server.lock:
                self.server.states.append(body)
        self._send(200)

    def _secret(self, resource: str) -> None:
        server = self.server
        with server.lock:
            server.secret_requests += 1
            if server.faults.secret_failures > 0:
                server.faults.secret_failures -= 1
                return self._send(
                    503, '{"error": {"code": 503, "status": "UNAVAILABLE"}}', "application/json"
                )
            if server.faults.secret_denied > 0:
                server.faults.secret_denied -= 1
                return self._send(
                    403, '{"error": {"code": 403, "status": "PERMISSION_DENIED"}}', "application/json"
                )
        if self.headers.get("Authorization") != f"Bearer {ACCESS_TOKEN}":
            return self._send(
                401, '{"error": {"code": 401, "status": "UNAUTHENTICATED"}}', "application/json"
            )
        parts = resource.split("/")
        # projects/P/secrets/S/versions/latest:access
        if len(parts) != 6 or parts[0] != "projects" or parts[2] != "secrets" or parts[5] != "latest:access":
            return self._send(400, '{"error": {"code": 400}}', "application/json")
        name = parts[3]
        if parts[1] != PROJECT or name not in server.secrets:
            return self._send(404, '{"error": {"code": 404, "status": "NOT_FOUND"}}', "application/json")
        payload = base64.b64encode(server.secrets[name].encode()).decode()
        body = {"name": f"projects/{PROJECT}/secrets/{name}/versions/1", "payload": {"data": payload}}
        return self._send(200, json.dumps(body), "application/json")


def tpu_vm_metadata(accelerator: str, worker: int, hosts: int, attributes: dict[str, str]) -> dict[str, str]:
    """Metadata of a Cloud TPU VM host: the TPU API's attributes, all hosts at 127.0.0.1."""
    endpoints = ",".join("unknown:unknown:127.0.0.1" for _ in range(hosts))
    values = {
        "accelerator-type": accelerator,
        "agent-worker-number": str(worker),
        "instance-id": "sandbox-slice-0",
        "worker-network-endpoints": endpoints,
        "tpu-env": f"ACCELERATOR_TYPE: '{accelerator}'\nTOPOLOGY: '4x4'\nWORKER_ID: '{worker}'\n",
        **attributes,
    }
    return base_metadata(values, name=f"sandbox-slice-0-vm{worker}")


def base_metadata(attributes: dict[str, str], name: str) -> dict[str, str]:
    tree = {f"instance/attributes/{key}": value for key, value in attributes.items()}
    token = {"access_token": ACCESS_TOKEN, "expires_in": 3599, "token_type": "Bearer"}
    tree |= {
        "instance/network-interfaces/0/ip": "127.0.0.1",
        "instance/name": name,
        "project/project-id": PROJECT,
        "instance/service-accounts/default/token": json.dumps(token),
    }
    return tree


class Sandbox:
    """One host: a root directory, stub tools, a stub cloud, and the rendered script."""

    def __init__(
        self,
        tmp: Path,
        cloud: StubCloud,
        *,
        uv_failures: int = 0,
        unresolvable: bool = False,
        real_uv: bool = False,
        ray_start_failures: int = 0,
    ):
        self.tmp = tmp
        self.cloud = cloud
        self.root = tmp / "root"
        self.bin = tmp / "bin"
        self.logs = tmp / "logs"
        for directory in (self.root, self.bin, self.logs):
            directory.mkdir(parents=True, exist_ok=True)
        self.curl_log = self.logs / "curl-argv"
        self.uv_log = self.logs / "uv"
        self.ray_log = self.logs / "ray"
        self.uv_count = self.logs / "uv-pip-count"
        self.ray_start_count = self.logs / "ray-start-count"
        self.leftovers = self.logs / "ray-leftovers"  # PIDs of the daemons failed starts left
        self._write(
            self.bin / "curl",
            f"""#!/bin/bash
{{ printf '%s ' "$@"; printf '\\n'; }} >>{self.curl_log}
args=()
for a in "$@"; do
  a=${{a/#http:\\/\\/metadata.google.internal\\//http://127.0.0.1:{cloud.port}/}}
  a=${{a/#https:\\/\\/secretmanager.googleapis.com\\//http://127.0.0.1:{cloud.port}/sm/}}
  args+=("$a")
done
exec {REAL_CURL} "${{args[@]}}"
""",
        )
        self._write(
            self.bin / "ray",
            f"""#!/bin/bash
{{ printf 'argv:'; printf ' %s' "$@"; echo; env | grep -E '^(TPU|RAY_AUTH|UV_INDEX|JAX)_' | sort; }} \\
  >>{self.ray_log}
if [[ $1 == start ]]; then
  n=$(cat {self.ray_start_count} 2>/dev/null || echo 0)
  echo $((n + 1)) >{self.ray_start_count}
  if ((n < {ray_start_failures})); then
    sleep 601 </dev/null >/dev/null 2>&1 &  # the raylet a timed-out start leaves running
    echo $! >>{self.leftovers}
    echo "The current node timed out during startup. This could happen because some of the Ray" >&2
    echo "processes failed to startup, or the GCS has become overloaded." >&2
    exit 1
  fi
fi
echo "Ray runtime started."
exec sleep 600
""",
        )
        os.symlink(sys.executable, self.bin / "python3")
        # DNS: a Compute Engine instance name (…-w<N>) resolves to this machine.
        self._write(
            self.bin / "getent",
            f"""#!/bin/bash
if [[ $1 == ahostsv4 && $2 =~ -w[0-9]+$ ]]; then echo "127.0.0.1       STREAM $2"; exit 0; fi
exec {shutil.which("getent") or "/usr/bin/getent"} "$@"
""",
        )
        if real_uv:
            return
        self._write(
            self.root / "opt/rayslice/uv/bin/uv",
            f"""#!/bin/bash
{{ printf '%s ' "$@"; printf '\\n'; env | grep ^UV_INDEX | sort; }} >>{self.uv_log}
case $1 in
  venv)
    venv=${{!#}}
    mkdir -p "$venv/bin"
    ln -sf {self.bin / "ray"} "$venv/bin/ray"
    ln -sf {sys.executable} "$venv/bin/python"
    ;;
  pip)
    n=$(cat {self.uv_count} 2>/dev/null || echo 0)
    echo $((n + 1)) >{self.uv_count}
    if ((n < {uv_failures})); then
      echo "error: Request failed after 3 retries: connection reset by peer" >&2
      exit 2
    fi
    if [[ {int(unresolvable)} == 1 ]]; then
      echo "  x No solution found when resolving dependencies:" >&2
      echo "  -> Because there is no version of nothing-such==9 and you require it, we can" >&2
      echo "     conclude that your requirements are unsatisfiable." >&2
      exit 1
    fi
    ;;
esac
""",
        )

    @staticmethod
    def _write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)

    def render(self, spec: spec_module.ClusterSpec, gcs_port: object, **overrides: object) -> Path:
        variables = script_variables(spec, RenderOptions(supervisor="process", root=str(self.root)))
        script = self.tmp / "boot.sh"
        # The package cache is off unless a test turns it on: the sandbox has no proxpi to run.
        defaults = {"gcs_port": gcs_port, "package_cache": "0"}
        script.write_text(render_template("startup.sh.j2", **{**variables, **defaults, **overrides}))
        return script

    def environment(self, **extra: str) -> dict[str, str]:
        return {
            "PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.tmp),
            "RAYSLICE_METADATA_DEADLINE_S": "20",
            "RAYSLICE_TOKEN_DEADLINE_S": "30",
            "RAYSLICE_RETRY_MAX_DELAY_S": "1",
            **extra,
        }

    def boot(self, script: Path, timeout: float = 90, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(script)],
            env=self.environment(**env),
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    @property
    def log(self) -> str:
        path = self.root / "var/log/rayslice/boot.log"
        return path.read_text() if path.exists() else ""

    def supervisor_pid(self) -> int | None:
        path = self.root / "var/lib/rayslice/rayslice-ray.pid"
        return int(path.read_text()) if path.exists() else None

    def supervisor_alive(self) -> bool:
        pid = self.supervisor_pid()
        if pid is None:
            return False
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def ray_starts(self) -> list[str]:
        return (
            [line for line in self.ray_log.read_text().splitlines() if line.startswith("argv:")]
            if (self.ray_log.exists())
            else []
        )

    def wait(self, condition: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; states {self.cloud.states}; log:\n{self.log[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Power off: every supervisor the boot started (Ray's, the TPU metrics endpoint's, the
        package cache's, ...) is killed with its process group, as a VM's processes all go.

        A test that ends right after its boot can get here before a supervisor's loop has run
        `setsid` (the boot writes the pidfile as it forks the loop): until then the loop leads no
        process group, `killpg` misses it, and it runs on after the suite (one did, for half an
        hour, its `boot.sh run-ray` retrying against a stub cloud that was gone). Such a loop is
        killed by its pid, once its environment shows it is this sandbox's."""
        for pidfile in (self.root / "var/lib/rayslice").glob("*.pid"):
            try:
                pid = int(pidfile.read_text())
            except (OSError, ValueError):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            if self._runs_here(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)  # what it started, had it just run setsid

    def _runs_here(self, pid: int) -> bool:
        """Whether `pid` is a live process of this sandbox (a PID of a pidfile may have been reused
        by another process since): every process the boot starts has its HOME."""
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        return f"HOME={self.tmp}".encode() in environ


def group_processes(group: int) -> list[tuple[int, list[str]]]:
    """(pid, argv) of every process in process group `group` (a supervisor's group, say)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            pgrp = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
        except (OSError, IndexError, ValueError):
            continue  # gone, or not a process
        if pgrp == group:
            found.append((int(entry.name), cmdline(int(entry.name))))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WheelIndex(ThreadingHTTPServer):
    """A PEP 503 simple index over a wheelhouse directory, behind HTTP basic auth."""

    daemon_threads = True

    def __init__(self, wheelhouse: Path, wheels: list[str], username: str, password: str):
        super().__init__(("127.0.0.1", 0), _IndexHandler)
        self.files = {name: wheelhouse / name for name in wheels}
        self.authorization = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        self.served: list[str] = []
        self.refused = 0
        serving.start(self)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/simple"

    def projects(self) -> dict[str, list[str]]:
        projects: dict[str, list[str]] = {}
        for name in self.files:
            project = re.sub(r"[-_.]+", "-", name.split("-")[0]).lower()
            projects.setdefault(project, []).append(name)
        return projects


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _IndexHandler(QuietOnHangUpHandler):
    server: WheelIndex

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self.do_GET(head=True)

    def do_GET(self, head: bool = False) -> None:
        server = self.server
        if self.headers.get("Authorization") != server.authorization:
            server.refused += 1
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="index"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if parts[:1] == ["files"] and len(parts) == 2 and parts[1] in server.files:
            if not head:
                server.served.append(parts[1])
            data = server.files[parts[1]].read_bytes()
            content_type = "application/octet-stream"
        elif parts == ["simple"]:
            links = "".join(f'<a href="/simple/{p}/">{p}</a>' for p in server.projects())
            data, content_type = f"<html><body>{links}</body></html>".encode(), "text/html"
        elif len(parts) == 2 and parts[0] == "simple" and parts[1] in server.projects():
            links = "".join(
                f'<a href="/files/{n}#sha256={_sha256(server.files[n])}">{n}</a>'
                for n in server.projects()[parts[1]]
            )
            data, content_type = f"<html><body>{links}</body></html>".encode(), "text/html"
        else:
            data, content_type = b"not found", "text/plain"
            self.send_response(404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)
