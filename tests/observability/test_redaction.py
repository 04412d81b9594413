"""Redaction: what the record filters out of every text before writing it."""

from __future__ import annotations

from rayslice.observability.redaction import redact

RAY_TOKEN = "f3a9c1d27b8e4f60a1b2c3d4e5f60718"
SECRET_TEXT = f"""\
+ curl -H 'Authorization: Bearer {RAY_TOKEN}' http://10.0.0.2:8265/api/jobs/
> GET /computeMetadata/v1/instance/service-accounts/default/token
< {{"access_token":"ya29.a0AfB_byC-secret_value","expires_in":3599,"token_type":"Bearer"}}
pip install --index-url https://deploy:s3cr3t-pass@pypi.corp.example/simple ray
pip install --extra-index-url https://oauth2accesstoken@europe-python.pkg.dev/p/r/simple x
export RAY_AUTH_TOKEN={RAY_TOKEN}
GET /wheels?token=abcdef123456&name=x
authorization: Basic dXNlcjpwYXNz
{{"type": "service_account",
  "private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEv\\n-----END PRIVATE KEY-----\\n"}}
the token {RAY_TOKEN} again
step  12  loss 0.51234
"""
SECRETS = (
    RAY_TOKEN,
    "ya29.a0AfB_byC-secret_value",
    "s3cr3t-pass",
    "deploy:",
    "oauth2accesstoken",
    "abcdef123456",
    "dXNlcjpwYXNz",
    "MIIEv",
)


def test_redact_removes_every_kind_of_secret_and_keeps_the_rest() -> None:
    clean = redact(SECRET_TEXT, known=[RAY_TOKEN])
    for secret in SECRETS:
        assert secret not in clean
    assert "pypi.corp.example/simple" in clean and "step  12  loss 0.51234" in clean
    assert "Authorization: [redacted]" in clean and "RAY_AUTH_TOKEN=[redacted]" in clean
