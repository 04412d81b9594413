#!/bin/bash
# Sets up .venv (scripts/setup.sh) and runs the whole test suite; extra arguments go to pytest,
# e.g. `bash scripts/test.sh -m "not slow"` for the quick subset.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$REPO/scripts/setup.sh"
cd "$REPO"
exec "$REPO/.venv/bin/python" -m pytest "$@"
