"""libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) when a process first builds a
topology, and holds it until the process ends; a second process then fails ("Internal error when
accessing libtpu multi-process lockfile"). These tests own no chip, and the suite runs them in
several pytest-xdist workers at once: let each worker load libtpu beside the others (libtpu's own
switch for it, which jax's multi-process tests set too)."""

from __future__ import annotations

import os

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
