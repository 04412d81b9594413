"""The simulated internet's package index, in-process on loopback: PEP 503 pages, files with
their hashes, and the bytes it counts per client (what the benchmark reports)."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayslice.local.simulation.package_index import IndexServer, project_of
from tests import serving

WHEEL = "Foo_Bar-1.0-py3-none-any.whl"
SDIST = "baz.qux-2.1.tar.gz"


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[str, IndexServer]]:
    house = tmp_path / "house"
    house.mkdir()
    (house / WHEEL).write_bytes(b"wheel bytes" * 100)
    (house / SDIST).write_bytes(b"sdist")
    (house / "notes.txt").write_text("not a distribution")
    server = IndexServer(("127.0.0.1", 0), house, 0.0, tmp_path / "counts.json")
    serving.start(server)
    yield f"http://127.0.0.1:{server.server_address[1]}", server
    serving.stop(server)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def test_project_names_are_pep_503_normalized():
    assert project_of(WHEEL) == "foo-bar"
    assert project_of(SDIST) == "baz-qux"


def test_pages_link_every_file_with_its_hash_and_count_what_they_served(index):
    url, server = index
    root = _get(f"{url}/simple/").decode()
    assert '<a href="/simple/foo-bar/">foo-bar</a>' in root and "baz-qux" in root and "notes" not in root
    digest = hashlib.sha256(b"wheel bytes" * 100).hexdigest()
    page = _get(f"{url}/simple/Foo.Bar").decode()  # proxpi asks without the slash
    assert f'href="/files/{WHEEL}#sha256={digest}"' in page
    assert _get(f"{url}/files/{WHEEL}") == b"wheel bytes" * 100
    counts = json.loads(server.counts_path.read_text())
    assert counts == {"127.0.0.1": len(root.encode()) + len(page.encode()) + 1100}


@pytest.mark.parametrize("path", ["/simple/nothing/", "/files/notes.txt", "/files/../counts.json", "/other"])
def test_anything_else_is_not_found_and_not_counted(index, path):
    url, server = index
    with pytest.raises(urllib.error.HTTPError) as error:
        _get(url + path)
    assert error.value.code == 404
    assert json.loads(server.counts_path.read_text()) == {}
