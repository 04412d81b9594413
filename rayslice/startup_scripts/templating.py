"""The one Jinja environment for every shell script rayslice renders.

Templates are data: Python computes every value, the template only lays the script out.
Three rules make that safe, each enforced when a template is loaded (so an unsafe template
never renders, whatever the values):

- `StrictUndefined`: a missing variable is an error, not an empty string;
- every ``{{ … }}`` is a filter expression whose *outermost* filter is `q` (``shlex.quote``) or
  `qjoin` (a bash array body). The check walks the template's syntax tree, not its text, so
  ``{{ a ~ b | q }}`` (only ``b`` quoted) and ``{{ b if c else a | q }}`` (only ``a`` quoted) are
  refused;
- the quoted value lands in plain shell context: not inside ``"…"`` or ``'…'`` (``"'$(id)'"``
  executes), and never in a comment (a newline there starts a command).

The filters themselves refuse None and any control character (newline, tab, ESC, NUL), so a
value is one printable shell word or nothing.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import jinja2
from jinja2 import nodes

from rayslice.errors import InvalidInput

TEMPLATE_DIR = Path(__file__).parent
QUOTING_FILTERS = ("q", "qjoin")


class UnsafeTemplate(jinja2.TemplateError):
    """A template that could interpolate a value without quoting it (a bug in rayslice, not input)."""


def _quote(value: object) -> str:
    if value is None:
        raise InvalidInput("refusing to quote None into a shell script; compute a value in Python")
    if isinstance(value, bool):
        value = "1" if value else "0"
    text = str(value)
    bad = next((c for c in text if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise InvalidInput(
            f"refusing a value with control character {bad!r} in a shell script: {text!r}; "
            "remove newlines, tabs and escape characters from the configuration value"
        )
    return shlex.quote(text)


def _quote_join(values: object) -> str:
    """A bash array body: each element quoted separately."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidInput("qjoin takes a list of values, not a single string")
    return " ".join(_quote(v) for v in values)


def _shell_context(prefix: str) -> str:
    """Where the end of `prefix` (text since the start of its line) leaves the shell lexer.

    ``plain``, ``single``, ``double`` or ``comment``. A small lexer, enough for the lines of a
    template (which contain no here-doc bodies with values in them).
    """
    state = "plain"
    escaped = False
    previous = " "
    for char in prefix:
        if escaped:
            escaped = False
        elif state == "plain":
            if char == "\\":
                escaped = True
            elif char == "'":
                state = "single"
            elif char == '"':
                state = "double"
            elif char == "#" and previous in " \t;(":
                return "comment"
        elif state == "single":
            if char == "'":
                state = "plain"
        elif state == "double":
            if char == "\\":
                escaped = True
            elif char == '"':
                state = "plain"
        previous = char
    return state


def check_template(name: str, source: str, environment: jinja2.Environment) -> None:
    """Raise `UnsafeTemplate` unless every output of `source` is quoted into plain shell context."""
    tree = environment.parse(source, name)
    line = ""
    for output in tree.find_all(nodes.Output):
        for child in output.nodes:
            if isinstance(child, nodes.TemplateData):
                line = (line + child.data).rsplit("\n", 1)[-1]
                continue
            where = f"{name}:{child.lineno}"
            if not (
                isinstance(child, nodes.Filter)
                and child.name in QUOTING_FILTERS
                and not child.args
                and not child.kwargs
                and child.dyn_args is None
                and child.dyn_kwargs is None
            ):
                raise UnsafeTemplate(
                    f"{where}: every value must be interpolated as {{{{ value | q }}}} or "
                    f"{{{{ values | qjoin }}}}, the quoting filter outermost; found {type(child).__name__}"
                )
            context = _shell_context(line)
            if context == "comment":
                raise UnsafeTemplate(f"{where}: value interpolated into a comment")
            if context != "plain":
                raise UnsafeTemplate(f"{where}: quoted value inside {context} quotes (the quotes undo | q)")
            line += "X"  # the quoted word: plain, non-blank


class _CheckedLoader(jinja2.FileSystemLoader):
    def get_source(self, environment, template):
        source, filename, uptodate = super().get_source(environment, template)
        check_template(template, source, environment)
        return source, filename, uptodate


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=_CheckedLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = _quote
    env.filters["qjoin"] = _quote_join
    return env


def render_template(name: str, **variables: object) -> str:
    return environment().get_template(name).render(**variables)
