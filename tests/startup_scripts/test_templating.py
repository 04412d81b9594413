"""The one Jinja environment: strict variables and the quoting rule."""

from __future__ import annotations

import subprocess

import jinja2
import pytest

from rayslice.errors import InvalidInput
from rayslice.startup_scripts import templating

HOSTILE = [
    "$(touch {marker})",
    "`touch {marker}`",
    "a'b\"c",
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
    with pytest.raises(InvalidInput, match="None"):
        _render_source("X={{ value | q }}", value=None)


def test_booleans_become_0_and_1():
    assert _render_source("{{ a | q }} {{ b | q }}", a=True, b=False) == "1 0"


def test_qjoin_refuses_a_plain_string():
    with pytest.raises(InvalidInput, match="list"):
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


@pytest.mark.parametrize("char", ["\n", "\r", "\t", "\x1b", "\x00", "\x7f"])
def test_control_characters_are_refused(char):
    with pytest.raises(InvalidInput, match="control character"):
        _render_source("X={{ v | q }}", v=f"a{char}touch /tmp/x")
    with pytest.raises(InvalidInput, match="control character"):
        _render_source("X=({{ v | qjoin }})", v=["ok", f"a{char}b"])


UNSAFE = {
    "no filter": ("echo {{ value }}\n", "quoting filter outermost"),
    "other filter outermost": ("echo {{ value | q | upper }}\n", "quoting filter outermost"),
    "concat bypass": ("echo {{ a ~ b | q }}\n", "found Concat"),
    "conditional bypass": ("echo {{ b if c else a | q }}\n", "found CondExpr"),
    "inside double quotes": ('echo "{{ a | q }}"\n', "inside double quotes"),
    "inside single quotes": ("echo 'x{{ a | q }}'\n", "inside single quotes"),
    "double quotes opened earlier": ('echo "x $(date) {{ a | q }}"\n', "inside double quotes"),
    "comment": ("# built for {{ a | q }}\n", "into a comment"),
    "trailing comment": ("X=1  # {{ a | q }}\n", "into a comment"),
    "filter with arguments": ("echo {{ a | q(1) }}\n", "quoting filter outermost"),
    "in an if block": ("{% if c %}\necho {{ a }}\n{% endif %}\n", "quoting filter outermost"),
    "here-document body": ("cat <<EOF\nvalue: {{ a | q }}\nEOF\n", "here-document body"),
    "quoted here-document body": ("cat <<'EOF'\n{{ a | q }}\nEOF\n", "here-document body"),
    "tab-stripped here-document": ("cat <<-END >f\n\t{{ a | q }}\n\tEND\n", "here-document body"),
    "second of two here-documents": ("cat <<A <<B\nA\n{{ a | q }}\nB\n", "here-document body"),
    "arithmetic command": ("if (({{ a | q }} > 0)); then :; fi\n", "arithmetic context"),
    "arithmetic expansion": ("X=$(( {{ a | q }} + 1 ))\n", "arithmetic context"),
    "nested arithmetic": ("X=$(( (1 + {{ a | q }}) ))\n", "arithmetic context"),
    "array subscript": ("echo ${ARR[{{ a | q }}]}\n", "arithmetic context"),
    "array assignment subscript": ("ARR[{{ a | q }}]=1\n", "arithmetic context"),
}


@pytest.mark.parametrize("case", UNSAFE)
def test_unsafe_templates_are_refused(tmp_path, monkeypatch, case):
    source, message = UNSAFE[case]
    (tmp_path / "bad.sh.j2").write_text(source)
    monkeypatch.setattr(templating, "TEMPLATE_DIR", tmp_path)
    templating.environment.cache_clear()
    try:
        with pytest.raises(templating.UnsafeTemplate, match=message):
            templating.render_template("bad.sh.j2", value="x", a="$(id)", b="y", c=True)
    finally:
        templating.environment.cache_clear()


SAFE = [
    "X={{ a | q }}\n",
    "echo {{ a | q }} '#' \"$HOME\" {{ b | q }}\n",
    "X=${Y:-{{ a | q }}}\n",
    "A=({{ l | qjoin }})\n",
    'echo "closed" {{ a | q }}\n',
    "cat <<EOF\nbody\nEOF\nX={{ a | q }}\n",  # after the here-document ends
    "cat <<-EOF\n\tbody\n\tEOF\nX={{ a | q }}\n",
    'X=$(tr a b <<<"$Y") {{ a | q }}\n',  # a here-string is a word
    "((N > 1)) && echo {{ a | q }}\n",  # after the arithmetic closes
    "X=$((N + 1)) {{ a | q }}\n",
    "[[ -n $X ]] && echo {{ a | q }}\n",  # a test, not a subscript
    "echo ${ARR[0]} {{ a | q }}\n",
]


@pytest.mark.parametrize("source", SAFE)
def test_quoted_values_in_plain_context_are_accepted(source):
    templating.check_template("ok.sh.j2", source, templating.environment())


@pytest.mark.parametrize(
    "name", ["startup.sh.j2", "pod_start.sh.j2", "_install.sh.j2", "_numbers.sh.j2", "_metadata.sh.j2"]
)
def test_shipped_templates_pass_the_check_and_keep_values_out_of_comments(name):
    source = (templating.TEMPLATE_DIR / name).read_text()
    templating.check_template(name, source, templating.environment())
    for line in source.splitlines():
        if line.lstrip().startswith("#"):
            assert "{{" not in line, line


@pytest.mark.parametrize(
    "script",
    [
        # what the checker refuses runs the command: the checks guard real sinks
        "X={value}\nif ((X > 0)); then :; fi",
        "X={value}\necho $((X + 1))",
        "cat <<EOF\n{value}\nEOF",
    ],
    ids=["arithmetic command", "arithmetic expansion", "here-document"],
)
def test_the_refused_contexts_execute_a_quoted_value(tmp_path, script):
    """`q` makes `a[$(touch …)]` one inert word, yet bash runs it in arithmetic and here-documents;
    hence the checker's two rules."""
    marker = tmp_path / "executed"
    value = f"a[$(touch {marker})]" if "X=" in script else f"$(touch {marker})"
    quoted = _render_source("{{ v | q }}", v=value)
    subprocess.run(["bash", "-c", script.format(value=quoted)], capture_output=True, text=True)
    assert marker.exists()
