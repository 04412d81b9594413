"""Stack locks: the spec's `requirements` resolved on the deployer's machine with real uv against a
local index of tiny wheels (no network), stored, reused, resolved again, or refused (exit 2)."""

from __future__ import annotations

import base64
import functools
import socket
import sys

import pytest

from rayslice import cli, spec
from rayslice.errors import EXIT_INVALID, InvalidInput
from rayslice.infra import image
from rayslice.infra.preview import preview, stack_config
from rayslice.infra.program import main as program_main
from rayslice.startup_scripts import locks, pod, render
from rayslice.startup_scripts.options import PackageSource
from rayslice.startup_scripts.stack_locks import LOCK_DIR_NAME, StackLocks
from rayslice.startup_scripts.variables import install_fingerprint, preset_lock


def _spec(index: str, *requirements: str) -> spec.ClusterSpec:
    raw = {"acceleratorType": "v6e-4", "requirements": list(requirements)}
    raw |= {"packageIndex": index, "allowInsecurePackageIndex": True}
    return spec.load(raw, require_zone=False)


def test_requirements_resolve_into_a_stored_lock_beside_the_preset_lock(index, tmp_path, capsys, monkeypatch):
    """With an empty PATH: uv comes from the uv package (`.venv/bin/rayslice` runs without the
    venv on PATH)."""
    monkeypatch.setenv("PATH", "")
    cluster = _spec(index, "gamma")
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    lock = store.lock(cluster)
    base = preset_lock(cluster)
    assert lock is not None and base is not None
    assert {"alpha==2.0", "beta==1.0", "gamma==1.0"} <= set(lock.pins())
    assert set(base.pins()) < set(lock.pins())  # the preset's pins, unmoved
    assert (lock.header["base"], lock.header["requirements"]) == (base.digest, "gamma")
    assert locks.parse(store.path.read_text()) == lock
    assert "resolving requirements into" in capsys.readouterr().err
    # Hosts install the stack lock alone: nothing left to resolve, the fingerprint is its digest's.
    script = render(cluster, lock=lock)
    assert base64.b64encode(lock.text.encode()).decode() in script
    assert "REQUIREMENTS=()" in script
    pod_script = pod.render_pod_start(cluster, None, lock)  # GKE's pod start script carries it too
    assert base64.b64encode(lock.text.encode()).decode() in pod_script and "REQUIREMENTS=()" in pod_script
    source = PackageSource.parse(None)
    assert install_fingerprint(cluster, source, lock) != install_fingerprint(cluster, source)


def test_a_lock_whose_header_matches_is_reused_without_resolving(index, tmp_path, capsys):
    cluster = _spec(index, "gamma")
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    store.lock(cluster)
    capsys.readouterr()
    store.path.write_text(store.path.read_text() + "# committed by the user\n")
    lock = store.lock(cluster)
    assert lock is not None and lock.body.endswith("# committed by the user\n")
    assert capsys.readouterr().err == ""


def test_a_changed_requirement_resolves_the_lock_again(index, tmp_path, capsys):
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    store.lock(_spec(index, "gamma"))
    capsys.readouterr()
    lock = store.lock(_spec(index, "gamma", "alpha<2"))
    assert lock is not None and "alpha==1.0" in lock.pins()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its header differs" in err
    assert locks.parse(store.path.read_text()) == lock


def test_no_requirements_no_stack_lock(tmp_path):
    cluster = spec.load({"acceleratorType": "v6e-4"}, require_zone=False)
    assert StackLocks(tmp_path, "dev").lock(cluster) is None
    assert not tmp_path.joinpath("dev.lock").exists()


def test_requirements_that_do_not_resolve_are_refused(index, tmp_path):
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    with pytest.raises(InvalidInput, match=r"cannot be locked.*alpha.*fix the requirements") as refused:
        store.lock(_spec(index, "alpha>5"))
    assert refused.value.exit_code == EXIT_INVALID and not store.path.exists()


def test_an_index_that_does_not_answer_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")  # uv's own setting: refused at once, not after retries
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    with pytest.raises(InvalidInput, match=r"make the index http://127.0.0.1:\d+/simple reachable"):
        store.lock(_spec(f"http://127.0.0.1:{port}/simple", "alpha"))
    assert not store.path.exists()


def test_a_lock_too_large_for_metadata_is_refused(index, tmp_path):
    """A stored lock whose header matches, with thousands of pinned packages: the boot script
    that would carry it exceeds a metadata value, so it is refused before anything is created."""
    cluster = _spec(index, "gamma")
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    lock = store.lock(cluster)
    assert lock is not None
    many = "".join(f"package-number-{i}==1.0 \\\n    --hash=sha256:{'a' * 64}\n" for i in range(3000))
    store.path.write_text(lock.text + many)
    with pytest.raises(InvalidInput, match=r"does not fit .*GCE metadata allows 262144.*fewer requirements"):
        store.lock(cluster)


def test_without_uv_the_lock_is_refused(index, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "uv", None)  # the uv package is not installed
    monkeypatch.setenv("PATH", "")
    with pytest.raises(InvalidInput, match="uv is not installed: pip install uv"):
        StackLocks(tmp_path / LOCK_DIR_NAME, "dev").lock(_spec(index, "gamma"))


def test_for_stack_file_finds_the_project_beside_pulumi_yaml(tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("name: x\n")
    (tmp_path / "infra").mkdir()
    store = StackLocks.for_stack_file(str(tmp_path / "infra" / "Pulumi.dev.yaml"))
    assert store.path == tmp_path.resolve() / LOCK_DIR_NAME / "dev.lock"


def _strings(value: object) -> list[str]:
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return [value] if isinstance(value, str) else []


def test_the_program_puts_the_stack_lock_into_the_hosts_metadata(index, tmp_path):
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    config = stack_config(None, ['requirements=["gamma"]', f"packageIndex={index}"])
    config |= stack_config(None, ["allowInsecurePackageIndex=true", "zone=us-east5-b", "project=my-project"])
    found = preview(config, lambda: program_main(store.lock))
    lock = locks.parse(store.path.read_text())
    encoded = base64.b64encode(lock.text.encode()).decode()
    scripts = [text for r in found.registrations for text in _strings(r.inputs) if "LOCK_DIGEST=" in text]
    assert scripts and all(encoded in script for script in scripts)


def test_preview_refuses_requirements_that_do_not_resolve_before_anything_is_shown(index, tmp_path, capsys):
    stack = tmp_path / "Pulumi.dev.yaml"
    stack.write_text(
        "config:\n  rayslice:acceleratorType: v6e-4\n  rayslice:zone: us-east5-b\n"
        "  rayslice:project: my-project\n"
        f"  rayslice:packageIndex: {index}\n  rayslice:allowInsecurePackageIndex: true\n"
        "  rayslice:requirements:\n    - alpha>5\n"
    )
    assert cli.main(["preview", "--stack-file", str(stack)]) == EXIT_INVALID
    out, err = capsys.readouterr()
    assert "cannot be locked" in err and "gcp." not in out
    assert not (tmp_path / LOCK_DIR_NAME / "dev.lock").exists()


def test_the_image_program_bakes_the_stack_lock_and_is_named_after_it(index, tmp_path):
    """The image holds what the hosts install: the builder's script carries the stack lock, and the
    image's name follows its digest (the hosts' install fingerprint), not the preset lock alone."""
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    settings = ['requirements=["gamma"]', f"packageIndex={index}", "allowInsecurePackageIndex=true"]
    settings += ["acceleratorType=v6e-16", "zone=us-east5-b", "project=img-project"]
    config = {**stack_config(None, settings), f"{image.PHASE_NAMESPACE}:{image.PHASE_KEY}": "image"}
    found = preview(config, functools.partial(image.main, store.lock))
    cluster = spec.load_cli(None, settings)
    lock = store.lock(cluster)
    assert lock is not None
    (disk_image,) = [r for r in found.registrations if r.type == "gcp:compute/image:Image"]
    assert disk_image.inputs["name"] == image.image_name(cluster, lock) != image.image_name(cluster)
    encoded = base64.b64encode(lock.text.encode()).decode()
    assert any(encoded in text for r in found.registrations for text in _strings(r.inputs))
