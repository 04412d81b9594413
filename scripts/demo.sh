#!/bin/bash
# The main job: set up .venv (scripts/setup.sh), bring up a simulated v6e-16 slice (4 hosts x
# 4 chips, each a network namespace running the real boot script), show the Ray cluster, and
# run the bundled host-centric JAX job on it. Needs root (network namespaces).
# `.venv/bin/rayslice local down` removes everything afterwards.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$REPO/scripts/setup.sh"
cd "$REPO"
RAYSLICE="$REPO/.venv/bin/rayslice"
"$RAYSLICE" local up "$@"
"$RAYSLICE" run jax_multihost
echo "The simulated slice is still up: '$RAYSLICE local status' shows it, '$RAYSLICE local down' removes it."
