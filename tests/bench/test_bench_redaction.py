"""bench/redaction.py: every shape it measures is one redaction acts on, and the report has a row
per shape and one for the old pattern, with both sizes and the ratios. How long redaction takes is
the benchmark's to say, not a test's."""

from __future__ import annotations

import pytest

from rayslice.observability.redaction import REDACTED, redact
from tests.bench import load

bench = load("redaction")


@pytest.mark.parametrize("name", [n for n in bench.SHAPES if n not in (*bench.SCAN_TRAPS, "plain log")])
def test_each_hostile_shape_is_text_that_redaction_acts_on(name):
    """A shape that redaction passed over untouched would measure nothing but a scan."""
    text = bench.sized(bench.SHAPES[name], 4096)
    assert REDACTED in redact(text)


def test_the_baseline_is_the_old_pattern_and_it_removes_a_key():
    key = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----"
    assert bench.OLD_PEM.sub(REDACTED, key) == REDACTED == redact(key)


def test_the_report_has_a_row_per_shape_and_the_baseline(capsys):
    assert bench.main(["--size-kib", "1", "--repeats", "1"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert "growth" in header and "vs log" in header
    assert [row[:24].strip() for row in rows] == [*bench.SHAPES, "old pattern, BEGIN lines"]
    for row in rows:
        figures = [float(x) for x in row[24:].split()]
        assert len(figures) == (4 if row is not rows[-1] else 3) and all(f >= 0 for f in figures)
