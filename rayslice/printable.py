"""Which characters are not printable text, for input that is refused and output that is shown.

Control characters (a newline starts another shell command or log line, ESC sequences rewrite a
terminal), format characters (bidi overrides and zero-width characters make text read
differently than it is), line and paragraph separators and lone surrogates. The spec refuses
them in every value (`rayslice.spec.model`); what rayslice prints from outside, such as the
recovery events `rayslice status` reads from guest attributes, shows them escaped.
"""

from __future__ import annotations

import unicodedata

UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def unprintable(char: str) -> bool:
    return unicodedata.category(char) in UNPRINTABLE_CATEGORIES


def escaped(text: str) -> str:
    """`text` with every unprintable character written as its escape (``\\x1b``, ``\\u202e``)."""
    return "".join(
        char.encode("unicode_escape").decode("ascii") if unprintable(char) else char for char in text
    )
