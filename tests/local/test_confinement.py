"""What a simulated host may see of the machine (`confinement`), decided without root: the covers,
what is bound back below them, which mounts turn read-only; and, as root, what a host booted by
the real command can reach. tests/integration/test_isolation.py checks the same from a job on a
real simulated host."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rayslice.local.host import boot, confinement
from rayslice.local.host.paths import HostPaths

PASSWD = """root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
alice:x:1000:1000::/home/alice:/bin/bash
bob:x:1001:1001::/srv/bob:/bin/bash
weird:x:1002:1002::/:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
broken line
"""


def test_the_homes_of_root_and_login_users_are_covered_wherever_they_are():
    assert confinement.login_homes(PASSWD) == [Path("/root"), Path("/home/alice"), Path("/srv/bob")]
    covers = confinement.covers(PASSWD, Path("/work/project/.state/local"))
    assert covers == [
        Path("/home"),
        Path("/root"),
        Path("/etc/ssh"),
        Path("/srv/bob"),
        Path("/work/project/.state/local"),
    ]
    # A state dir in a home is covered with it.
    assert Path("/home/alice/p/.state") not in confinement.covers(PASSWD, Path("/home/alice/p/.state"))


def test_what_a_host_runs_on_is_bound_back_only_where_a_cover_hides_it(tmp_path):
    hidden = [Path("/root"), tmp_path / "home"]
    venv = tmp_path / "home" / "alice" / "proj" / ".venv"
    venv.mkdir(parents=True)
    outside = tmp_path / "opt" / "venv"
    outside.mkdir(parents=True)
    link = tmp_path / "opt" / "link"
    link.symlink_to(venv)
    back = confinement.exposures(
        [venv, venv / "lib", outside, link, Path("/root/.pyenv/versions/3.11")], hidden
    )
    assert back == [Path("/root/.pyenv/versions/3.11"), venv]  # a symlink's target too; nested ones once
    assert confinement.exposures([Path("/root")], hidden) == []  # a cover itself is never bound back


def test_the_interpreter_a_host_runs_is_among_what_it_needs():
    paths = boot.interpreter_paths()
    assert Path(sys.base_prefix) in paths and Path(sys.prefix) in paths


def test_every_mount_but_the_hosts_own_turns_read_only():
    mountinfo = "\n".join(
        f"{i} 1 0:{i} / {point} rw shared:1 - fs src rw"
        for i, point in enumerate(
            [
                "/",
                "/proc",
                "/proc/sys",
                "/dev",
                "/dev/shm",
                "/tmp",
                "/tmp/shared",
                "/run/rayslice-local/a1b2c3",
                "/work",
                "/my\\040disk",
                "/root",
                "/root/.pyenv/versions/3.11",
                "/home/alice/mnt",
                "/etc/hosts",
                "/work",
            ]
        )
    )
    points = confinement.mount_points(mountinfo)
    assert points.count("/work") == 1 and "/my disk" in points
    writable = [Path("/run/rayslice-local/a1b2c3"), Path("/tmp"), Path("/dev")]
    read_only = confinement.read_only_points(points, writable, [Path("/root"), Path("/home")])
    assert read_only == ["/", "/work", "/my disk", "/root", "/etc/hosts"]


# Probe code (Python, run on a host) that connects to the Unix socket at `machine_socket` and
# records the outcome in `facts`; tests/integration/test_isolation.py's job runs it too.
CONNECT_PROBE = """
client = socket.socket(socket.AF_UNIX)
try:
    client.connect(machine_socket)
    facts["socket"] = "connected"
except OSError as exc:
    facts["socket"] = errno.errorcode.get(exc.errno, str(exc))
"""
# Run by a host's startup script, as its jobs run: what it can reach of the machine.
PROBE = (
    r"""
import ctypes, errno, json, os, socket, sys

machine_socket, machine_ipc, root, shared, wheels = sys.argv[1:]
libc = ctypes.CDLL(None, use_errno=True)
facts = {}
"""
    + CONNECT_PROBE
    + r"""
facts["same ipc"] = os.readlink("/proc/self/ns/ipc") == machine_ipc
for name, call in (
    ("umount", lambda: libc.umount2(b"/root", 0)),  # would show the machine's /root
    ("mount", lambda: libc.mount(b"none", b"/run", b"tmpfs", 0, None)),
):
    failed = call() != 0
    facts[name] = errno.errorcode.get(ctypes.get_errno(), "?") if failed else "done"
for name, directory in (("root", root), ("shared", shared)):
    with open(os.path.join(directory, "written-by-host"), "w") as file:
        file.write(name)
facts["wheels"] = os.listdir(wheels)
try:
    open(os.path.join(wheels, "written-by-host"), "w").close()
    facts["wheels written"] = "yes"
except OSError as exc:
    facts["wheels written"] = errno.errorcode.get(exc.errno, str(exc))
print("FACTS " + json.dumps(facts))
"""
)


@pytest.mark.root
def test_a_hosts_processes_reach_no_socket_of_the_machine_and_cannot_undo_the_confinement(tmp_path):
    """A host booted by the very command the simulator runs (`boot.command`, without its network
    namespace): its startup script connects to a Unix socket listening in the machine's /run, as
    D-Bus's, systemd's or Docker's do, and must be refused. Its own state under /run (its root,
    the shared folder) stays writable, what it runs on there (a wheelhouse) readable; it cannot
    unmount a cover or mount anything."""
    run_id = secrets.token_hex(3)
    machine_run = Path("/run") / f"rayslice-test-{run_id}"
    shared = Path(f"{machine_run}-shared")  # the simulator makes Plan.shared_dir on the machine too
    wheels = machine_run / "wheels"  # a `--share` below /run: bound back read-only
    paths = HostPaths.of(tmp_path / "state", "probe-host")
    paths.root.mkdir(parents=True)
    paths.metadata_tree.write_text("{}")  # a CPU VM: no TPU runtime
    root = f"{machine_run}-root"  # made inside the host only
    machine_ipc = os.readlink("/proc/self/ns/ipc")
    paths.script.write_text(
        shlex.join(
            [sys.executable, "-c", PROBE, f"{machine_run}/bus", machine_ipc, root, str(shared), str(wheels)]
        )
        + "\n"
    )
    machine_run.mkdir()
    shared.mkdir()
    wheels.mkdir()
    (wheels / "a.whl").touch()
    listener = socket.socket(socket.AF_UNIX)
    host = None
    try:
        listener.bind(f"{machine_run}/bus")
        listener.listen()
        argv = boot.command(
            hostname="probe-host",
            host_dir=paths.dir,
            root=root,
            shares=[str(wheels), sys.prefix],  # the venv too, as the simulator shares it (it may lie in /tmp)
            shared_writable=str(shared),
            env={},
        )
        with open(paths.console, "ab") as console_file:  # as the simulator starts a host
            host = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=console_file, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 60
        while not (paths.exit_file.exists() and paths.exit_file.read_text()) and time.monotonic() < deadline:
            assert host.poll() is None, paths.console.read_text()
            time.sleep(0.1)
        console = paths.console.read_text()
        assert paths.exit_file.read_text() == "0\n", console
        facts = json.loads(next(x for x in console.splitlines() if x.startswith("FACTS "))[len("FACTS ") :])
        assert facts["socket"] == "ENOENT", "the machine's /run is not there: a fresh one is"
        assert facts["same ipc"] is False
        assert facts["umount"] == facts["mount"] == "EPERM"
        assert (paths.root / "written-by-host").read_text() == "root"
        assert (shared / "written-by-host").read_text() == "shared"
        assert facts["wheels"] == ["a.whl"] and facts["wheels written"] == "EROFS"
    finally:
        if host is not None:
            host.kill()  # unshare --kill-child: the host's PID 1 and everything below it end too
            host.wait()
        listener.close()
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(machine_run, ignore_errors=True)
