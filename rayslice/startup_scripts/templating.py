"""The one Jinja environment for every shell script rayslice renders.

Templates are data: Python computes every value, the template only lays the script out.
Two rules make that safe: `StrictUndefined` (a missing variable is an error, not an empty
string) and the `q` filter, the only way a value enters a script (`{{ value | q }}` is
`shlex.quote`). Rendering rejects any template variable that is interpolated without it.
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path

import jinja2

TEMPLATE_DIR = Path(__file__).parent

# `{{ expr }}` whose last filter is not `q` (or `qjoin`) is refused at render time.
_UNQUOTED = re.compile(r"{{(?![^}]*\|\s*(q|qjoin)\s*}})[^}]*}}")


def _quote(value: object) -> str:
    if value is None:
        raise ValueError("refusing to quote None into a shell script; compute a value in Python")
    if isinstance(value, bool):
        value = "1" if value else "0"
    return shlex.quote(str(value))


def _quote_join(values: object) -> str:
    """A bash array body: each element quoted separately."""
    if isinstance(values, (str, bytes)):
        raise ValueError("qjoin takes a list")
    return " ".join(_quote(v) for v in values)  # type: ignore[union-attr]


class _CheckedLoader(jinja2.FileSystemLoader):
    def get_source(self, environment, template):
        source, filename, uptodate = super().get_source(environment, template)
        unquoted = _UNQUOTED.search(source)
        if unquoted:
            raise jinja2.TemplateError(f"{template}: value interpolated without | q: {unquoted.group(0)}")
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
