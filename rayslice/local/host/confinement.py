"""What a simulated host may see and change of the machine it runs on.

A simulated host runs as root on the developer's machine, so without this a job or a wheel on
it could read the machine's credentials (``/root/.config/gcloud``, the owner's ADC file) or
rewrite the venv that the root-run metadata servers and cloud API emulation import. The host's
PID 1 (`boot`) therefore confines it, in the host's own mount namespace, before the startup
script runs (`confine`):

* secrets are covered by empty read-only tmpfs: ``/root``, ``/home``, ``/etc/ssh``, the home of
  root and of every login user (uid >= 1000) in ``/etc/passwd`` wherever it lies, and the
  simulation's state dir (other hosts' files, the owner's cloud API key and admin token);
  ``/etc/shadow`` and ``/etc/gshadow`` read as empty. What the host legitimately runs on and
  happens to lie below a cover (the interpreter under ``/root/.pyenv``, a venv or checkout in a
  home) is bound back, read-only, at its own path;
* ``/run`` (and ``/var/run`` where it is a directory of its own) is a fresh tmpfs: the machine's
  daemons keep their Unix sockets there (D-Bus's system bus, systemd's private socket, Docker's),
  each a way to run commands as the machine's root, and ``connect()`` is no write, so a read-only
  mount would not stop it. Only the host's own directories are bound into it (`fresh_run`'s
  `own`: its root at the rendered ``root``, the simulation's shared folder), and what it runs
  on, read-only;
* the directories where daemons keep a Unix socket outside ``/run`` (`DAEMON_DIRS`: LXD's and
  Incus's ``unix.socket``, every snap's data, the kubelet's sockets, Nix's and Guix's build
  daemons, MySQL's socket on Fedora-family systems) are covered by empty read-only tmpfs too, where
  they exist (a link is covered at its target): a connect() there would be as good as the
  machine's root, and a read-only mount does not stop a connect(). A socket some other daemon keeps
  outside ``/run`` and these directories stays reachable: docs/simulator.md says so;
* every other mount of the machine is made read-only in this namespace (``remount,bind,ro``:
  per mount, never the filesystem itself), except what is the host's own: its root (the
  rendered ``root``), its private ``/tmp``, ``/run`` and ``/dev/shm``;
* ``/dev`` is a fresh tmpfs with the harmless character devices only (no disks), a private
  devpts and ``/dev/shm``; ``/proc/sys``, ``/proc/sysrq-trigger`` and friends are read-only;
* every process the host starts runs with a capability bounding set of `KEPT_CAPABILITIES`
  (`confined_argv`): without CAP_SYS_ADMIN it cannot unmount a cover or remount anything
  read-write, without CAP_NET_ADMIN / CAP_NET_RAW it cannot change its address or forge packets
  (the cloud API emulation admits callers by address), without CAP_DAC_READ_SEARCH it cannot
  open files by handle around the mounts, without CAP_MKNOD it cannot make a disk node, without
  CAP_SYS_PTRACE it cannot reach into PID 1, which keeps every capability.

The host's own IPC namespace (SysV shared memory, semaphores, message queues, POSIX message
queues) comes from the ``unshare`` that starts `boot` (`boot.UNSHARE`), and abstract Unix sockets
belong to its network namespace. The kernel, the CPU and memory stay shared, and so does
whatever the machine's root can read outside the covers (``/etc``, ``/usr``, ``/opt``, other
directories at the top): read-only, but readable. docs/simulator.md ("Security model") says so.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

# Docker's default set, less CAP_NET_RAW (forged packets on the bridge) and CAP_MKNOD (disk nodes).
KEPT_CAPABILITIES = (
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "net_bind_service",
    "sys_chroot",
    "setfcap",
    "audit_write",
)
COVERED_DIRS = (Path("/root"), Path("/home"), Path("/etc/ssh"))
# Where daemons that act as root for whoever connects keep their Unix sockets outside /run (with
# their state: certificates, databases, pods' secrets), covered as COVERED_DIRS are.
DAEMON_DIRS = (
    Path("/var/snap"),  # every snap's data: LXD's common/lxd/unix.socket, MicroK8s's containerd
    Path("/var/lib/lxd"),  # LXD from a distribution package: unix.socket
    Path("/var/lib/incus"),  # Incus: unix.socket (incus.socket's ListenStream)
    Path("/var/lib/kubelet"),  # the kubelet: pod-resources and device-plugin sockets, pods' secrets
    Path("/nix/var/nix/daemon-socket"),  # Nix's build daemon, which trusts root
    Path("/var/guix/daemon-socket"),  # Guix's build daemon
    Path("/var/lib/mysql"),  # MySQL and MariaDB on Fedora-family systems: mysql.sock
)
COVERED_FILES = (Path("/etc/shadow"), Path("/etc/gshadow"))
# The machine's runtime directories, replaced (not covered read-only): see the module's docstring.
RUN_DIRS = (Path("/run"), Path("/var/run"))
# A VM's /run is a small tmpfs too; this one holds only what the host writes there itself.
RUN_TMPFS = "mode=0755,size=16m,nosuid,nodev"
FIRST_LOGIN_UID = 1000
# Kernel knobs that root may write by file mode alone (core_pattern runs a program as the
# machine's root; sysrq-trigger reboots it): read-only, as container runtimes mount them.
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
# The character devices a program expects, with their fixed numbers (Documentation/admin-guide/devices.txt).
DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}


def confined_argv(argv: Sequence[str]) -> list[str]:
    """`argv` run with only `KEPT_CAPABILITIES` in its (and its descendants') bounding set."""
    keep = ",".join(f"+{cap}" for cap in KEPT_CAPABILITIES)
    return ["setpriv", "--inh-caps=-all", f"--bounding-set=-all,{keep}", "--", *argv]


def login_homes(passwd: str) -> list[Path]:
    """Home directories of root and of login users (uid >= 1000) in an /etc/passwd text."""
    homes = []
    for line in passwd.splitlines():
        fields = line.split(":")
        if len(fields) < 7 or not fields[2].isdigit():
            continue
        uid, home = int(fields[2]), fields[5]
        if (uid == 0 or FIRST_LOGIN_UID <= uid < 65534) and os.path.isabs(home) and home != "/":
            homes.append(Path(os.path.normpath(home)))
    return homes


def outermost(paths: Iterable[Path]) -> list[Path]:
    """`paths` without those that lie inside another one, shortest first."""
    found = sorted(set(paths), key=lambda p: (len(p.parts), str(p)))
    return [p for i, p in enumerate(found) if not any(p.is_relative_to(q) for q in found[:i])]


def covers(passwd: str, state_dir: Path, daemon_dirs: Iterable[Path] = ()) -> list[Path]:
    """The directories a host sees empty (`COVERED_DIRS`, login homes, the state dir, and
    `daemon_dirs`, as `daemon_dirs` finds them)."""
    return outermost([*COVERED_DIRS, *login_homes(passwd), state_dir, *daemon_dirs])


def daemon_dirs(candidates: Iterable[Path] = DAEMON_DIRS) -> list[Path]:
    """The `candidates` that are directories on this machine, each where it really lies (a link
    to elsewhere is covered at its target), except what lies in /run: the host's /run is fresh."""
    found = []
    for candidate in candidates:
        real = candidate.resolve()
        if real.is_dir() and not any(real.is_relative_to(run) for run in RUN_DIRS):
            found.append(real)
    return found


def exposures(needed: Iterable[Path], hidden: Sequence[Path]) -> list[Path]:
    """The paths among `needed` (and where their symlinks lead) that lie below a cover, to bind back."""
    candidates = [p for n in needed for p in (Path(os.path.normpath(n)), n.resolve())]
    return outermost(p for p in candidates if any(p != h and p.is_relative_to(h) for h in hidden))


def run_dirs() -> list[Path]:
    """`RUN_DIRS` that are directories of their own (on Debian and Ubuntu /var/run links to /run)."""
    return [d for d in RUN_DIRS if d.is_dir() and not d.is_symlink()]


def mount_points(mountinfo: str) -> list[str]:
    """Every mount point in a /proc/self/mountinfo text, in order, without repeats (escapes decoded)."""
    points: list[str] = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            point = _unescape(fields[4])
            if point not in points:
                points.append(point)
    return points


def read_only_points(points: Sequence[str], writable: Sequence[Path], hidden: Sequence[Path]) -> list[str]:
    """The mount points to remount read-only: all but the writable ones, procfs (its knobs are
    handled one by one) and what lies below a cover (unreachable, or bound back read-only)."""
    keep = [*writable, Path("/proc")]
    return [
        p
        for p in points
        if not any(Path(p).is_relative_to(k) for k in keep)
        and not any(Path(p) != h and Path(p).is_relative_to(h) for h in hidden)
    ]


def fresh_run(*, own: Mapping[Path, Path], needed: Sequence[Path]) -> None:
    """An empty tmpfs on /run (and on /var/run where it is a directory of its own), with `own`
    bound in, writable, and `needed` bound back read-only where it lies below. Runs as root in the
    host's own mount namespace (`boot`), before anything else hides `own`'s sources (the private
    /tmp, the covers), and before `confine`.

    `own` maps a path to the host's directory bound there: its root at the rendered ``root``, the
    simulation's shared folder at its own path. `needed` are as in `confine`.
    """
    runs = run_dirs()
    # Opened before the tmpfs hides them; the kernel resolves /proc/self/fd/N to the original.
    sources = {target: os.open(source, os.O_PATH) for target, source in own.items()}
    handles = {path: os.open(path, os.O_PATH) for path in exposures(needed, runs) if path.exists()}
    try:
        for run in runs:
            _mount("-t", "tmpfs", "-o", RUN_TMPFS, "tmpfs", str(run))
        for target, fd in sorted(sources.items(), key=lambda item: len(item[0].parts)):
            target.mkdir(parents=True, exist_ok=True)
            _mount("--no-canonicalize", "--bind", f"/proc/self/fd/{fd}", str(target), pass_fds=(fd,))
        for path, fd in handles.items():
            _bind_back(fd, path)
    finally:
        for fd in [*sources.values(), *handles.values()]:
            os.close(fd)


def confine(*, state_dir: Path, writable: Sequence[Path], needed: Sequence[Path]) -> None:
    """Set up this mount namespace as the module says. Runs as root in the host's own mount
    namespace (`boot`), after `fresh_run` and after the host's /tmp is in place; `writable` are
    the host's own mounts (`fresh_run`'s `own`, /tmp).

    `needed` are the machine's directories the host runs on (interpreter, venv, sources,
    packages): bound back read-only where a cover hides them.
    """
    hidden = covers(Path("/etc/passwd").read_text(), state_dir, daemon_dirs())
    back = exposures(needed, hidden)
    # Opened before the covers hide them; the kernel resolves /proc/self/fd/N to the original.
    handles = {path: os.open(path, os.O_PATH) for path in back if path.exists()}
    try:
        for cover in hidden:
            if cover.is_dir() and not cover.is_symlink():
                _mount("-t", "tmpfs", "-o", "mode=0755,size=1m,nosuid,nodev", "tmpfs", str(cover))
                for path, fd in handles.items():
                    if path.is_relative_to(cover):
                        _bind_back(fd, path)
                _mount("-o", "remount,bind,ro", str(cover))
    finally:
        for fd in handles.values():
            os.close(fd)
    for secret in COVERED_FILES:
        if secret.is_file() and not secret.is_symlink():
            _mount("--bind", "-o", "ro", "/dev/null", str(secret))
    _private_dev()
    for knob in PROC_READ_ONLY:
        path = Path("/proc") / knob
        if path.exists():
            _mount("--bind", "-o", "ro", str(path), str(path))
    # The host's /run is its own; the machine's mounts below it are hidden, like those below a cover.
    runs = run_dirs()
    points = mount_points(Path("/proc/self/mountinfo").read_text())
    for point in read_only_points(points, [*writable, Path("/dev"), *runs], [*hidden, *runs]):
        _mount("-o", "remount,bind,ro", point)


def _private_dev() -> None:
    """A fresh /dev: `DEVICES`, the standard links, a private devpts and /dev/shm (tmpfs)."""
    dev = Path("/dev")
    _mount("-t", "tmpfs", "-o", "mode=0755,size=1m,nosuid", "tmpfs", str(dev))
    for name, (major, minor) in DEVICES.items():
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(dev / name, 0o666)  # mknod's mode passes through the umask
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ):
        (dev / name).symlink_to(target)
    for sub in ("pts", "shm"):
        (dev / sub).mkdir()
    _mount("-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=0620", "devpts", str(dev / "pts"))
    _mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", str(dev / "shm"))


def _bind_back(fd: int, path: Path) -> None:
    """Bind the directory or file open as `fd` read-only at `path`, inside a cover."""
    if os.path.isdir(f"/proc/self/fd/{fd}"):
        path.mkdir(parents=True, exist_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    # --no-canonicalize: mount(8) would resolve the link to the (now covered) path's text.
    _mount("--no-canonicalize", "--bind", "-o", "ro", f"/proc/self/fd/{fd}", str(path), pass_fds=(fd,))


def _mount(*args: str, pass_fds: Sequence[int] = ()) -> None:
    subprocess.run(["mount", *args], check=True, pass_fds=tuple(pass_fds))


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
