"""The emulation's OAuth token endpoint: a service-account key the emulation made, and the
RFC 7523 JWT-bearer grant that turns a signed assertion into an access token.

A client holds a real ``service_account`` ADC file whose ``token_uri`` points here (an
``authorized_user`` file cannot: google-auth always sends its refresh to Google's own token
endpoint). Every API call must then carry a token issued here.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

import google.auth.exceptions
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import jwt

# google-auth signs every service-account assertion for Google's token endpoint, whatever
# token_uri the key file names; Google checks this audience, so the emulation does too.
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"


class ServiceAccountTokens:
    """The key pair, the key file that names it, and the tokens issued for it."""

    lock: threading.RLock  # the emulation's lock (`project.EmulatedProject`)

    def __init__(self) -> None:
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._key_id = secrets.token_hex(8)
        self.tokens: set[str] = set()

    @property
    def url(self) -> str:
        """The emulation's base URL, where a key file's ``token_uri`` points; the server's."""
        raise NotImplementedError

    def service_account_info(self, project: str = "rayslice-test") -> dict[str, str]:
        """A ``service_account`` key file (the ADC form) whose token requests come here."""
        pem = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return {
            "type": "service_account",
            "project_id": project,
            "private_key_id": self._key_id,
            "private_key": pem.decode(),
            "client_email": f"emulated-user@{project}.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": f"{self.url}/token",
        }

    def _token(self, form: dict[str, str]) -> tuple[int, Any]:
        """RFC 7523 JWT-bearer grant, as Google's token endpoint takes it from a service account."""
        public = self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        try:
            if form.get("grant_type") != JWT_BEARER:
                raise ValueError(f"unsupported grant_type {form.get('grant_type')!r}")
            jwt.decode(
                form.get("assertion", ""),
                certs={self._key_id: public.decode()},
                audience=GOOGLE_TOKEN_AUDIENCE,
            )
        except (ValueError, google.auth.exceptions.GoogleAuthError) as exc:
            return 400, {"error": "invalid_grant", "error_description": str(exc)}
        token = f"emulated-{secrets.token_urlsafe(16)}"
        with self.lock:
            self.tokens.add(token)
        return 200, {"access_token": token, "expires_in": 3600, "token_type": "Bearer"}
