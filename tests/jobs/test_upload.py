"""What a job carries: the rayslice modules of `upload.SHIPPED` (exactly the workloads' import
closure) and a script's folder without what must stay behind.

What a working dir uploads is checked with Ray's own packer (`_zip_files`, the function that builds
the package the Jobs API receives), so the test sees exactly what a job would see.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import rayslice
from rayslice.errors import InvalidInput
from rayslice.jobs import upload
from tests.imports import PACKAGE, closure, module_name

ALL = [
    "jax_multihost",
    "jax_multislice",
    "jax_single_host",
    "jax_train",
    "xla_multi_device",
    "xla_multihost",
    "xla_single",
    "xla_train",
]


def test_every_workload_module_is_listed_with_its_summary():
    listed = upload.workloads()
    assert sorted(listed) == ALL
    assert all(workload.summary for workload in listed.values())


# ---- the rayslice modules a job ships -----------------------------------------------------------


def test_a_job_ships_exactly_the_import_closure_of_the_workloads():
    """Every module a shipped job imports from rayslice is in `SHIPPED`, and nothing else is."""
    entries = [module_name(p) for p in sorted((PACKAGE / "workloads").glob("*.py"))]
    assert {f"rayslice.workloads.{name}" for name in ALL} <= set(entries)
    assert closure(entries) == set(upload.SHIPPED)
    assert len(set(upload.SHIPPED)) == len(upload.SHIPPED)


def test_the_staged_package_holds_core_and_workloads_only(tmp_path):
    env = upload.runtime_env(upload.Job("python -m rayslice.workloads.jax_train", None), tmp_path)
    [staged] = env["py_modules"]
    package = Path(staged)
    assert package == tmp_path / "rayslice" and "working_dir" not in env
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        upload.SHIPPED
    )
    assert (package / "catalog.py").is_file() and (package / "errors.py").is_file()
    assert sorted(p.stem for p in (package / "workloads").glob("[!_]*.py")) == ALL
    for left_behind in ("local", "infra", "startup_scripts", "recovery", "jobs", "cli.py", "spec"):
        assert not (package / left_behind).exists()
    assert not list(package.rglob("__pycache__"))
    for module in upload.SHIPPED:  # byte for byte what the imported rayslice holds
        assert (tmp_path / module).read_bytes() == (PACKAGE.parent / module).read_bytes()


def test_staging_from_an_installed_package_ships_that_package(tmp_path):
    """The wheel's layout (site-packages/rayslice/workloads/...) once raised FileExistsError; the
    modules come from the rayslice that is imported, wherever it lies."""
    site = tmp_path / "site-packages"
    shutil.copytree(PACKAGE, site / "rayslice", ignore=shutil.ignore_patterns("__pycache__"))
    with (site / "rayslice" / "workloads" / "jax_train.py").open("a") as module:
        module.write("# installed copy\n")
    (site / "rayslice" / "workloads" / "marker_from_install.txt").write_text("installed copy")
    stage = (
        "import sys; from pathlib import Path; import rayslice; from rayslice.jobs import upload; "
        "print(rayslice.__file__); print(upload.runtime_env(upload.Job('x', None), Path(sys.argv[1]))"
        "['py_modules'][0])"
    )
    result = subprocess.run(
        [sys.executable, "-c", stage, str(tmp_path / "staging")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert result.returncode == 0, result.stderr
    imported, staged = result.stdout.splitlines()
    assert Path(imported) == site / "rayslice" / "__init__.py" != Path(rayslice.__file__)
    package = Path(staged)
    assert (package / "workloads" / "jax_train.py").read_text().endswith("# installed copy\n")
    assert not (package / "workloads" / "marker_from_install.txt").exists()  # not on the allow-list


# ---- what a script's working dir uploads ------------------------------------------------------


def uploaded(job: upload.Job, tmp_path: Path) -> set[str]:
    """The files Ray's own packer puts in the working_dir package for this job."""
    from ray._private.runtime_env.packaging import _zip_files

    env = upload.runtime_env(job, tmp_path / "staging")
    out = tmp_path / "package.zip"
    _zip_files(env["working_dir"], env["excludes"], str(out), include_gitignore=True)
    return {n for n in zipfile.ZipFile(out).namelist() if not n.endswith("/")}


@pytest.fixture
def project(tmp_path) -> Path:
    """A script's folder as it often looks: a venv, the simulator's state, a token, keys, data."""
    root = tmp_path / "project"
    files = {
        "train.py": "print('hi')\n",
        "data/input.csv": "1,2\n",
        "lib/util.py": "X = 1\n",
        ".venv/bin/python": "",
        ".venv/lib/site.py": "",
        ".state/local/state.json": "{}",
        ".state/local/ray-token": "secret",
        "ray-token": "secret",
        "sub/ray-token": "secret",
        "server.pem": "-----BEGIN",
        "deploy.key": "k",
        ".env": "API_KEY=1",
        ".git/config": "[core]",
        "lib/__pycache__/util.cpython-311.pyc": "",
        "big/weights.bin": "0",
        ".rayignore": "big/\n",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_scripts_folder_uploads_without_venv_state_tokens_keys_and_ignored_files(project, tmp_path):
    job = upload.resolve(str(project / "train.py"))
    assert job.entrypoint == "python train.py" and job.working_dir == project
    assert uploaded(job, tmp_path) == {"train.py", "data/input.csv", "lib/util.py", ".rayignore"}


def test_working_dir_overrides_the_folder_and_the_script_runs_from_inside_it(project, tmp_path):
    job = upload.resolve(str(project / "lib" / "util.py"), working_dir=str(project))
    assert job.entrypoint == "python lib/util.py" and job.working_dir == project
    only_lib = upload.resolve(str(project / "lib" / "util.py"))
    assert uploaded(only_lib, tmp_path) == {"util.py"}


def test_a_script_outside_the_working_dir_is_refused(project):
    with pytest.raises(InvalidInput, match="is not inside --working-dir"):
        upload.resolve(str(project / "train.py"), working_dir=str(project / "data"))


def test_the_home_folder_itself_is_never_uploaded(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "notebook.py").write_text("")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(InvalidInput, match=r"refusing to upload .*home"):
        upload.resolve(str(home / "notebook.py"))
    (home / "job").mkdir()
    (home / "job" / "run.py").write_text("")
    with pytest.raises(InvalidInput, match="refusing to upload"):
        upload.resolve(str(home / "job" / "run.py"), working_dir=str(home))
    assert upload.resolve(str(home / "job" / "run.py")).working_dir == home / "job"


def test_single_host_jobs_are_read_from_their_modules_and_name_a_multi_host_job():
    import importlib

    listed = upload.workloads()
    single_host = {name: w.multihost_counterpart for name, w in listed.items() if w.multihost_counterpart}
    assert single_host == {
        name: importlib.import_module(f"rayslice.workloads.{name}").MULTIHOST_COUNTERPART
        for name in single_host
    }
    assert set(single_host) == {"jax_single_host", "xla_multi_device"}
    for counterpart in single_host.values():
        assert counterpart in listed and listed[counterpart].multihost_counterpart is None
    assert upload.resolve("jax_single_host") == upload.Job(
        "python -m rayslice.workloads.jax_single_host", None, "jax_single_host", "jax_multihost"
    )
