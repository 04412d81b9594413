"""jax_lm's training text: the Python standard library's own sources, read as bytes.

Every host that runs a JAX job has a Python, so its standard library is text already on the
machine: no download, no data set to stage, and a byte-level vocabulary (256 symbols) needs no
tokenizer. It is real text (code, comments, docstrings), so a language model's loss falls on it
as it would on any corpus. Batches are drawn from a seed and the step number alone, so every
process of a multi-host job draws the same global batch and takes the rows its devices hold,
and a run resumed at step K draws what an uninterrupted run would have drawn there.
"""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path

import numpy as np

VOCAB = 256  # one symbol per byte value
# How much of the standard library to read: enough text that a short run never sees a window
# twice in practice, little enough to read in a second on any host.
CORPUS_BYTES = 16 * 2**20
# Folders whose files are not source text a model should learn from (test fixtures hold binary
# and deliberately broken files; installed packages differ between hosts).
SKIPPED_FOLDERS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"})


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@functools.cache
def corpus(limit: int = CORPUS_BYTES) -> np.ndarray:
    """The first `limit` bytes of the standard library's .py files, in path order, as uint8."""
    root = stdlib_root()
    chunks: list[bytes] = []
    size = 0
    for path in sorted(root.rglob("*.py")):
        if SKIPPED_FOLDERS.intersection(path.relative_to(root).parts):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        size += len(data)
        if size >= limit:
            break
    if size == 0:
        raise FileNotFoundError(f"no Python sources under {root} to train on")
    return np.frombuffer(b"".join(chunks)[:limit], dtype=np.uint8)


def batch(text: np.ndarray, seed: int, step: int, rows: int, length: int) -> np.ndarray:
    """`rows` windows of `length` + 1 bytes (inputs and their next-byte targets) at offsets drawn
    from (`seed`, `step`), as int32 token ids."""
    if len(text) <= length + 1:
        raise ValueError(f"the corpus has {len(text)} bytes, fewer than a window of {length + 1}")
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(text) - length - 1, size=rows)
    return np.stack([text[s : s + length + 1] for s in starts]).astype(np.int32)
