"""Hostile configuration values: each is refused by the spec (exit 2) or carried inert.

A value the spec accepts (a PEP 508 marker with quotes, `<` and `;`) runs through the whole boot
script in the sandbox and must reach uv as one literal argument. docs/faults.md shows `TABLE`
(section "hostile"): which values are refused and which are carried inert, as the test asserts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rayslice import names
from rayslice import spec as spec_module
from rayslice.errors import InvalidInput
from tests.startup_scripts import sandbox
from tests.startup_scripts.faults import Fault, FaultTable
from tests.startup_scripts.test_boot_sandbox import _box, _cloud

MARKER = "/tmp/rayslice-hostile-marker"


def _alias_bomb(width: int = 9, depth: int = 9) -> list:
    """What a YAML alias bomb loads as: a few shared lists standing for width**depth strings."""
    value: list = ["lol"] * width
    for _ in range(depth - 1):
        value = [value] * width
    return value


BOMB = _alias_bomb()
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
    "trailing newline in name": ("name", "ray\n"),
    "trailing newline in a label value": ("labels", {"team": "ml\n"}),
    "non-ASCII digits in rayVersion": ("rayVersion", "\u0662.\u0666\u0660.\u0660"),
    "non-ASCII digits in slices": ("slices", "\u0662"),
    "newline in a marker string": ("requirements", ['optax; python_version < "3.1\n2"']),
    "vertical tab in a marker string": ("requirements", ['optax; sys_platform == "linux\x0b"']),
    "query string in packageIndex": ("packageIndex", "https://idx.example/simple?token=abc"),
    "alias bomb in labels": ("labels", {"team": BOMB}),
}
# The values the spec accepts; it refuses every other one.
ACCEPTED = {"PEP 508 marker with quotes, `<`, `;`"}
REFUSED = "refused (exit 2), the message names the key"
INERT = "accepted; reaches uv as one literal argument, nothing executed, **joined**"
TABLE = FaultTable(
    "hostile",
    {
        key: Fault(f"{key} (`{field}`)", INERT if key in ACCEPTED else REFUSED)
        for key, (field, _) in VALUES.items()
    },
)


@pytest.mark.timeout(60)  # the alias bomb, turned into text, would run for hours
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
        assert case not in ACCEPTED, f"the page says {case!r} is accepted, the spec refuses it: {error}"
        return
    assert case in ACCEPTED, f"the page says {case!r} is refused, the spec accepts it"
    cloud = _cloud(spec)
    box = _box(host, tmp_path, cloud)
    assert box.boot(box.render(spec, sandbox.free_port())).returncode == 0
    box.wait(lambda: cloud.state == names.STATE_JOINED)
    assert not Path(MARKER).exists()
    assert isinstance(value, list)
    assert f"{value[0]} " in box.uv_log.read_text()  # one literal argument to uv
