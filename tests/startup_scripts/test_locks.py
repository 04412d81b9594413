"""Locks: the shipped presets' locks, trimming uv's hashes to a host's files, and resolving with
real uv against a local index of tiny wheels (no network)."""

from __future__ import annotations

import io
import re
import socket
import tarfile
from pathlib import Path

import pytest

from rayslice.errors import InvalidInput
from rayslice.local.simulation.package_index import IndexServer
from rayslice.spec import DEFAULT_RAY_VERSION
from rayslice.startup_scripts import locks
from rayslice.startup_scripts.variables import PRESETS, PYTHON_VERSION, lock_requirements, whole_lock_header
from tests import serving
from tests.startup_scripts.tiny_wheels import sha256


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_ships_a_lock_for_its_lines_and_the_hosts(preset):
    lock = locks.preset_lock(preset, lock_requirements(preset, DEFAULT_RAY_VERSION))
    assert lock is not None, f"regenerate it: python scripts/lock_presets.py {preset}"
    assert (lock.header["python"], lock.header["platform"]) == (PYTHON_VERSION, locks.PLATFORM)
    # Resolved as a stack lock of another Ray release is (`stack_locks.resolve_whole`): same sources.
    assert dict(lock.header) == whole_lock_header(preset, DEFAULT_RAY_VERSION)
    assert locks.parse(lock.text) == lock
    assert locks.foreign_line(lock.text) is None  # only the lines a stack lock may hold
    assert f"ray=={DEFAULT_RAY_VERSION}" in lock.pins()
    # The same resolution writes the same lock: uv's notes name the requirements file, never the
    # temporary folder it was resolved in.
    assert set(re.findall(r"#\s+(?:via )?-r (\S+)", lock.body)) == {"requirements.in"}
    # Every package is pinned by at least one hash (what --require-hashes needs).
    blocks = lock.body.split("==")[1:]
    assert all("--hash=sha256:" in block for block in blocks)
    assert locks.preset_lock(preset, lock_requirements(preset, "2.59.0")) is None


def test_slim_keeps_the_files_a_host_installs():
    wheel, mac, newer, sdist, other = ("a" * 64, "b" * 64, "c" * 64, "d" * 64, "e" * 64)
    body = (
        f"numpy==2.4.6 \\\n    --hash=sha256:{wheel} \\\n    --hash=sha256:{mac} \\\n"
        f"    --hash=sha256:{newer} \\\n    --hash=sha256:{sdist}\n    # via jax\n"
        f"pure==1.0 \\\n    --hash=sha256:{sdist}\n"
        f"unlisted==1.0 \\\n    --hash=sha256:{other}\n"
    )
    files = {
        "numpy": {
            wheel: "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
            mac: "numpy-2.4.6-cp311-cp311-macosx_14_0_arm64.whl",
            newer: "numpy-2.4.6-cp311-cp311-manylinux_2_39_x86_64.whl",  # newer glibc than the hosts'
            sdist: "numpy-2.4.6.tar.gz",
        },
        "pure": {sdist: "pure-1.0.tar.gz"},  # no wheel: the sdist stays
    }
    assert locks.slim(body, files, "3.11") == (
        f"numpy==2.4.6 \\\n    --hash=sha256:{wheel}\n    # via jax\n"
        f"pure==1.0 \\\n    --hash=sha256:{sdist}\n"
        f"unlisted==1.0 \\\n    --hash=sha256:{other}\n"
    )


def test_a_file_that_is_not_a_lock_is_refused():
    with pytest.raises(InvalidInput, match="header lacks"):
        locks.parse("six==1.17.0 --hash=sha256:" + "a" * 64 + "\n")


def _header(index: str, *requirements: str) -> dict[str, str]:
    return locks.header("test", requirements, PYTHON_VERSION, index, ())


def test_requirements_resolve_into_a_lock_of_the_files_the_index_serves(index, tmp_path):
    lock = locks.compile_lock(locks.uv_binary(), _header(index, "alpha<2"))
    assert lock.pins() == ["alpha==1.0", "beta==1.0"]
    assert "# via -r requirements.in" in lock.body  # no temporary path: the same input, the same lock
    for name in ("alpha-1.0", "beta-1.0"):
        assert f"--hash=sha256:{sha256(tmp_path / 'wheels' / f'{name}-py3-none-any.whl')}" in lock.body
    assert lock.header["index"] == index and locks.parse(lock.text) == lock


def test_constraints_hold_what_is_resolved_beside_them(index, tmp_path):
    constraints = tmp_path / "pins.txt"
    constraints.write_text("alpha==1.0\n")
    lock = locks.compile_lock(locks.uv_binary(), _header(index, "alpha"), constraints)
    assert "alpha==1.0" in lock.pins()


def test_requirements_that_do_not_resolve_are_refused(index):
    with pytest.raises(InvalidInput, match=r"cannot be locked.*alpha"):
        locks.compile_lock(locks.uv_binary(), _header(index, "alpha>5"))


def test_an_index_that_does_not_answer_is_refused(monkeypatch):
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")  # uv's default: three more tries, 9 s, backing off
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(InvalidInput, match="cannot be locked"):
        locks.compile_lock(
            locks.uv_binary(), _header(f"http://127.0.0.1:{port}/simple", "alpha"), timeout_s=120
        )


def test_uv_comes_from_the_uv_package():
    assert Path(locks.uv_binary()).name == "uv" and Path(locks.uv_binary()).exists()


def _sdist_that_runs_its_backend(directory: Path, marker: Path) -> Path:
    """``evil-1.0.tar.gz``: an sdist with no static metadata whose in-tree build backend (nothing
    to download) writes `marker` when anything asks it to build, as a hostile one would run code."""
    backend = (
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('built')\n"
        "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
        "def prepare_metadata_for_build_wheel(directory, config_settings=None):\n"
        "    raise RuntimeError('evil built')\n"
        "def build_wheel(directory, config_settings=None, metadata_directory=None):\n"
        "    raise RuntimeError('evil built')\n"
    )
    pyproject = '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    archive = directory / "evil-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in (("pyproject.toml", pyproject), ("backend.py", backend)):
            info = tarfile.TarInfo(f"evil-1.0/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return archive


def test_a_requirement_with_no_wheel_is_refused_without_building_it(tmp_path):
    """Resolving (`rayslice preview`, the Pulumi program) never runs a package's build backend:
    a requirement the index offers only as a source distribution is refused, saying so."""
    marker = tmp_path / "backend-ran"
    (tmp_path / "files").mkdir()
    _sdist_that_runs_its_backend(tmp_path / "files", marker)
    server = IndexServer(("127.0.0.1", 0), tmp_path / "files", 0.0, tmp_path / "counts.json")
    serving.start(server)
    try:
        index = f"http://127.0.0.1:{server.server_address[1]}/simple"
        with pytest.raises(InvalidInput, match=r"evil.*no wheel.*never built"):
            locks.compile_lock(locks.uv_binary(), _header(index, "evil"))
    finally:
        serving.stop(server)
    assert not marker.exists()
