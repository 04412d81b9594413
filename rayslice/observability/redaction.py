"""What the record filters out of every text before it is written: secrets in their known forms.

See `redact`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[redacted]"

# What `redact` removes. Each keeps what names the secret and drops its value.
_SECRET_PATTERNS = (
    # An Authorization header (HTTP request dumps, curl -v, Ray's client errors), any scheme.
    (
        re.compile(r"(?i)(\bauthorization\s*[:=]\s*)(?:(?:bearer|basic|token)\s+)?[^\s'\",]+"),
        rf"\1{REDACTED}",
    ),
    # Credentials in a URL: https://user:password@host (a private index's URL) or https://token@host.
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)[^/\s@:'\"]+(?::[^/\s@'\"]*)?@"), rf"\1{REDACTED}@"),
    # The metadata server's token answer and OAuth forms: "access_token": "ya29...".
    (
        re.compile(r"(?i)(\"?(?:access_token|refresh_token|id_token)\"?\s*[:=]\s*\"?)[^\s\"',&]+"),
        rf"\1{REDACTED}",
    ),
    # A Google OAuth access token by its own prefix, wherever it stands.
    (re.compile(r"\bya29\.[A-Za-z0-9_\-.]+"), REDACTED),
    # A PEM private key (a service-account key file's "private_key"), whole.
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S), REDACTED),
    (re.compile(r"(?i)(\"private_key\"\s*:\s*\")[^\"]+"), rf"\1{REDACTED}"),
    # Environment and query assignments: RAY_AUTH_TOKEN=..., ?token=..., password: ...
    (
        re.compile(r"(?i)(\b[A-Z0-9_]*(?:TOKEN|PASSWORD|SECRET|PASSWD|API_KEY)\b\s*[=:]\s*)[^\s&'\",]+"),
        rf"\1{REDACTED}",
    ),
)


def redact(text: str, known: Iterable[str] = ()) -> str:
    """`text` without the secrets it holds (see the module docstring); `known`: secret values to
    remove wherever they appear (shorter than 8 characters is too likely to be a word: ignored)."""
    for value in known:
        if len(value) >= 8:
            text = text.replace(value, REDACTED)
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text
