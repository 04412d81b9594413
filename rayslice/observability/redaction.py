"""What the record filters out of every text before it is written: secrets in the forms it knows.

A record outlives its cluster and every job of the cluster can read it, so what a log, a boot
script under ``set -x`` or a job's output prints of a credential must not reach it. `redact`
keeps what names a secret and drops its value:

- a value assigned to a *secret name*, in every spelling a log uses: ``HF_TOKEN=…``,
  ``HF_TOKEN="…"``, ``export AWS_SECRET_ACCESS_KEY='…'``, ``{"client_secret": "…"}``, Python's
  ``{'api_key': '…'}``, YAML's ``password: …``, a flag's ``--token …`` or ``--token=…``, a query's
  ``?key=…&X-Goog-Signature=…``, a header's ``x-goog-api-key: …``, and the same forms escaped
  inside a JSON string (``{"line": "HF_TOKEN=\\"…\\""}``). A secret name is one with a part that
  ends in TOKEN, SECRET, PASSWORD, PASSWD, PASSPHRASE, KEY, SIGNATURE, CREDENTIAL, COOKIE or
  AUTHORIZATION, or in their plural (any case; parts split at ``_``, ``-``, ``.`` and camelCase):
  ``access_token``, ``privateKey``, ``apikey``, ``credentials`` are; ``tokens_per_sec``,
  ``max_tokens``, ``tokenizer``, ``sort_keys`` are not (a count or a tool, which training logs
  print at every step);
- ``Authorization`` and ``Cookie`` / ``Set-Cookie`` headers: the rest of the line (a header's
  value has spaces: ``Bearer …``, ``a=…; b=…``);
- netrc passwords (``machine h login u password …``, or ``password …`` on a line of its own);
- credentials in a URL (``https://user:password@host``, ``https://token@host``);
- tokens by their own shape, wherever they stand: Google OAuth access tokens (``ya29.…``),
  Google API keys (``AIza…``), Hugging Face (``hf_…``), GitHub (``ghp_…``, ``github_pat_…`` and
  kin), GitLab (``glpat-…``), Slack (``xox…-``), OpenAI-style (``sk-…``) tokens and JWTs
  (``eyJ….eyJ….…``);
- PEM private keys (``-----BEGIN … PRIVATE KEY-----``) from BEGIN to END; a BEGIN without its END
  to the end of the text, an END without its BEGIN from the start of the text, so a key cut in
  two by whoever split the text is removed from both halves (the record shipper also holds back
  a piece whose key has not ended yet: `shippable`);
- any secret the writer knows by value (the cluster's Ray token).

A secret in a form not listed here (a bare value on a line of its own, a custom header, a name
outside the list) goes in as written: the docs say "known forms are filtered", not "nothing
secret". Every step is one left-to-right pass with patterns that never backtrack over more than a
bounded window, so a hostile text (megabytes of unmatched BEGIN lines, of quotes, of
backslashes) costs time linear in its size (``bench/redaction.py`` measures it).
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

REDACTED = "[redacted]"

# ---- secret names -------------------------------------------------------------------------------

# A name's part ending in one of these makes it a secret name (see the module docstring).
SECRET_WORDS = (
    "token",
    "secret",
    "password",
    "passwd",
    "passphrase",
    "key",
    "signature",
    "credential",
    "cookie",
    "authorization",
)
# Words whose plural names a count (``max_tokens``, ``num_keys``), never a secret.
_COUNTED = ("token", "key")
# Names whose value is a whole header line (it holds spaces), not one word.
_LINE_VALUED = ("cookie", "authorization")
# Found in the text with only A-Z lowered (`_ascii_lower`: same length, so offsets agree), which
# is many times faster than a case-insensitive search; everything else happens per word found.
_SECRET_WORD = re.compile("|".join(SECRET_WORDS))
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
# A name is a run of these; longer than `_NAME_MAX` it is no name. A flag's dashes lead it.
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")
_NAME_RUN = re.compile(r"[A-Za-z0-9_.-]*")
_NAME_MAX = 100
# What follows a name before its value: `=` or `:`, or (for a flag or a netrc password) blanks.
_SEPARATOR = re.compile(r"[ \t]{0,16}[=:][ \t]{0,16}|[ \t]{1,16}")
_NETRC_WORDS = ("password", "passwd")
_NETRC_LOOKBACK = 256


def _ascii_lower(text: str) -> str:
    """`text` with A-Z lowered and nothing else changed (`str.lower` may change a length)."""
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)


def _part_ends(name: str, end: int) -> bool:
    """Whether a part of `name` ends at `end`: the name's end, a non-letter, or camelCase's next
    capital."""
    if end == len(name):
        return True
    after = name[end]
    return not after.isalpha() or (after.isupper() and name[end - 1].islower())


def secret_name(name: str) -> bool:
    """Whether `name` has a part that ends in one of `SECRET_WORDS`, or in its plural except for
    TOKENS and KEYS, which count things (see the module docstring)."""
    for found in _SECRET_WORD.finditer(_ascii_lower(name)):
        end = found.end()
        if _part_ends(name, end):
            return True
        plural = name[end : end + 1] in ("s", "S") and found[0] not in _COUNTED
        if plural and _part_ends(name, end + 1):
            return True
    return False


# What a quoted value's scan stops at: its quote, a backslash (an escape to weigh), its line's end.
_QUOTED_STOPS = {quote: re.compile(rf"[\\\n{quote}]") for quote in "\"'"}
# Where a bare value stops: blanks, separators of queries, lists and cookies, quotes, brackets,
# and a backslash (a doubled one is part of the value; one alone starts an escape, such as a
# JSON-encoded newline or quote).
_BARE_STOPS = re.compile(r"[\s&;,\"'<>()\[\]{}\\]")
# A list's opening bracket and the blanks after it, before its first item.
_LIST_START = re.compile(r"\[[ \t]{0,16}(?=\\{0,3}[\"'])")
# Where a header line's value stops: the line's end, a quote, an escape.
_LINE_STOPS = re.compile(r"[\r\n\"'\\]")


def _quoted_end(text: str, start: int, quote: str, escaped: bool) -> int:
    """Where the quoted value starting at `start` ends: at its closing `quote` (one that its
    backslashes do not escape), or at the end of its line when it is not closed."""
    stops = _QUOTED_STOPS[quote]
    i = start
    while (found := stops.search(text, i)) is not None:
        i = found.start()
        if text[i] != "\\":
            return i
        run_end = i
        while run_end < len(text) and text[run_end] == "\\":
            run_end += 1
        if run_end < len(text) and text[run_end] == quote:
            run = run_end - i
            # Unescaped at the outer level (an even run) ends the text's own string; inside an
            # escaped quote (JSON in JSON), an odd run ends it where the inner escape does not.
            if run % 2 == 0 or (escaped and (run - 1) // 2 % 2 == 0):
                return i
            run_end += 1
        i = run_end
    return len(text)


def _bare_end(text: str, start: int, stops: re.Pattern[str]) -> int:
    """Where a bare value ends: at one of `stops`, but not at a doubled backslash."""
    i = start
    while (found := stops.search(text, i)) is not None:
        i = found.start()
        if text.startswith("\\\\", i) and stops is _BARE_STOPS:
            i += 2
            continue
        return i
    return len(text)


def _value_span(text: str, start: int, line_valued: bool) -> tuple[int, int]:
    """The value that starts at `start`, without its quotes; of a list (``["Bearer …"]``, as a
    header map prints), its first item."""
    if text.startswith("[", start):
        listed = _LIST_START.match(text, start)
        if listed is not None:
            start = listed.end()
    opening = start
    while opening - start < 3 and text.startswith("\\", opening):
        opening += 1
    if text[opening : opening + 1] in ('"', "'"):
        return opening + 1, _quoted_end(text, opening + 1, text[opening], opening > start)
    return start, _bare_end(text, start, _LINE_STOPS if line_valued else _BARE_STOPS)


def _netrc_password(text: str, start: int) -> bool:
    """Whether the ``password`` at `start` is a netrc one: first on its line, or after ``login X``."""
    line_start = text.rfind("\n", max(0, start - _NETRC_LOOKBACK), start) + 1
    words = text[max(line_start, start - _NETRC_LOOKBACK) : start].split()
    at_line_start = not words and (line_start > 0 or start < _NETRC_LOOKBACK)
    at_string_start = words[-1:] == ['"']  # first in a JSON-encoded line: {"line": "  password …
    return at_line_start or at_string_start or (len(words) >= 2 and words[-2] == "login")


def _assignment(text: str, word_start: int) -> tuple[int, int, int] | None:
    """The assignment whose name holds the secret word at `word_start`: (end of its name's run,
    start and end of its value), or None when it is no secret name's assignment. A run too long
    to be a name gives its end three times: nothing to redact, and the rest of it is skipped."""
    start = word_start
    while start > word_start - _NAME_MAX and start > 0 and text[start - 1] in _NAME_CHARS:
        start -= 1
    run = _NAME_RUN.match(text, word_start)
    run_end = run.end() if run else word_start
    if run_end - start > _NAME_MAX or (start > 0 and text[start - 1] in _NAME_CHARS):
        return run_end, run_end, run_end  # no name: skip the rest of this run
    name = text[start:run_end].lstrip("-")
    dashes = run_end - start - len(name)
    if not secret_name(name):
        return None
    # A quoted name ("token": ...), its quote escaped up to 3 times (JSON inside JSON).
    opening = start
    if opening > 0 and text[opening - 1] in "\"'":
        opening -= 1
        while opening > start - 4 and opening > 0 and text[opening - 1] == "\\":
            opening -= 1
    after = run_end
    if opening < start and not dashes and text.startswith(text[opening:start], run_end):
        after += start - opening
    separator = _SEPARATOR.match(text, after)
    if separator is None:
        return None
    lowered = _ascii_lower(name)
    if not separator[0].strip():  # blanks only: a flag's value or a netrc password
        netrc = lowered in _NETRC_WORDS and _netrc_password(text, start)
        if (dashes not in (1, 2) and not netrc) or text.startswith("-", separator.end()):
            return None
    value_start, value_end = _value_span(text, separator.end(), lowered.endswith(_LINE_VALUED))
    return run_end, value_start, value_end


def _assignments(text: str) -> str:
    """`text` with the value of every secret name's assignment redacted."""
    out: list[str] = []
    done = skip = 0
    for word in _SECRET_WORD.finditer(_ascii_lower(text)):
        if word.start() < max(done, skip):
            continue
        found = _assignment(text, word.start())
        if found is None:
            continue
        skip, start, end = found
        if end > start and text[start:end] != REDACTED:
            out += [text[done:start], REDACTED]
            done = end
    out.append(text[done:])
    return "".join(out)


# ---- PEM private keys -----------------------------------------------------------------------------

# A PEM boundary line's marker; only private keys' labels count (certificates are public).
_PEM_MARKER = re.compile(r"-----(BEGIN|END) ([A-Z0-9 ]{0,40}PRIVATE KEY[A-Z ]{0,20})-----")


def _pem_spans(text: str) -> list[tuple[int, int]]:
    """The private-key blocks of `text`: BEGIN to END, a BEGIN without END to the end, an END
    without BEGIN from the end of the previous block (or the start). One pass over the markers."""
    spans: list[tuple[int, int]] = []
    opened: int | None = None
    floor = 0
    for marker in _PEM_MARKER.finditer(text):
        if marker[1] == "BEGIN":
            if opened is None:
                opened = marker.start()
            continue
        spans.append((floor if opened is None else opened, marker.end()))
        opened, floor = None, marker.end()
    if opened is not None:
        spans.append((opened, len(text)))
    return spans


def _without_keys(text: str) -> str:
    spans = _pem_spans(text)
    if not spans:
        return text
    out, done = [], 0
    for start, end in spans:
        out += [text[done:start], REDACTED]
        done = end
    out.append(text[done:])
    return "".join(out)


# How long the record shipper holds back a piece from an unmatched BEGIN waiting for its END: a
# private key's PEM is a few KiB (RSA 8192: about 6.5 KiB); past this it ships what it has.
PEM_HOLD_BYTES = 64 * 1024
_PEM_BEGIN = re.compile(rb"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY[A-Z ]{0,20}-----")
_PEM_END = re.compile(rb"-----END [A-Z0-9 ]{0,40}PRIVATE KEY[A-Z ]{0,20}-----")


def shippable(data: bytes, *, final: bool = False) -> int:
    """How many bytes of `data` (whole lines of a growing log) to ship now: all, unless a private
    key's BEGIN has no END after it yet; then up to the start of that BEGIN's line, so that the
    next pass, with the END, redacts the block whole. Not held back: on the `final` pass, and
    once more than `PEM_HOLD_BYTES` follow the BEGIN (then up to the line that passes that bound,
    and the block is redacted to the end of that piece)."""
    ends = [end.end() for end in _PEM_END.finditer(data)]
    begin = _PEM_BEGIN.search(data, ends[-1] if ends else 0)
    if begin is None or final:
        return len(data)
    line_start = data.rfind(b"\n", 0, begin.start()) + 1
    if len(data) - line_start <= PEM_HOLD_BYTES:
        return line_start
    bound = data.find(b"\n", line_start + PEM_HOLD_BYTES)
    return len(data) if bound < 0 else bound + 1


# ---- tokens by shape and URLs -------------------------------------------------------------------

# Each starts with a literal, which the regex engine finds by a fast scan; the lookbehind after
# it checks that the literal starts a word.
_SHAPES = (
    # Credentials in a URL: https://user:password@host (a private index's URL) or https://token@host.
    (
        re.compile(r"://(?<=[A-Za-z0-9+.-]://)[^/\s@:'\"]{1,256}(?::[^/\s@'\"]{0,256})?@"),
        f"://{REDACTED}@",
    ),
    *(
        (re.compile(rf"{prefix}(?<![\w-]{prefix}){rest}"), REDACTED)
        for prefix, rest in (
            (r"ya29\.", r"[\w.-]+"),  # a Google OAuth access token
            ("AIza", r"[\w-]{30,}"),  # a Google API key
            ("hf_", "[A-Za-z0-9]{20,}"),  # Hugging Face
            ("gh[pousr]_", "[A-Za-z0-9]{20,}"),  # GitHub
            ("github_pat_", r"\w{20,}"),
            ("glpat-", r"[\w-]{20,}"),  # GitLab
            ("xox[abposr]-", r"[\w-]{10,}"),  # Slack
            ("sk-", r"[\w-]{20,}"),  # OpenAI and others
            ("eyJ", r"[\w-]{4,}\.eyJ[\w-]{4,}\.[\w-]*"),  # a JWT: base64url JSON header and claims
        )
    ),
)


def redact(text: str, known: Iterable[str] = ()) -> str:
    """`text` without the secrets it holds in the forms the module docstring lists; `known`:
    secret values to remove wherever they appear (shorter than 8 characters is too likely to be
    a word: ignored)."""
    for value in known:
        if len(value) >= 8:
            text = text.replace(value, REDACTED)
    text = _without_keys(text)
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    return _assignments(text)
