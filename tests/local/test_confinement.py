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


def test_daemon_socket_dirs_are_covered_where_they_really_lie_and_never_in_the_hosts_run(tmp_path):
    real = tmp_path / "var" / "lib" / "incus"
    real.mkdir(parents=True)
    elsewhere = tmp_path / "data" / "mysql"
    elsewhere.mkdir(parents=True)
    linked = tmp_path / "var" / "lib" / "mysql"
    linked.symlink_to(elsewhere)
    a_file = tmp_path / "var" / "snap"
    a_file.touch()
    into_run = tmp_path / "var" / "lib" / "kubelet"
    into_run.symlink_to("/run")
    candidates = [real, linked, a_file, into_run, tmp_path / "nix" / "var" / "nix" / "daemon-socket"]
    assert confinement.daemon_dirs(candidates) == [real, elsewhere]
    assert confinement.covers(PASSWD, Path("/srv/state"), [Path("/var/lib/incus"), Path("/var/snap")])[
        -2:
    ] == [
        Path("/var/snap"),
        Path("/var/lib/incus"),
    ]


def test_the_known_daemon_sockets_outside_run_lie_in_a_covered_dir():
    """LXD's (snap and package), Incus's, MicroK8s's and Nix's sockets, by their documented paths."""
    for socket_path in (
        "/var/snap/lxd/common/lxd/unix.socket",
        "/var/lib/lxd/unix.socket",
        "/var/lib/incus/unix.socket",
        "/var/snap/microk8s/common/run/containerd.sock",
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "/nix/var/nix/daemon-socket/socket",
        "/var/guix/daemon-socket/socket",
        "/var/lib/mysql/mysql.sock",
    ):
        assert any(Path(socket_path).is_relative_to(d) for d in confinement.DAEMON_DIRS), socket_path


def test_the_interpreter_a_host_runs_is_among_what_it_needs():
    paths = boot.interpreter_paths()
    assert Path(sys.base_prefix) in paths and Path(sys.prefix) in paths


def test_the_mounts_chosen_to_turn_read_only_are_all_but_the_hosts_own_procfs_and_the_covered():
    """The selector alone; the root test below checks that the machine's root filesystem really
    is read-only on a booted host."""
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

machine_socket, daemon_socket, machine_file, machine_ipc, root, shared, wheels = sys.argv[1:]
libc = ctypes.CDLL(None, use_errno=True)
facts = {}
"""
    + CONNECT_PROBE
    + r"""
client = socket.socket(socket.AF_UNIX)
try:
    client.connect(daemon_socket)
    facts["daemon socket"] = "connected"
except OSError as exc:
    facts["daemon socket"] = errno.errorcode.get(exc.errno, str(exc))
try:
    open(machine_file, "w").close()
    facts["machine file"] = "written"
except OSError as exc:
    facts["machine file"] = errno.errorcode.get(exc.errno, str(exc))
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
    D-Bus's, systemd's or Docker's do, and to one where Incus (or LXD) keeps its own, and both
    must be refused; a file it writes on the machine's root filesystem is refused (remounted
    read-only). Its own state under /run (its root, the shared folder) stays writable, what it
    runs on there (a wheelhouse) readable; it cannot unmount a cover or mount anything."""
    run_id = secrets.token_hex(3)
    # A daemon's directory that this machine lacks, made for the test and removed after it.
    daemon_dir = next((d for d in (Path("/var/lib/incus"), Path("/var/lib/lxd")) if not d.exists()), None)
    if daemon_dir is None:
        pytest.skip("Incus and LXD both installed here: no daemon directory to make for the test")
    machine_file = Path("/var/tmp") / f"rayslice-test-{run_id}"
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
            [
                *(sys.executable, "-c", PROBE, f"{machine_run}/bus", f"{daemon_dir}/unix.socket"),
                *(str(machine_file), machine_ipc, root, str(shared), str(wheels)),
            ]
        )
        + "\n"
    )
    machine_run.mkdir()
    shared.mkdir()
    wheels.mkdir()
    (wheels / "a.whl").touch()
    listener = socket.socket(socket.AF_UNIX)
    daemon = socket.socket(socket.AF_UNIX)
    host = None
    try:
        listener.bind(f"{machine_run}/bus")
        listener.listen()
        daemon_dir.mkdir()
        daemon.bind(f"{daemon_dir}/unix.socket")
        daemon.listen()
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
        assert facts["daemon socket"] == "ENOENT", "the daemon's directory is covered, empty"
        assert facts["machine file"] == "EROFS" and not machine_file.exists()
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
        daemon.close()
        shutil.rmtree(daemon_dir, ignore_errors=True)
        machine_file.unlink(missing_ok=True)
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(machine_run, ignore_errors=True)
