"""Simulated host images (`rayslice.local.simulation.images`): what is captured from a host's
root, what is refused, and what a new host's root starts with."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayslice.errors import SimulatorError
from rayslice.local.simulation import images


def _installed_root(root: Path, fingerprint: str = "0123456789abcdef") -> Path:
    venv = root / "opt/rayslice/venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").symlink_to("/usr/bin/python3")  # a venv's python is a link, kept as one
    (venv / ".rayslice-install").write_text(fingerprint)
    (root / "opt/rayslice/uv/bin").mkdir(parents=True)
    (root / "var/log/rayslice").mkdir(parents=True)  # the host's own boot, not part of the image
    return root


def test_capture_takes_the_install_and_nothing_else(tmp_path):
    root = _installed_root(tmp_path / "host")
    assert images.capture(root, tmp_path / "image") == "0123456789abcdef"
    assert (tmp_path / "image/opt/rayslice/venv/bin/python").is_symlink()
    assert (tmp_path / "image/opt/rayslice/uv/bin").is_dir()
    assert not (tmp_path / "image/var").exists()


def test_a_host_that_has_not_finished_installing_is_no_image(tmp_path):
    root = _installed_root(tmp_path / "host")
    (root / images.INSTALL_MARKER).unlink()  # the boot script writes it last
    with pytest.raises(SimulatorError, match="no finished install"):
        images.capture(root, tmp_path / "image")


def test_an_image_is_made_once(tmp_path):
    root = _installed_root(tmp_path / "host")
    images.capture(root, tmp_path / "image")
    with pytest.raises(SimulatorError, match="exists"):
        images.capture(root, tmp_path / "image")


def test_install_puts_the_image_below_a_new_root_and_check_refuses_other_dirs(tmp_path):
    images.capture(_installed_root(tmp_path / "host"), tmp_path / "image")
    images.check(tmp_path / "image")
    images.install(tmp_path / "image", tmp_path / "new")
    assert (tmp_path / "new" / images.INSTALL_MARKER).read_text() == "0123456789abcdef"
    with pytest.raises(SimulatorError, match="not a simulated host image"):
        images.check(tmp_path / "host" / "var")
