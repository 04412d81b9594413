"""The one Jinja environment: strict variables and the quoting rule."""

from __future__ import annotations

import subprocess

import jinja2
import pytest

from rayslice.startup_scripts import templating

HOSTILE = [
    "$(touch {marker})",
    "`touch {marker}`",
    "a'b\"c",
    "line1\nline2; touch {marker}",
    "; touch {marker} #",
    "${{HOME}}",
    "*",
]


def _render_source(source: str, **variables: object) -> str:
    env = templating.environment()
    return env.from_string(source).render(**variables)


def test_missing_variable_is_an_error():
    with pytest.raises(jinja2.UndefinedError):
        _render_source("X={{ missing | q }}")


def test_none_is_refused():
    with pytest.raises(ValueError, match="None"):
        _render_source("X={{ value | q }}", value=None)


def test_booleans_become_0_and_1():
    assert _render_source("{{ a | q }} {{ b | q }}", a=True, b=False) == "1 0"


def test_qjoin_refuses_a_plain_string():
    with pytest.raises(ValueError, match="list"):
        _render_source("X=({{ v | qjoin }})", v="abc")


@pytest.mark.parametrize("raw", HOSTILE)
def test_hostile_values_are_carried_literally(tmp_path, raw):
    marker = tmp_path / "executed"
    value = raw.format(marker=marker)
    script = _render_source(
        'X={{ v | q }}\nY=({{ vs | qjoin }})\nprintf "%s\\0" "$X" "${Y[@]}"', v=value, vs=[value, value]
    )
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.split("\0")[:3] == [value, value, value]
    assert not marker.exists()


def test_templates_with_unquoted_values_are_refused(tmp_path, monkeypatch):
    (tmp_path / "bad.sh.j2").write_text("echo {{ value }}\n")
    monkeypatch.setattr(templating, "TEMPLATE_DIR", tmp_path)
    templating.environment.cache_clear()
    try:
        with pytest.raises(jinja2.TemplateError, match="without \\| q"):
            templating.render_template("bad.sh.j2", value="x")
    finally:
        templating.environment.cache_clear()
