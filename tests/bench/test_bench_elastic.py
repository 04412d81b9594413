"""bench/elastic.py: how it reads the job's clocks and what it runs (the scaling itself runs as
tests/integration/test_elastic.py)."""

from __future__ import annotations

import pytest

from rayslice import spec
from rayslice.cli import load_spec
from tests.bench import load

bench = load("elastic")


def test_the_jobs_clocks_are_read_by_name_and_a_missing_one_says_so() -> None:
    out = "ASKED 100.5\nHOST h\nRAN 130.25\nENDED 131.0\n"
    assert [bench._stamp(n, out) for n in ("ASKED", "RAN", "ENDED")] == [100.5, 130.25, 131.0]
    with pytest.raises(RuntimeError, match="no RAN line"):
        bench._stamp("RAN", "ASKED 1\n")


def test_the_baseline_is_the_same_slice_fixed_and_the_elastic_cluster_starts_without_it() -> None:
    fixed = spec.load(bench.FIXED, require_zone=False)
    elastic = load_spec(bench.EXAMPLE, ["acceleratorType=v6e-4"], require_zone=False)
    assert (fixed.tpu, fixed.head, fixed.platform) == (elastic.tpu, elastic.head, elastic.platform)
    assert not fixed.elastic and elastic.elastic and elastic.min_slices == 0
