"""What a simulated host may see of the machine (`confinement`), decided without root: the covers,
what is bound back below them, which mounts turn read-only, and the capabilities kept.
tests/integration/test_isolation.py checks the same from a job on a real simulated host."""

from __future__ import annotations

import sys
from pathlib import Path

from rayslice.local.host import boot, confinement

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


def test_the_hosts_processes_keep_no_capability_that_undoes_the_confinement():
    argv = confinement.confined_argv(["/bin/bash", "script"])
    assert argv[0] == "setpriv" and argv[-3:] == ["--", "/bin/bash", "script"]
    assert "--inh-caps=-all" in argv
    bounding = next(a for a in argv if a.startswith("--bounding-set="))
    assert bounding.split("=", 1)[1].split(",")[0] == "-all"
    kept = {c.lstrip("+") for c in bounding.split("=", 1)[1].split(",")[1:]}
    assert kept == set(confinement.KEPT_CAPABILITIES)
    # mount/umount, address changes, forged packets, open-by-handle, device nodes, ptrace, modules.
    for dangerous in (
        "sys_admin",
        "net_admin",
        "net_raw",
        "dac_read_search",
        "mknod",
        "sys_ptrace",
        "sys_module",
    ):
        assert dangerous not in kept
