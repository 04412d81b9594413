"""Rendering the boot script: roles, presets, head modes, quoting, shellcheck, size."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rayslice import spec
from rayslice import startup_scripts as ss
from rayslice.errors import InvalidInput
from rayslice.startup_scripts import locks, templating, variables
from rayslice.startup_scripts.options import PackageSource
from rayslice.startup_scripts.templating import TEMPLATE_DIR

SHELLCHECK = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")

VARIANTS = {
    "v6e-16 jax head=slice": {"acceleratorType": "v6e-16"},
    "v6e-4 single host": {"acceleratorType": "v6e-4"},
    "v5p-16 xla": {"acceleratorType": "v5p-16", "preset": "xla"},
    "2 x v6e-16 head=vm": {"acceleratorType": "v6e-16", "slices": 2},
    "elastic 0 to 2 x v6e-16": {
        "acceleratorType": "v6e-16",
        "platform": "compute",
        "slices": 2,
        "minSlices": 0,
    },
    "no auth, index, extras": {
        "acceleratorType": "v6e-8",
        "rayAuth": "none",
        "packageIndex": "https://pypi.example.internal/simple",
        "requirements": ['requests; python_version < "3.12"', "optax>=0.2"],
    },
}
OPTIONS = {
    "real host": ss.RenderOptions(),
    # Paths with a space: shellcheck then sees that every use of them must be quoted.
    "simulated, venv": ss.RenderOptions(
        supervisor="process", package_source="venv:/opt/prepared venv", root="/tmp/sim state/h0"
    ),
    "simulated, wheels": ss.RenderOptions(
        supervisor="process",
        package_source="wheels:/tmp/wheel house",
        root="/tmp/sim/h1",
        object_store_bytes=100_000_000,
    ),
}


def _spec(raw):
    return spec.load(raw, require_zone=False)


# Every variant, under every option, passes bash -n and shellcheck: test_templating.py renders them
# with every other template.


def rendered_values(script: str) -> dict[str, str]:
    """The rendered values (everything above ``# ---- paths``), as bash itself reads them; arrays
    joined by spaces."""
    header = script.split("# ---- paths")[0]
    lines = [line for line in header.splitlines() if re.match("[A-Z_]+=", line)]
    names = [line.split("=", 1)[0] for line in lines]
    dump = "\n".join(lines) + "\n" + "\n".join(f'printf "%s=%s\\0" {n} "${{{n}[*]}}"' for n in names)
    out = subprocess.run(["bash", "-c", dump], capture_output=True, text=True, check=True).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if item)


def test_rendered_values():
    values = rendered_values(ss.render(_spec(VARIANTS["v6e-16 jax head=slice"])))
    assert values["TPU_RESOURCES"] == '{"TPU": 4}'
    lock = variables.preset_lock(_spec(VARIANTS["v6e-16 jax head=slice"]))
    assert lock is not None
    # The preset and Ray come from the lock as it is; nothing is left to resolve on the host.
    assert base64.b64decode(values["LOCK"]).decode() == lock.text
    assert values["LOCK_DIGEST"] == lock.digest and values["LOCK_PYTHON"] == "3.11"
    assert values["REQUIREMENTS"] == ""
    assert values["RAY_AUTH_MODE_VALUE"] == "token"
    assert values["SUPERVISOR"] == "systemd" and values["PACKAGE_MODE"] == "pypi" and values["ROOT"] == ""


def test_xla_preset_is_locked_from_pypi_without_the_guides_find_links():
    spec = _spec(VARIANTS["v5p-16 xla"])
    values = rendered_values(ss.render(spec))
    lock = variables.preset_lock(spec)
    assert lock is not None and lock.requirements[:2] == ["torch==2.9.0", "torch_xla[tpu]==2.9.0"]
    assert values["FIND_LINKS"] == "" and lock.find_links == []
    assert "libtpu==0.0.21" in lock.pins()


@pytest.mark.parametrize("key, value", [("python", "3.12"), ("platform", "aarch64-manylinux_2_35")])
def test_a_lock_for_another_python_or_platform_is_refused_before_rendering(tmp_path, monkeypatch, key, value):
    spec = _spec({"acceleratorType": "v6e-16"})
    shipped = variables.preset_lock(spec)
    assert shipped is not None
    other = locks.Lock({**shipped.header, key: value}, shipped.body)
    (tmp_path / "jax.lock").write_text(other.text)
    monkeypatch.setattr(locks, "LOCK_DIR", tmp_path)
    with pytest.raises(InvalidInput, match=f"lock is for .*{value}.*regenerate it") as refused:
        ss.render(spec)
    assert refused.value.exit_code == 2


def test_another_ray_release_has_no_lock_and_resolves_on_the_host():
    spec = _spec({"acceleratorType": "v5p-16", "preset": "xla", "rayVersion": "2.59.0"})
    values = rendered_values(ss.render(spec))
    assert values["LOCK"] == "" and values["REQUIREMENTS"].startswith("torch==2.9.0 torch_xla[tpu]==2.9.0")
    assert "libtpu-releases" in values["FIND_LINKS"]


def test_single_host_8_chip_type_gets_8_tpus():
    assert rendered_values(ss.render(_spec({"acceleratorType": "v6e-8"})))["TPU_RESOURCES"] == '{"TPU": 8}'


def test_no_auth_disables_ray_auth_explicitly():
    values = rendered_values(ss.render(_spec(VARIANTS["no auth, index, extras"])))
    assert values["RAY_AUTH_MODE_VALUE"] == "disabled"
    assert values["PACKAGE_INDEX"] == "https://pypi.example.internal/simple"


def test_simulator_knobs_are_rendered():
    values = rendered_values(
        ss.render(_spec(VARIANTS["v6e-16 jax head=slice"]), OPTIONS["simulated, wheels"])
    )
    assert (
        values["SUPERVISOR"],
        values["PACKAGE_MODE"],
        values["PACKAGE_DIR"],
        values["ROOT"],
        values["OBJECT_STORE_BYTES"],
    ) == ("process", "wheels", "/tmp/wheel house", "/tmp/sim/h1", "100000000")


def test_install_fingerprint_follows_requirements():
    a = _spec({"acceleratorType": "v6e-16"})
    b = _spec({"acceleratorType": "v6e-16", "requirements": ["optax"]})
    c = _spec({"acceleratorType": "v6e-4"})
    fp = variables.install_fingerprint
    assert fp(a, PackageSource("pypi")) != fp(b, PackageSource("pypi"))
    assert fp(a, PackageSource("pypi")) == fp(c, PackageSource("pypi"))  # same packages, other shape


def test_install_fingerprint_follows_the_lock_not_the_preset_lines(monkeypatch):
    """A new lock for the same requirement lines replaces the hosts; the lines alone do not."""
    spec = _spec({"acceleratorType": "v6e-16"})
    before = variables.install_fingerprint(spec, PackageSource("pypi"))
    lock = variables.preset_lock(spec)
    assert lock is not None
    relocked = locks.Lock(lock.header, lock.body.replace("absl-py==2.5.1", "absl-py==2.5.2"))
    monkeypatch.setattr(variables, "preset_lock", lambda _: relocked)
    assert variables.install_fingerprint(spec, PackageSource("pypi")) != before
    monkeypatch.setattr(variables, "preset_lock", lambda _: lock)
    assert variables.install_fingerprint(spec, PackageSource("pypi")) == before


def test_host_attributes():
    s = _spec({"acceleratorType": "v6e-16", "slices": 2, "platform": "tpu-vm"})
    attrs = ss.host_attributes(s, 1, head_address="10.0.0.2", token_secret="rayslice-token")
    assert attrs == {
        "rayslice-head-mode": "vm",
        "rayslice-slice-index": "1",
        "rayslice-num-slices": "2",
        "rayslice-config-hash": attrs["rayslice-config-hash"],
        "rayslice-head-address": "10.0.0.2",
        "rayslice-token-secret": "rayslice-token",
    }
    assert re.fullmatch("[0-9a-f]{16}", attrs["rayslice-config-hash"])
    other = _spec({"acceleratorType": "v6e-16", "slices": 2, "platform": "tpu-vm", "requirements": ["optax"]})
    assert ss.host_attributes(other, 1)["rayslice-config-hash"] != attrs["rayslice-config-hash"]


def test_compute_hosts_get_the_slice_name_and_their_instance_names():
    s = _spec({"acceleratorType": "v6e-16", "platform": "compute"})
    attrs = ss.host_attributes(s, 0)
    assert attrs["rayslice-slice-name"] == "rayslice-slice-0"
    assert attrs["rayslice-slice-hosts"] == (
        "rayslice-slice-0-w0,rayslice-slice-0-w1,rayslice-slice-0-w2,rayslice-slice-0-w3"
    )
    tpu_vm = _spec({"acceleratorType": "v6e-16", "platform": "tpu-vm"})
    assert "rayslice-slice-hosts" not in ss.host_attributes(tpu_vm, 0)


def test_render_options_are_checked():
    with pytest.raises(InvalidInput, match="supervisor"):
        ss.RenderOptions(supervisor="cron")
    with pytest.raises(InvalidInput, match="wheels:DIR or venv:DIR"):
        ss.RenderOptions(package_source="/tmp/wheels")


# Every way the script names a metadata path: the `metadata`, `metadata_get` and `attribute`
# functions, and any URL under the metadata server's base (a curl of its own, a PUT, an argument).
_READS = (
    re.compile(r'\bmetadata(?:_get)? "([^"]+)"'),
    re.compile(r'\battribute [A-Za-z_]+ ("\$[A-Za-z_]+"|[a-z][a-z-]*)'),
    re.compile(r'(?:\$\{?METADATA_URL\}?|computeMetadata/v1)/([^"\s]*)'),
)
# The parameters the three functions pass on (`metadata` to `metadata_get`, `metadata_get` to
# curl, `attribute` to `metadata`): their callers' paths are the ones read.
FORWARDED = {"$path", "$1", "instance/attributes/$name"}
# What the script may read that names a token: the VM's own access token (for Secret Manager)
# and the attribute that holds the Ray token's secret *name*.
TOKEN_READS = {"instance/service-accounts/default/token", f"instance/attributes/{ss.ATTR_TOKEN_SECRET}"}


def _metadata_reads(script: str) -> set[str]:
    """Every metadata path the script names, outside comments, with each ``$NAME`` resolved
    from the rendered values; a path that cannot be resolved keeps its ``$``."""
    values = rendered_values(script)
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))

    def resolve(path: str) -> str:
        return re.sub(r"\$\{?([A-Z][A-Z0-9_]*)\}?", lambda m: values.get(m[1], m[0]), path.strip('"'))

    paths = set()
    for kind, pattern in enumerate(_READS):
        for found in pattern.findall(code):
            path = resolve(found)
            paths.add(f"instance/attributes/{path}" if kind == 1 else path)
    return paths


def _token_read_problems(script: str) -> list[str]:
    """What is wrong with the script's metadata reads: a path that cannot be told (so it might
    name a token), or a token read beyond `TOKEN_READS`."""
    reads = _metadata_reads(script)
    unknown = sorted(p for p in reads if "$" in p and p not in FORWARDED)
    tokens = sorted(p for p in reads if "token" in p.lower() and p not in TOKEN_READS)
    return [f"unresolved metadata path {p}" for p in unknown] + [f"token read {p}" for p in tokens]


@pytest.mark.parametrize("variant", VARIANTS)
def test_script_never_reads_a_token_from_metadata(variant):
    """The only tokens the script takes from metadata are the VM's own access token, which goes
    to Secret Manager and nowhere else, and the Ray token's secret *name*; the Ray token itself
    comes from Secret Manager's payload only."""
    script = ss.render(_spec(VARIANTS[variant]))
    reads = _metadata_reads(script)
    assert "instance/attributes/rayslice-head-mode" in reads  # the parser sees the attribute reads
    assert "instance/network-interfaces/0/ip" in reads  # ... and the `metadata` ones
    assert _token_read_problems(script) == []
    assert {p for p in reads if "token" in p} == TOKEN_READS
    # the attribute holds a secret's name (what infra writes there), read into TOKEN_SECRET ...
    attrs = ss.host_attributes(_spec(VARIANTS[variant]), 0, token_secret="rayslice-token")
    assert attrs.get(ss.ATTR_TOKEN_SECRET) in (None, "rayslice-token")
    assert re.findall(r'attribute (\w+) "\$ATTR_TOKEN_SECRET"', script) == ["TOKEN_SECRET"]
    # ... which is only ever a Secret Manager secret name, logged or checked for emptiness
    for line in (line.strip() for line in script.splitlines() if "$TOKEN_SECRET" in line):
        assert re.match(
            r'(payload=\$\(secret_payload "\$TOKEN_SECRET"\)|\[\[ -n \$TOKEN_SECRET \]\]|log )', line
        ), line
    # the access token goes into curl's config on stdin, for Secret Manager only
    assert [line.strip() for line in script.splitlines() if "$access" in line] == [
        'response=$(printf \'header = "Authorization: Bearer %s"\\n\' "$access" \\'
    ]
    # the Ray token file is written from that payload, never from a variable set elsewhere
    writes = [line.strip() for line in script.splitlines() if re.search(r'>\s*"?\$(tmp|TOKEN_FILE)', line)]
    assert writes == ['if ! { printf \'%s\' "$payload" >"$tmp" && mv -f "$tmp" "$TOKEN_FILE"; }; then']
    assert "RAY_AUTH_TOKEN=" not in script and "RAY_AUTH_TOKEN_PATH" in script


# Reads of a token that a template could gain, each put into a copy of startup.sh.j2 below.
TOKEN_READ_MUTATIONS = {
    "metadata_get": 'metadata_get "instance/attributes/rayslice-ray-token" 5',
    "metadata_get, named by a variable": 'metadata_get "instance/attributes/$RAY_TOKEN_ATTRIBUTE" 5',
    "metadata": 'ray_token=$(metadata "instance/attributes/ray-token")',
    "attribute": "attribute RAY_TOKEN ray-token optional",
    "curl of its own": 'curl -sS -H "Metadata-Flavor: Google" "$METADATA_URL/instance/attributes/ray-token"',
    "the server by name": (
        'curl -sS -H "Metadata-Flavor: Google" '
        "http://metadata.google.internal/computeMetadata/v1/project/attributes/token"
    ),
}


@pytest.mark.parametrize("mutation", TOKEN_READ_MUTATIONS)
def test_the_token_read_check_catches_every_way_of_reading_metadata(tmp_path, monkeypatch, mutation):
    """A copy of the templates with one more read, beside the one that reads the secret's name:
    the check of `test_script_never_reads_a_token_from_metadata` must fail on its render."""
    copy = tmp_path / "templates"
    shutil.copytree(TEMPLATE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    template = copy / "startup.sh.j2"
    anchor = '  attribute TOKEN_SECRET "$ATTR_TOKEN_SECRET" optional\n'
    source = template.read_text()
    assert source.count(anchor) == 1
    template.write_text(source.replace(anchor, anchor + f"  {TOKEN_READ_MUTATIONS[mutation]}\n"))
    monkeypatch.setattr(templating, "TEMPLATE_DIR", copy)
    templating.environment.cache_clear()
    try:
        mutated = ss.render(_spec(VARIANTS["v6e-16 jax head=slice"]))
    finally:
        templating.environment.cache_clear()
    assert TOKEN_READ_MUTATIONS[mutation] in mutated
    assert _token_read_problems(mutated) != []


def test_only_the_head_vm_carries_the_head_vm_role():
    s = _spec({"acceleratorType": "v6e-16", "slices": 2})
    assert ss.host_attributes(s, ss.HEAD_VM_SLICE_INDEX)[ss.ATTR_ROLE] == ss.HEAD_VM_ROLE
    assert ss.ATTR_ROLE not in ss.host_attributes(s, 0, head_address="10.0.0.2")
    assert rendered_values(ss.render(s))["HEAD_VM_ROLE"] == ss.HEAD_VM_ROLE


def test_the_identity_boot_hands_to_the_ray_service_is_every_global_read_identity_sets():
    """`save_identity` writes the variables named in IDENTITY_VARS: a global that read_identity
    sets and the list lacks would reach the Ray service's first run unset."""
    source = (TEMPLATE_DIR / "startup.sh.j2").read_text()
    body = re.search(r"^read_identity\(\) \{\n(.*?)^\}", source, re.M | re.S)
    listed = re.search(r"^IDENTITY_VARS=\((.*?)\)", source, re.M | re.S)
    assert body and listed
    code = re.sub(r"^\s*#.*$", "", body.group(1), flags=re.M)  # nor in a comment
    code = re.sub(r'"[^"\n]*"', '""', code)  # no `name=` inside a message
    [local_line] = re.findall(r"^\s*local (.*)$", code, re.M)
    local = {word.partition("=")[0] for word in local_line.split()}
    assigned = set(re.findall(r"(?<![\w$])([A-Za-z_]\w*)=(?!=)", code))
    assigned |= set(re.findall(r"\battribute (\w+)", code))
    assigned |= set(re.findall(r"\bread -r -a (\w+)", code))
    assigned |= set(re.findall(r"\bfor (\w+) in\b", code))
    assert "WORKER_LIST" in assigned and "ROLE" in assigned  # the patterns find what they should
    assert assigned - local - {"IFS"} == set(listed.group(1).split())


def test_the_heads_package_cache_installs_its_own_hashed_lock_alone():
    """The head's package cache (proxpi, gunicorn and theirs) holds the index's credentials and
    serves every host: it installs its shipped lock, every file checked against its hashes,
    nothing resolved or built, and no requirement name reaches uv."""
    shipped = variables.CACHE_LOCK.read()
    assert dict(shipped.header) == variables.CACHE_LOCK.header(), (
        "regenerate: scripts/lock_presets.py package-cache"
    )
    assert locks.foreign_line(shipped.text) is None
    assert set(variables.CACHE_REQUIREMENTS) <= set(shipped.pins())
    assert all("--hash=sha256:" in block for block in shipped.body.split("==")[1:])
    script = ss.render(_spec(VARIANTS["2 x v6e-16 head=vm"]))
    values = rendered_values(script)
    assert base64.b64decode(values["CACHE_LOCK"]).decode() == shipped.text
    assert values["CACHE_LOCK_DIGEST"] == shipped.digest
    install = script[
        script.index("\ninstall_cache() {") : script.index("\n}\n", script.index("\ninstall_cache() {"))
    ]
    [call] = re.findall(r'uv_install --quiet --python "\$CACHE_VENV/bin/python" ([^>]*)>>', install)
    assert call.split() == [
        *['"${SOURCE_ARGS[@]}"', "--require-hashes", "--no-deps", "--no-build", "\\"],
        *["-r", '"$lock"'],
    ]
    # Without the cache (a wheelhouse), nothing of it is carried.
    wheels = ss.RenderOptions(supervisor="process", package_source="wheels:/w", root="/r")
    assert rendered_values(ss.render(_spec(VARIANTS["2 x v6e-16 head=vm"]), wheels))["CACHE_LOCK"] == ""
