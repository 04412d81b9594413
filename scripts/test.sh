#!/bin/bash
# Sets up .venv (scripts/setup.sh), checks lint, format and types, then runs the test suite;
# extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the quick subset.
# The suite runs serially. `-n 4` (pytest-xdist, with the scheduler in tests/conftest.py: two
# workers for the integration tests, two for the quick ones) took 11 min instead of ~20 on a quiet
# 2-core machine, but there local Ray start-ups and a simulated host's boot timed out under the
# load; pass `-n 4` yourself on a larger machine.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$REPO/scripts/setup.sh"
cd "$REPO"
echo "test: ruff check, ruff format --check, mypy"
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
.venv/bin/mypy
exec "$REPO/.venv/bin/python" -m pytest "$@"
