"""The one Jinja environment: strict variables, the quoting rule, and every shipped template
rendered and checked by bash -n and shellcheck."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import jinja2
import jinja2.meta
import pytest

from rayslice import spec
from rayslice import startup_scripts as ss
from rayslice.errors import InvalidInput
from rayslice.startup_scripts import pod, templating
from rayslice.startup_scripts.controller import render_controller
from tests.startup_scripts.test_startup_scripts import OPTIONS, VARIANTS

SHELLCHECK = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
# Every template rayslice ships, by glob: a new one is checked without being listed anywhere.
TEMPLATES = sorted(path.name for path in templating.TEMPLATE_DIR.glob("*.sh.j2"))

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


@pytest.mark.parametrize("name", TEMPLATES)
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


# ---- every template, rendered in every variant the tests use, through bash -n and shellcheck ----

_SPOT = {"acceleratorType": "v6e-16", "capacity": "spot", "slices": 2}
# The controller VM's script: Spot (the default with a controller), elastic, and each kind of index.
CONTROLLER_VARIANTS = {
    "spot": _SPOT,
    "elastic": VARIANTS["elastic 0 to 2 x v6e-16"],
    "https index": {**_SPOT, "packageIndex": "https://pypi.example.internal/simple"},
    "http index": {**_SPOT, "packageIndex": "http://pypi.internal/simple", "allowInsecurePackageIndex": True},
}
# The GKE pod start script, as tests/startup_scripts/test_pod.py renders it.
POD_VARIANTS = {
    "v6e-4": ("v6e-4", "us-east5-b", 1, None),
    "2 x v6e-16": ("v6e-16", "us-east5-b", 2, None),
    "v5p-16 wheels": ("v5p-16", "us-east5-a", 1, "wheels:/srv/wheels"),
    "3 x tpu7x-16 venv": ("tpu7x-16", "us-central1-c", 3, "venv:/opt/ray venv"),
}


def _pod(accelerator: str, zone: str, slices: int, source: str | None) -> str:
    raw = {"platform": "gke", "acceleratorType": accelerator, "zone": zone, "slices": slices, "name": "demo"}
    return pod.render_pod_start(spec.load({**raw, "preset": "xla"}), source)


def _renderers() -> dict[str, Callable[[], str]]:
    """Every render the tests use, by name: the hosts' boot script, the controller VM's, the pod's."""
    out: dict[str, Callable[[], str]] = {}
    for variant, raw in VARIANTS.items():
        for option, options in OPTIONS.items():
            out[f"boot {variant}, {option}"] = functools.partial(
                ss.render, spec.load(raw, require_zone=False), options
            )
    for variant, raw in CONTROLLER_VARIANTS.items():
        for option, options in OPTIONS.items():
            out[f"controller {variant}, {option}"] = functools.partial(
                render_controller, spec.load(raw, require_zone=False), options
            )
    for variant, args in POD_VARIANTS.items():
        out[f"pod {variant}"] = functools.partial(_pod, *args)
    return out


@contextmanager
def _recording(names: list[str]) -> Iterator[None]:
    """Records the name of every template the environment loads (a render loads its own first,
    then the ones it includes)."""
    env = templating.environment()
    original = env.get_template

    def get_template(name: str | jinja2.Template, *args: object, **kwargs: object) -> jinja2.Template:
        names.append(name if isinstance(name, str) else str(name.name))
        return original(name, *args, **kwargs)  # type: ignore[arg-type]

    env.get_template = get_template  # type: ignore[method-assign]
    try:
        yield
    finally:
        del env.get_template


@functools.cache
def _rendered() -> dict[str, list[tuple[str, str]]]:
    """template -> [(render name, script)] over every render of `_renderers`."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, render in _renderers().items():
        loaded: list[str] = []
        with _recording(loaded):
            script = render()
        out.setdefault(loaded[0], []).append((name, script))
    return out


def _included(name: str) -> set[str]:
    source = (templating.TEMPLATE_DIR / name).read_text()
    return set(jinja2.meta.find_referenced_templates(templating.environment().parse(source)))


def _shell_problems(script: str, path: Path) -> str:
    """What bash -n and shellcheck (every severity down to style) say about `script`; empty if nothing."""
    path.write_text(script)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    check = subprocess.run([SHELLCHECK, "--severity=style", str(path)], capture_output=True, text=True)
    return syntax.stderr + (check.stdout if check.returncode else "")


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_template_renders_and_passes_bash_n_and_shellcheck(tmp_path, name):
    """A partial (``_*.sh.j2``) is checked inside each template that includes it; every other
    template is rendered by at least one of the tests' renders, and each of its renders passes."""
    if name.startswith("_"):
        assert any(name in _included(other) for other in TEMPLATES if other != name), (
            f"nothing includes {name}"
        )
        return
    renders = _rendered().get(name, [])
    assert renders, f"no test renders {name}: add its renderer to _renderers"
    same: dict[str, list[str]] = {}  # script -> the renders that made it (checked once: shellcheck is slow)
    for render, script in renders:
        same.setdefault(script, []).append(render)
    for script, made_by in same.items():
        assert len(script.encode()) < ss.METADATA_VALUE_LIMIT, made_by
        problems = _shell_problems(script, tmp_path / "script.sh")
        assert not problems, f"{', '.join(made_by)}:\n{problems}"


def test_shellcheck_catches_an_unquoted_path_in_the_controller_script(tmp_path):
    """The check above is not blind to the controller script: an unquoted ``$STATE_DIR`` (split
    and globbed by bash) fails it, in the render whose root holds a space (shellcheck passes an
    unquoted variable that it can see holds no space)."""
    script = dict(_rendered()["controller.sh.j2"])["controller spot, simulated, venv"]
    assert not _shell_problems(script, tmp_path / "ok.sh")
    mutated = script.replace('mkdir -p "$STATE_DIR"', "mkdir -p $STATE_DIR", 1)
    assert mutated != script
    assert "SC2086" in _shell_problems(mutated, tmp_path / "mutated.sh")
