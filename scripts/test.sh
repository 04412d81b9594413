#!/bin/bash
# Sets up .venv (scripts/setup.sh), checks lint, format and types, then runs the test suite;
# extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the quick subset.
# Four pytest-xdist workers: two run the integration tests (one those on the shared simulated
# clusters, one the others; see tests/conftest.py), two the quick tests beside them. Most of a
# test's time is spent waiting on hosts, Ray or a subprocess, so four workers fit two cores.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$REPO/scripts/setup.sh"
cd "$REPO"
echo "test: ruff check, ruff format --check, mypy"
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
.venv/bin/mypy
exec "$REPO/.venv/bin/python" -m pytest -n 4 "$@"
