"""What a job carries: the rayslice modules of `upload.SHIPPED` (exactly the workloads' import
closure) and a script's folder without what must stay behind.

What a working dir uploads is checked with Ray's own packer (`_zip_files`, the function that builds
the package the Jobs API receives), so the test sees exactly what a job would see.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import rayslice
from rayslice.errors import InvalidInput
from rayslice.jobs import upload, working_dir
from tests.imports import PACKAGE, closure, module_name

ALL = [
    "jax_lm",
    "jax_multihost",
    "jax_multislice",
    "jax_single_host",
    "jax_train",
    "jax_trainer",
    "slice_check",
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
    _zip_files(env["working_dir"], [], str(out), include_gitignore=True)
    return {n for n in zipfile.ZipFile(out).namelist() if not n.endswith("/")}


SERVICE_ACCOUNT_KEY = json.dumps(
    {"type": "service_account", "project_id": "p", "private_key_id": "1", "private_key": "-----BEGIN"}
)
USER_CREDENTIALS = json.dumps({"type": "authorized_user", "client_id": "c", "refresh_token": "1//r"})
# A script's folder as it often looks: a venv, the simulator's state, tokens, keys, credential
# stores, data; each secret's path names the rule that keeps it out.
PROJECT = {
    "train.py": "print('hi')\n",
    "data/input.csv": "1,2\n",
    "data/settings.json": json.dumps({"type": "service_account", "note": "no key in it"}),
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
    ".envrc": "export API_KEY=1",
    ".aws/credentials": "[default]\naws_secret_access_key=1",
    ".kube/config": "users: [{user: {token: t}}]",
    ".docker/config.json": '{"auths": {"r": {"auth": "dTpw"}}}',
    ".pypirc": "[pypi]\npassword=pw",
    ".git-credentials": "https://u:pw@github.com",
    "infra/terraform.tfstate": '{"resources": []}',
    "infra/terraform.tfstate.backup": '{"resources": []}',
    ".git/config": "[core]",
    "lib/__pycache__/util.cpython-311.pyc": "",
    "big/weights.bin": "0",
    ".rayignore": "big/\n",
    # credentials by content, under innocent names
    "keys/prod.json": SERVICE_ACCOUNT_KEY,
    "config/adc.json": USER_CREDENTIALS,
    # a simulator state dir under another name than .state
    "sim/state.json": "{}",
    "sim/cloud-api-credentials.json": "{}",
    "sim/hosts/h0/metadata.json": "{}",
}
SHIPPED_FROM_PROJECT = {
    "train.py",
    "data/input.csv",
    "data/settings.json",
    "lib/util.py",
    ".rayignore",
    "same.py",  # a link to a shipped file inside the folder: its content under the link's name
    "lib2/util.py",  # a link to a folder inside
}


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "project"
    for name, text in PROJECT.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "same.py").symlink_to("train.py")
    (root / "lib2").symlink_to("lib")
    (root / "env-link").symlink_to(".env")  # a link to a denied file is denied with it
    (root / "key-link.json").symlink_to("keys/prod.json")
    return root


def test_a_scripts_folder_uploads_without_venv_state_secrets_and_ignored_files(project, tmp_path):
    job = upload.resolve(str(project / "train.py"))
    assert job.entrypoint == "python train.py" and job.working_dir == project
    assert uploaded(job, tmp_path) == SHIPPED_FROM_PROJECT
    assert job.files is not None
    assert {entry.path for entry in job.files.files} == SHIPPED_FROM_PROJECT  # what it says it ships
    assert set(job.files.kept_back) == {"config/adc.json", "key-link.json", "keys/prod.json", "sim/"}
    assert (tmp_path / "staging" / "working_dir" / "same.py").read_text() == PROJECT["train.py"]
    assert not any(p.is_symlink() for p in (tmp_path / "staging").rglob("*"))


# Secret names beyond `PROJECT`, so that every denied pattern is alone in keeping some file out.
MORE_SECRETS = [
    ".config/gcloud/configurations/config_default",
    "gcloud/credentials.db",
    "gcloud/access_tokens.db",
    "gcloud/application_default_credentials.json",
    ".ssh/known_hosts",
    "id_rsa",
    "id_ecdsa",
    "id_ed25519.pub",
    ".gnupg/pubring.kbx",
    ".netrc",
    "venv/bin/python",
    ".ray/session",
    "hf_token",
    "gh-token",
    "x/terraform.tfstate.1700000000.backup",
    ".env.production",
    "token",
    ".boto",
    ".npmrc",
    "kaggle/kaggle.json",
    "certs/client.p12",
    "certs/client.pfx",
]


def test_every_denied_pattern_is_alone_in_keeping_some_fixture_file_out():
    """So dropping any one pattern from `DENIED` lets a file through and fails a test."""
    from ray._private.thirdparty.pathspec import PathSpec

    specs = {p: PathSpec.from_lines("gitwildmatch", [p]) for p in working_dir.DENIED}
    for pattern, spec in specs.items():
        others = [other for p, other in specs.items() if p != pattern]
        alone = [
            n
            for n in [*PROJECT, *MORE_SECRETS]
            if spec.match_file(n) and not any(o.match_file(n) for o in others)
        ]
        assert alone, f"no fixture file is kept out by {pattern!r} alone"


@pytest.mark.parametrize("name", MORE_SECRETS)
def test_more_secret_names_stay_behind(project, tmp_path, name):
    (project / name).parent.mkdir(parents=True, exist_ok=True)
    (project / name).write_text("secret")
    assert uploaded(upload.resolve(str(project / "train.py")), tmp_path) == SHIPPED_FROM_PROJECT


def test_the_simulator_state_names_are_the_simulators():
    from rayslice.local.simulation import state

    assert working_dir.SIMULATOR_STATE_FILE == state.STATE_FILE
    assert state.CLOUD_API_CREDENTIALS_FILE in working_dir.SIMULATOR_SECRET_FILES


@pytest.mark.parametrize(
    "link, target, message",
    [
        ("creds", "{outside}", "points outside the folder"),
        ("data/adc.json", "{outside}/adc.json", "points outside the folder"),
        ("up", "..", "points outside the folder"),
        ("loop", "loop", "symlink loop"),
        ("a", "b", "symlink loop"),  # b -> a below
        ("lib/back", "..", "leads back to"),
        ("gone", "missing.txt", "does not exist"),
    ],
)
def test_links_that_leave_the_folder_loop_or_dangle_are_refused(project, tmp_path, link, target, message):
    outside = tmp_path / "gcloud"
    outside.mkdir()
    (outside / "adc.json").write_text("{}")
    (project / link).symlink_to(target.format(outside=outside))
    if link == "a":
        (project / "b").symlink_to("a")
    with pytest.raises(InvalidInput, match=message):
        upload.resolve(str(project / "train.py"))


def test_a_hard_link_with_a_name_outside_the_folder_is_refused(project, tmp_path):
    """Its other name may be any file on the disk: a hard link does not say which."""
    outside = tmp_path / "gcloud" / "adc.json"
    outside.parent.mkdir()
    outside.write_text("{}")
    os.link(outside, project / "data" / "config.json")
    with pytest.raises(InvalidInput, match=r"data/config\.json in .* is a hard link: the file has 2 names"):
        upload.resolve(str(project / "train.py"))


def test_a_hard_link_whose_other_name_stays_behind_is_refused(project):
    os.link(project / ".env", project / "settings.txt")  # .env is never uploaded
    with pytest.raises(InvalidInput, match=r"settings\.txt in .* is a hard link"):
        upload.resolve(str(project / "train.py"))


def test_a_hard_link_whose_names_are_all_uploaded_goes(project, tmp_path):
    os.link(project / "lib" / "util.py", project / "util_copy.py")
    job = upload.resolve(str(project / "train.py"))
    assert uploaded(job, tmp_path) == SHIPPED_FROM_PROJECT | {"util_copy.py"}


# Each swap makes the new file beside the old one and renames it over it (as an attacker would,
# atomically), so the new one cannot reuse the old one's inode number.
def _swap_for_a_link(path: Path, outside: Path) -> None:
    path.with_name("new").symlink_to(outside)
    path.with_name("new").replace(path)


def _swap_for_another_file(path: Path, outside: Path) -> None:
    path.with_name("new").write_text(outside.read_text())
    path.with_name("new").replace(path)


def _swap_for_a_pipe(path: Path, outside: Path) -> None:
    os.mkfifo(path.with_name("new"))
    path.with_name("new").replace(path)


@pytest.mark.parametrize("swap", [_swap_for_a_link, _swap_for_another_file, _swap_for_a_pipe])
def test_a_file_swapped_after_the_walk_is_not_uploaded(project, tmp_path, swap):
    """Between the walk and the copy, a file becomes a link to a credential, another file, or a
    pipe (whose open would block): the copy opens without following links, compares the inode
    with the walked one, and stops; nothing else is read."""
    outside = tmp_path / "adc.json"
    outside.write_text(USER_CREDENTIALS)
    job = upload.resolve(str(project / "train.py"))
    swap(project / "data" / "input.csv", outside)
    with pytest.raises(InvalidInput, match=r"data/input\.csv changed while the upload was prepared"):
        upload.runtime_env(job, tmp_path / "staging")
    assert not (tmp_path / "staging" / "working_dir" / "data" / "input.csv").exists()


def test_the_copy_keeps_each_files_mode(project, tmp_path):
    (project / "train.py").chmod(0o750)
    job = upload.resolve(str(project / "train.py"))
    upload.runtime_env(job, tmp_path / "staging")
    assert (tmp_path / "staging" / "working_dir" / "train.py").stat().st_mode & 0o777 == 0o750


def test_unreadable_files_and_folders_are_named(project, monkeypatch):
    """Permission errors are made by patching, not by file modes: root (CI, the simulator tests)
    reads files whatever their mode."""
    real_open = Path.open

    def refuse(self, *args, **kwargs):
        if self.name == "input.csv":
            raise PermissionError(13, "Permission denied")
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(
        InvalidInput, match=r"cannot read data/input\.csv in the working dir: Permission denied"
    ):
        upload.resolve(str(project / "train.py"))
    monkeypatch.setattr(Path, "open", real_open)
    real_scandir = os.scandir

    def locked(path):
        if Path(path).name == "lib":
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", locked)
    with pytest.raises(InvalidInput, match=r"cannot read folder .*lib for the upload: Permission denied"):
        upload.resolve(str(project / "train.py"))


def test_working_dir_overrides_the_folder_and_the_script_runs_from_inside_it(project, tmp_path):
    job = upload.resolve(str(project / "lib" / "util.py"), working_dir=str(project))
    assert job.entrypoint == "python lib/util.py" and job.working_dir == project
    only_lib = upload.resolve(str(project / "lib" / "util.py"))
    assert uploaded(only_lib, tmp_path) == {"util.py"}


def test_a_script_outside_the_working_dir_is_refused(project):
    with pytest.raises(InvalidInput, match="is not inside --working-dir"):
        upload.resolve(str(project / "train.py"), working_dir=str(project / "data"))


def test_the_home_folder_and_its_ancestors_are_never_uploaded(tmp_path, monkeypatch):
    home = tmp_path / "home" / "me"
    home.mkdir(parents=True)
    (home / "notebook.py").write_text("")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(InvalidInput, match=r"refusing to upload .*me"):
        upload.resolve(str(home / "notebook.py"))
    (home / "job").mkdir()
    (home / "job" / "run.py").write_text("")
    for ancestor in (home, home.parent, tmp_path, Path("/")):
        with pytest.raises(InvalidInput, match=r"refusing to upload .* it holds your home folder"):
            upload.resolve(str(home / "job" / "run.py"), working_dir=str(ancestor))
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
        "python -m rayslice.workloads.jax_single_host",
        None,
        workload="jax_single_host",
        multihost_counterpart="jax_multihost",
    )


def test_a_spurious_ast_recursion_mismatch_is_parsed_again_and_any_other_error_is_not(monkeypatch):
    """CPython 3.11's AST builder can fail a parse that overlaps one in another thread
    (python/cpython#106905); reading the workloads tries again, and only for that error."""
    real, calls = upload.ast.parse, []

    def flaky(source, *args, **kwargs):
        calls.append(source)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=144, after=195)")
        return real(source, *args, **kwargs)

    monkeypatch.setattr(upload.ast, "parse", flaky)
    assert upload._parse("X = 1").body[0].targets[0].id == "X" and len(calls) == 2

    def broken(source, *args, **kwargs):
        raise SystemError("something else")

    monkeypatch.setattr(upload.ast, "parse", broken)
    with pytest.raises(SystemError, match="something else"):
        upload._parse("X = 1")
