"""A job on a simulated host cannot reach the machine it runs on (issue 20.4's acceptance): the
machine's credentials are not readable, the emulators' code is not writable, no Unix socket in
the machine's /run answers (issue 43's M3), and the emulated cloud API refuses the job's calls,
with the token its own host's metadata server hands it.

On the shared single-host slice, through `rayslice run` as a user submits a job; the job's
driver runs on the simulated host. `confinement`, the emulation's admission and the packet
filter are each unit-tested in tests/local; this is the whole, end to end."""

from __future__ import annotations

import json
import secrets
import socket
import sys
from pathlib import Path

import rayslice
from rayslice.local.simulation.state import CLOUD_API_ENDPOINT_FILE
from tests.integration.clusters import on, rayslice_run
from tests.local.test_confinement import CONNECT_PROBE

PROBE = (
    r"""
import errno, json, os, socket, sys, urllib.error, urllib.request

secret, api, machine_socket, *code_dirs = sys.argv[1:]
facts = {}
"""
    + CONNECT_PROBE
    + r"""
try:
    open(secret).read()
    facts["secret"] = "read"
except OSError as exc:
    facts["secret"] = errno.errorcode.get(exc.errno, str(exc))
for directory in code_dirs:
    probe = os.path.join(directory, ".rayslice-isolation-probe")
    try:
        open(probe, "w").close()
        os.unlink(probe)
        facts[directory] = "written"
    except OSError as exc:
        facts[directory] = errno.errorcode.get(exc.errno, str(exc))
metadata = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
request = urllib.request.Request(metadata, headers={"Metadata-Flavor": "Google"})
token = json.load(urllib.request.urlopen(request, timeout=10))["access_token"]
call = urllib.request.Request(
    f"{api}/v2/projects/p/locations/z/nodes", headers={"Authorization": f"Bearer {token}"}
)
try:
    urllib.request.urlopen(call, timeout=5)
    facts["api"] = 200
except urllib.error.HTTPError as exc:
    facts["api"] = exc.code
except OSError:
    facts["api"] = "no connection"
print("FACTS " + json.dumps(facts))
"""
)


@on("v6e-4")
def test_a_job_cannot_read_secrets_write_the_emulators_code_reach_the_machines_sockets_or_the_cloud_api(
    cluster, tmp_path
):
    # A secret in the home of the user running the simulator, as ~/.config/gcloud would be.
    secret = Path.home() / f".rayslice-isolation-{secrets.token_hex(4)}"
    secret.write_text("machine credential")
    secret.chmod(0o600)
    api = json.loads((cluster.state_dir / CLOUD_API_ENDPOINT_FILE).read_text())["url"]
    # What the root-run metadata servers and the cloud API emulation run: this venv and source.
    code = [sys.prefix, str(Path(rayslice.__file__).resolve().parent)]
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    # A root-owned socket in the machine's /run, as D-Bus's system bus, systemd's or Docker's.
    machine_socket = Path("/run") / f"rayslice-isolation-{secrets.token_hex(4)}.sock"
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(machine_socket))
        listener.listen()
        result = rayslice_run(cluster, str(script), str(secret), api, str(machine_socket), *code)
    finally:
        listener.close()
        machine_socket.unlink(missing_ok=True)
        secret.unlink()
    assert result.returncode == 0
    line = next(x for x in result.stdout.splitlines() if x.startswith("FACTS "))
    facts = json.loads(line[len("FACTS ") :])
    assert facts["secret"] == "ENOENT", "the machine's home is covered: the file is not there at all"
    assert facts["socket"] == "ENOENT", "the host's /run is a fresh one: the machine's socket is not there"
    assert [facts[d] for d in code] == ["EROFS", "EROFS"]
    # Dropped by the machine's packet filter; were it not, the emulation answers 403 by address.
    assert facts["api"] in ("no connection", 403)
