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
  executes), never in a comment (a newline there starts a command), never in a here-document
  body (quotes do not delimit a value there) and never in arithmetic (``(( ))``, ``$(( ))``,
  ``a[…]``: bash expands ``a[$(cmd)]`` in a value it evaluates).

The filters themselves refuse None and any control character (newline, tab, ESC, NUL), so a
value is one printable shell word or nothing.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import jinja2
from jinja2 import nodes

from rayslice.errors import InvalidInput

TEMPLATE_DIR = Path(__file__).parent
QUOTING_FILTERS = ("q", "qjoin")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # what no value may carry into a script


class UnsafeTemplate(jinja2.TemplateError):
    """A template that could interpolate a value without quoting it (a bug in rayslice, not input)."""


def _quote(value: object) -> str:
    if value is None:
        raise InvalidInput("refusing to quote None into a shell script; compute a value in Python")
    if isinstance(value, bool):
        value = "1" if value else "0"
    text = str(value)
    bad = _CONTROL.search(text)
    if bad is not None:
        raise InvalidInput(
            f"refusing a value with control character {bad.group()!r} in a shell script: {text!r}; "
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

    ``plain``, ``single``, ``double``, ``comment`` or ``arithmetic``: inside ``(( ))``,
    ``$(( ))`` or an array subscript ``name[…]``, where bash evaluates a value's text as an
    expression and expands ``a[$(cmd)]`` in it, so quoting cannot make a value inert there.
    A small lexer, enough for the lines of a template.
    """
    state = "plain"
    escaped = False
    previous = " "
    arithmetic = 0  # open parentheses of (( )) / $(( ))
    subscripts = 0  # open brackets of name[…]
    i = 0
    while i < len(prefix):
        char = prefix[i]
        if escaped:
            escaped = False
        elif state == "plain":
            if char == "\\":
                escaped = True
            elif char == "'":
                state = "single"
            elif char == '"':
                state = "double"
            elif char == "#" and previous in " \t;(" and not arithmetic:
                return "comment"
            elif prefix.startswith("((", i):
                arithmetic += 2
                i += 1
                char = "("
            elif arithmetic and char in "()":
                arithmetic += 1 if char == "(" else -1
            elif char == "[" and (previous.isalnum() or previous == "_"):
                subscripts += 1
            elif char == "]" and subscripts:
                subscripts -= 1
        elif state == "single":
            if char == "'":
                state = "plain"
        elif state == "double":
            if char == "\\":
                escaped = True
            elif char == '"':
                state = "plain"
        previous = char
        i += 1
    return "arithmetic" if state == "plain" and (arithmetic or subscripts) else state


# ``<<WORD``, ``<<-WORD``, ``<<'WORD'``, ``<<"WORD"``; not the here-string ``<<<``.
_HEREDOC = re.compile(r"(?<!<)<<(-?)[ \t]*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


def _in_heredoc(text: str) -> bool:
    """Whether the end of `text` (the template so far) lies inside a here-document body.

    A value there is read by bash as body text, not as a word: `q`'s quotes do not delimit it,
    and an unquoted delimiter expands ``$(…)`` in it. So no value may stand in a body at all.
    """
    pending: list[tuple[str, bool]] = []  # delimiters still open, and whether tabs are stripped
    for line in text.split("\n")[:-1]:  # complete lines; the last one is still being written
        if pending:
            word, strip = pending[0]
            if (line.lstrip("\t") if strip else line) == word:
                pending.pop(0)
            continue
        pending += [
            (match[3], match[1] == "-")
            for match in _HEREDOC.finditer(line)
            if _shell_context(line[: match.start()]) == "plain"
        ]
    return bool(pending)


def check_template(name: str, source: str, environment: jinja2.Environment) -> None:
    """Raise `UnsafeTemplate` unless every output of `source` is quoted into plain shell context."""
    tree = environment.parse(source, name)
    text = ""  # the template so far, each value written as one plain word
    for output in tree.find_all(nodes.Output):
        for child in output.nodes:
            if isinstance(child, nodes.TemplateData):
                text += child.data
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
            if _in_heredoc(text):
                raise UnsafeTemplate(f"{where}: value interpolated into a here-document body")
            context = _shell_context(text.rsplit("\n", 1)[-1])
            if context == "comment":
                raise UnsafeTemplate(f"{where}: value interpolated into a comment")
            if context == "arithmetic":
                raise UnsafeTemplate(
                    f"{where}: value interpolated into an arithmetic context ((( )), $(( )) or a[…]); "
                    "assign it to a variable checked as a whole number first"
                )
            if context != "plain":
                raise UnsafeTemplate(f"{where}: quoted value inside {context} quotes (the quotes undo | q)")
            text += "X"  # the quoted word: plain, non-blank


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
