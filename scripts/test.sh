#!/bin/bash
# Sets up .venv (scripts/setup.sh), checks lint, format and types, then runs the test suite;
# extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the quick subset.
# The suite runs on three pytest-xdist workers (the scheduler in tests/conftest.py): two take the
# tests that start simulated hosts or Ray, one cluster or module at a time each, the third the
# quick modules, then the shortest of those Ray units left. An `-n` given here wins (`-n 0`:
# serially).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$REPO/scripts/setup.sh"
cd "$REPO"
echo "test: ruff check, ruff format --check, mypy"
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
.venv/bin/mypy
exec "$REPO/.venv/bin/python" -m pytest -n 3 "$@"
