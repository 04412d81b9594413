"""Reading what a job may have written: the one guard every reader of a record goes through.

Any Ray job can write under its cluster's ``hosts/`` prefix (every host runs jobs with one
account), and a record may be damaged or crafted. So what `history`, `goodput` and `local down`
read from a record is taken as data, never trusted to be well formed: bytes that are not UTF-8
are replaced, a JSON text longer than `MAX_JSON_BYTES` or nested deeper than `MAX_JSON_DEPTH` is
refused before it is parsed, a line that is not a JSON object is skipped and named on stderr,
and every value is checked for the type and range its use needs (`when`, `text`), so that a
crafted record gives a clean result, never a traceback.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from typing import Any

# A record object (cluster.json, submitted.json, ...) is a few KiB; a log line a few KiB.
MAX_JSON_BYTES = 1024 * 1024
MAX_JSON_DEPTH = 32
# Unix times a record may hold: after 1970, before the year 10000 (what datetime can show).
LATEST_TIME = 253_402_300_799.0
_OPENERS = re.compile(rb"[\[{]")
_SKIPPED_SHOWN = 20


class _Skipped:
    """How many bad parts were skipped, and the first few named on stderr (one line each)."""

    count = 0

    def say(self, where: str, why: str) -> None:
        self.count += 1
        if self.count <= _SKIPPED_SHOWN:
            print(f"rayslice: skipped {where[:200]}: {why}", file=sys.stderr, flush=True)


SKIPPED = _Skipped()


def skip(where: str, why: str) -> None:
    """Name a part of the record that was left out, and why."""
    SKIPPED.say(where, why)


def _too_deep(data: bytes) -> bool:
    """Whether `data` may nest deeper than `MAX_JSON_DEPTH` (a cheap upper bound: brackets
    opened, strings not told apart; json's own parser would overflow Python's stack)."""
    if len(_OPENERS.findall(data, 0, 64 * 1024)) <= MAX_JSON_DEPTH and len(data) <= 64 * 1024:
        return False
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


def json_object(data: bytes, where: str) -> dict[str, Any] | None:
    """`data` as a JSON object, or None (named on stderr) when it is not one, is too big or
    too deep."""
    if len(data) > MAX_JSON_BYTES:
        skip(where, f"more than {MAX_JSON_BYTES} bytes")
        return None
    if _too_deep(data):
        skip(where, f"JSON nested deeper than {MAX_JSON_DEPTH}")
        return None
    try:
        value = json.loads(data.decode(errors="replace"))
    except (ValueError, RecursionError):
        skip(where, "not JSON")
        return None
    if not isinstance(value, dict):
        skip(where, "not a JSON object")
        return None
    return value


def json_lines(data: bytes, where: str) -> Iterator[dict[str, Any]]:
    """Every line of `data` that is a JSON object; the others skipped and named (by line number)."""
    for number, raw in enumerate(data.splitlines(), 1):
        if raw.strip():
            value = json_object(raw, f"line {number} of {where}")
            if value is not None:
                yield value


def when(value: object) -> float | None:
    """`value` as a unix time, or None unless it is a finite number from 1970 to the year 9999."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and 0.0 <= number <= LATEST_TIME else None


def text(value: object, default: str = "") -> str:
    """`value` as text: a string as it is, a number as written, anything else `default`."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return default
