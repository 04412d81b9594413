"""PID 1 of a simulated host: what a VM's init and guest agent do at boot, and nothing more.

The simulator starts it as ``ip netns exec NS`` + `command`, so it runs in the host's network
namespace, as PID 1 of a fresh PID namespace with its own UTS, mount and IPC namespaces
(`UNSHARE`). It sets the hostname, gives the host a fresh /run with the host's own directory
bound over the shared root path (so every host runs the same script text with the same root), a
private /tmp (``<root>/tmp``), /dev and /dev/shm as separate VMs have, confines it
(`confinement`: the machine's secrets covered, the rest read-only, a reduced capability set),
runs the startup script once as root with a clean environment — output to the console log, exit
status to a file, as GCE's startup-script runner does — then reaps orphans until it is killed.
Killing it (or the ``unshare`` above it) ends every process of the host: a power-off.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from rayslice.local.host import confinement, tpu_runtime
from rayslice.local.host.paths import HostPaths

HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The namespaces of a host beside its network one: PID (`main` is PID 1, and the host ends with
# it), a /proc of its own, UTS (its hostname), mount, and IPC (SysV shared memory, semaphores and
# message queues, POSIX message queues: none of the machine's).
UNSHARE = ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--ipc")


def command(
    *,
    hostname: str,
    host_dir: Path,
    root: str,
    shares: Sequence[str],
    shared_writable: str,
    env: Mapping[str, str],
    mounts: Mapping[str, str] | None = None,
) -> list[str]:
    """The command that powers a host on; the simulator runs it inside ``ip netns exec NS``.
    The arguments are `main`'s."""
    return [
        *UNSHARE,
        "--",
        sys.executable,
        "-m",
        "rayslice.local.host.boot",
        "--hostname",
        hostname,
        "--host-dir",
        str(host_dir),
        "--root",
        root,
        *(f"--share={path}" for path in shares),
        f"--shared-writable={shared_writable}",
        *(f"--mount={target}={source}" for target, source in (mounts or {}).items()),
        *(f"--env={key}={value}" for key, value in env.items()),
    ]


def host_environment(home: str) -> dict[str, str]:
    """The environment of every process a simulated host starts (nothing leaks from the caller)."""
    return {
        "PATH": HOST_PATH,
        "HOME": home,
        "USER": "root",
        "LOGNAME": "root",
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
    }


def interpreter_paths() -> list[Path]:
    """What this interpreter runs from (the venv and the Python it was made from): every process
    of the host runs it, so the host must see it even where it lies below a cover (pyenv's
    Pythons live in /root)."""
    return [Path(p) for p in sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})]


def _under_tmp(paths: list[Path]) -> list[Path]:
    """The existing directories among `paths` that a private /tmp would hide, outermost first."""
    found = sorted(
        {p.resolve() for p in paths if p.is_dir() and p.resolve().is_relative_to("/tmp")},
        key=lambda p: len(p.parts),
    )
    return [p for i, p in enumerate(found) if not any(p.is_relative_to(q) for q in found[:i])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--host-dir", type=Path, required=True, help="the host's directory (paths.HostPaths)")
    parser.add_argument(
        "--root", type=Path, required=True, help="RenderOptions.root the script was rendered with"
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="extra script environment"
    )
    parser.add_argument(
        "--share",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="a directory of the machine the host runs on: visible, read-only, even under /tmp or a cover",
    )
    parser.add_argument(
        "--shared-writable",
        type=Path,
        help="a directory of the machine every host sees and may write at the same path (checkpoints)",
    )
    parser.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="TARGET=SOURCE",
        help="a directory of the machine the host sees at TARGET and may write (its cluster's record)",
    )
    args = parser.parse_args(argv)
    paths = HostPaths(args.host_dir)

    # Everything in the host dir is opened before /tmp is replaced and the state dir is covered,
    # through a bind of the dir onto itself: files held open for writing on a mount keep it from
    # turning read-only (EBUSY), and the machine's filesystem must (`confinement`).
    subprocess.run(["mount", "--bind", str(paths.dir), str(paths.dir)], check=True)
    script = paths.script.read_text()
    console = open(paths.console, "ab", buffering=0)  # noqa: SIM115 - open for the whole life of the host
    exit_file = open(paths.exit_file, "w")  # noqa: SIM115 - likewise, written each time the script exits
    tree = json.loads(paths.metadata_tree.read_text())
    for sub in ("tmp", "root"):
        (paths.root / sub).mkdir(parents=True, exist_ok=True)
    socket.sethostname(args.hostname)
    # The host's own, writable: its root at the rendered path, the shared folder at its own path.
    own = {args.root: paths.root}
    if args.shared_writable:
        own[args.shared_writable] = args.shared_writable
    for mount in args.mount:
        target, _, source = mount.partition("=")
        own[Path(target)] = Path(source)
    needed = [*args.share, *interpreter_paths()]
    confinement.fresh_run(own=own, needed=needed)
    private_tmp = paths.root / "tmp"
    for shared in _under_tmp(args.share):  # carried into the private /tmp at the same path, read-only
        target = private_tmp / shared.relative_to("/tmp")
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", "-o", "ro", str(shared), str(target)], check=True)
    subprocess.run(["mount", "--rbind", str(private_tmp), "/tmp"], check=True)
    confinement.confine(state_dir=paths.dir.parents[1], writable=[*own, Path("/tmp")], needed=needed)
    runtime_env = tpu_runtime.install(tree)  # TPU hosts only
    script_file = Path("/tmp/rayslice-startup-script")  # where GCE's runner puts it, too
    script_file.write_text(script)
    home = args.root / "root"

    console.write(
        f"{time.strftime('%Y-%m-%dT%H:%M:%S')} boot {args.hostname}: running startup-script\n".encode()
    )
    script_proc = subprocess.Popen(
        confinement.confined_argv(["/bin/bash", str(script_file)]),
        stdin=subprocess.DEVNULL,
        stdout=console,
        stderr=subprocess.STDOUT,
        env={**host_environment(str(home)), **runtime_env, **dict(e.split("=", 1) for e in args.env)},
        cwd="/",
    )
    while True:  # init's job: reap everything, note the script's exit
        try:
            pid, status = os.wait()
        except ChildProcessError:
            time.sleep(1)
            continue
        if pid == script_proc.pid:
            code = os.waitstatus_to_exitcode(status)
            exit_file.write(f"{code}\n")
            exit_file.flush()
            console.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} startup-script exited {code}\n".encode())


if __name__ == "__main__":
    sys.exit(main())
