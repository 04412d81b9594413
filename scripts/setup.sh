#!/bin/bash
# Sets up everything rayslice needs on a Debian/Ubuntu machine, idempotently: the system
# packages the simulator and the boot scripts use, and the project venv in .venv with rayslice
# installed editable plus its test, XLA and fit (libtpu) extras. Sourced by demo.sh and test.sh; safe to rerun.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$REPO/.venv"

need_apt=()
command -v ip >/dev/null || need_apt+=(iproute2)
command -v unshare >/dev/null || need_apt+=(util-linux)
command -v curl >/dev/null || need_apt+=(curl)
command -v pgrep >/dev/null || need_apt+=(procps)
command -v git >/dev/null || need_apt+=(git)
command -v nft >/dev/null || need_apt+=(nftables)  # the simulator fences its bridge off from non-root users
command -v iptables >/dev/null || need_apt+=(iptables)  # its other filter backend, which the tests check too

PYTHON=""
for candidate in python3.13 python3.12 python3.11 python3; do
  if command -v "$candidate" >/dev/null &&
     "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    PYTHON=$(command -v "$candidate"); break
  fi
done
if [[ -z $PYTHON ]]; then
  echo "setup: rayslice needs Python >= 3.11 (found: $(python3 --version 2>&1 || echo none))" >&2
  exit 1
fi
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)

if (( ${#need_apt[@]} )); then
  if [[ $(id -u) != 0 ]]; then
    echo "setup: missing system packages ${need_apt[*]}; run as root or install them first" >&2
    exit 1
  fi
  echo "setup: apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

[[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"

# Reinstall only when the dependency declaration changed.
stamp="$VENV/.rayslice-setup"
want=$(cat "$REPO/pyproject.toml" "$REPO/scripts/setup.sh" | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "setup: installing rayslice and its dependencies into $VENV (first run: several minutes)"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$REPO[dev,xla,fit]"
  echo "$want" >"$stamp"
fi
