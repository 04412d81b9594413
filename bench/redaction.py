"""How redaction's time grows with its text: every hostile shape against a plain training log of
the same size, at two sizes, and the private-key pattern redaction used before as the baseline.

The record shipper, `rayslice run`'s journal and `rayslice local down` pass every text through
`rayslice.observability.redaction.redact`, and a job decides what its logs hold. Redaction is
linear when a text 8 times longer takes about 8 times as long (``growth`` near 1, per byte); the
old pattern (``BEGIN .*? END`` with re.S) scans to the end of the text from every unmatched BEGIN,
so its growth is about 8 again (quadratic). ``vs log`` is each shape's time over the plain log's
at the large size: a bounded factor, whatever the shape. Absolute milliseconds depend on the
machine and its load; the ratios are what the benchmark reports.

    python bench/redaction.py [--size-kib N] [--repeats R]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Callable

from rayslice.observability.redaction import redact

GROWTH = 8
# The private-key pattern before linear redaction, as the baseline.
OLD_PEM = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S)
LOG_LINE = (
    "(TrainWorker pid=4242, ip=10.0.0.7) step 1200 loss 0.51234 tokens_per_sec=51234.5 lr=3e-4 "
    "grad_norm=1.23 [2026-12-07 19:00:00,123 I 55 55] core_worker.cc:123: task finished\n"
)
# Units repeated to the size: each aims at one step of redaction, with a value to redact, or (the
# `SCAN_TRAPS`) at a scan that a backtracking pattern would repeat from every position.
SHAPES = {
    "plain log": LOG_LINE,
    "unmatched BEGIN lines": "-----BEGIN PRIVATE KEY-----\n",
    "END lines": "-----END RSA PRIVATE KEY-----\n",
    "dashes": "-",
    "quotes": '"',
    "backslashes": "\\",
    "secret names": "token=",
    "quoted names": '"token": "v", ',
    "escaped quoted names": 'token=\\"',
    "flags": "--token v ",
    "netrc passwords": "login x password ",
    "cookies": "Cookie: ",
    "URL schemes": "a://",
    "JWT starts": "eyJaaaa.",
    "one long word": "a",
}
SCAN_TRAPS = ("dashes", "quotes", "backslashes", "URL schemes", "JWT starts", "one long word")


def seconds(call: Callable[[str], object], text: str, repeats: int) -> float:
    """The median CPU time of `call(text)` over `repeats` runs."""
    runs = []
    for _ in range(repeats):
        started = time.process_time()
        call(text)
        runs.append(time.process_time() - started)
    return statistics.median(runs)


def sized(unit: str, size: int) -> str:
    return unit * max(1, size // len(unit))


def growth(call: Callable[[str], object], unit: str, size: int, repeats: int) -> tuple[float, float, float]:
    """(ms at `size`, ms at GROWTH x `size`, growth per byte: 1 when linear)."""
    small, large = sized(unit, size), sized(unit, size * GROWTH)
    small_s, large_s = seconds(call, small, repeats), seconds(call, large, repeats)
    per_byte = (large_s / len(large)) / (small_s / len(small))
    return small_s * 1000, large_s * 1000, per_byte


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size-kib", type=int, default=512, help="the small size (default: 512 KiB)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure, the median kept")
    args = parser.parse_args(argv)
    size = args.size_kib * 1024
    rows = {name: growth(redact, unit, size, args.repeats) for name, unit in SHAPES.items()}
    log_ms = rows["plain log"][1]
    print(f"{'shape':<24} {'ms':>9} {f'ms x{GROWTH}':>10} {'growth':>7} {'vs log':>7}")
    for name, (small_ms, large_ms, per_byte) in rows.items():
        print(f"{name:<24} {small_ms:9.1f} {large_ms:10.1f} {per_byte:7.2f} {large_ms / log_ms:7.2f}")
    # The baseline grows quadratically: measured at a size 64 times smaller, so that it ends.
    small_ms, large_ms, per_byte = growth(
        lambda text: OLD_PEM.sub("", text), SHAPES["unmatched BEGIN lines"], max(1024, size // 64), 1
    )
    print(f"{'old pattern, BEGIN lines':<24} {small_ms:9.1f} {large_ms:10.1f} {per_byte:7.2f} {'':>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
