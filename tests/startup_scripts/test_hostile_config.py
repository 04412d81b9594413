"""Hostile configuration values: each is refused by the spec (exit 2) or carried inert.

A value the spec accepts (a PEP 508 marker with quotes, `<` and `;`) runs through the whole boot
script in the sandbox and must reach uv as one literal argument. The outcomes go to
docs/faults.md (section "hostile").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rayslice import names
from rayslice import spec as spec_module
from rayslice.errors import InvalidInput
from tests.startup_scripts import sandbox
from tests.startup_scripts.faults import PAGE, FaultTable, section
from tests.startup_scripts.test_boot_sandbox import _box, _cloud

MARKER = "/tmp/rayslice-hostile-marker"
VALUES: dict[str, tuple[str, object]] = {
    "command substitution in a requirement": ("requirements", [f"optax$(touch {MARKER})"]),
    "newline in a requirement": ("requirements", [f"optax\ntouch {MARKER}"]),
    "shell in a requirement URL": ("requirements", [f"pkg @ https://e.example/$(touch {MARKER})/p.whl"]),
    "PEP 508 marker with quotes, `<`, `;`": (
        "requirements",
        ["optax>=0.2; python_version < \"3.12\" and sys_platform == 'linux'"],
    ),
    "backticks in packageIndex": ("packageIndex", "https://idx.example/simple/`id`"),
    "credentials in packageIndex": ("packageIndex", "https://user:pw@idx.example/simple"),
    "plain http packageIndex": ("packageIndex", "http://idx.example/simple"),
    "`;` in rayVersion": ("rayVersion", "2.60.0;id"),
    "`$()` in name": ("name", "a$(id)"),
    "`;` in project": ("project", "my-proj;id"),
    "space in a label value": ("labels", {"team": "a b"}),
}
SCENARIOS = {key: f"{key} (`{field}`)" for key, (field, _) in VALUES.items()}
TABLE = FaultTable("hostile", SCENARIOS)


@pytest.fixture(scope="module", autouse=True)
def write_fault_table() -> Iterator[None]:
    yield
    if TABLE.complete():
        TABLE.write()


@pytest.mark.parametrize("case", VALUES)
def test_hostile_config_value_is_refused_or_inert(case, host, tmp_path):
    field, value = VALUES[case]
    Path(MARKER).unlink(missing_ok=True)
    raw = {"acceleratorType": "v6e-16", "platform": "tpu-vm", "rayAuth": "none", field: value}
    try:
        spec = spec_module.load(raw, require_zone=False)
    except InvalidInput as error:
        assert error.exit_code == 2
        assert field in str(error)
        TABLE.record(case, "refused (exit 2), the message names the key")
        return
    cloud = _cloud(spec)
    box = _box(host, tmp_path, cloud)
    assert box.boot(box.render(spec, sandbox.free_port())).returncode == 0
    box.wait(lambda: cloud.state == names.STATE_JOINED)
    assert not Path(MARKER).exists()
    assert isinstance(value, list)
    assert f"{value[0]} " in box.uv_log.read_text()  # one literal argument to uv
    TABLE.record(case, "accepted; reaches uv as one literal argument, nothing executed, **joined**")


def test_committed_fault_table_lists_every_hostile_value():
    rows = section(PAGE.read_text(), "hostile")
    for scenario in SCENARIOS.values():
        assert f"| {scenario} |" in rows, scenario
