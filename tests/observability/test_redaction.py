"""Redaction: what the record filters out of every text before writing it."""

from __future__ import annotations

import json

import pytest

from rayslice.observability.redaction import PEM_HOLD_BYTES, REDACTED, redact, shippable

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


# One secret per line, in every form the module docstring lists: the line, what must go, what stays
# (what names the secret, for whoever reads the record).
FORMS = [
    ('export HF_TOKEN="hfvalue-1 with space"', "hfvalue-1", "HF_TOKEN="),
    ("HF_TOKEN='hfvalue-2' python -m train", "hfvalue-2", "HF_TOKEN="),
    ("HF_TOKEN=hfvalue-3", "hfvalue-3", "HF_TOKEN="),
    ('{"token": "jsonvalue-4", "step": 3}', "jsonvalue-4", '"token": '),
    ('{"client_secret": "jsonvalue-5"}', "jsonvalue-5", '"client_secret": '),
    ("{'api_key': 'reprvalue-6', 'n': 1}", "reprvalue-6", "'api_key': "),
    ("AWS_SECRET_ACCESS_KEY=awsvalue/7+x", "awsvalue/7+x", "AWS_SECRET_ACCESS_KEY="),
    ("python train.py --token flagvalue-8 --steps 10", "flagvalue-8", "--token "),
    ("python train.py --hf-token=flagvalue-9 --steps 10", "flagvalue-9", "--hf-token="),
    ("password: yamlvalue-10", "yamlvalue-10", "password: "),
    ("privateKey=camelvalue-11", "camelvalue-11", "privateKey="),
    (
        "https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256"
        "&X-Goog-Credential=sa%40p.iam%2F20261207&X-Goog-Signature=0a1b2c3d4e5f&X-Goog-Expires=900",
        "0a1b2c3d4e5f",
        "&X-Goog-Signature=",
    ),
    (
        "https://storage.googleapis.com/b/o?GoogleAccessId=sa@p.iam.gserviceaccount.com"
        "&Expires=1765000000&Signature=Zm9vYmFy%2Bsig",
        "Zm9vYmFy",
        "&Signature=",
    ),
    ("GET https://translation.googleapis.com/v2?q=x&key=keyvalue-14", "keyvalue-14", "&key="),
    (
        "key AIzaSyA1234567890abcdefghijklmnopqrstu in a sentence",
        "AIzaSyA1234567890abcdefghijklmnopqrstu",
        "key ",
    ),
    (
        "curl -H 'x-goog-api-key: headervalue-16' https://x.googleapis.com",
        "headervalue-16",
        "x-goog-api-key: ",
    ),
    (
        "machine pypi.corp.example login deploy password netrcvalue-17",
        "netrcvalue-17",
        "login deploy password ",
    ),
    ("  password netrcvalue-18", "netrcvalue-18", "password "),
    ("Cookie: session=cookievalue-19; theme=dark", "cookievalue-19", "Cookie: "),
    ("Set-Cookie: sid=cookievalue-20; Path=/; HttpOnly", "cookievalue-20", "Set-Cookie: "),
    (
        "cloned with hf_abcdefghijklmnopqrstuvwxyzABCDEF",
        "hf_abcdefghijklmnopqrstuvwxyzABCDEF",
        "cloned with ",
    ),
    (
        "git remote: ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "git remote: ",
    ),
    ("id eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJqb2IifQ.c2lnbmF0dXJl end", "c2lnbmF0dXJl", "id "),
    ("Authorization: Bearer bearervalue-24 (retrying)", "bearervalue-24", "Authorization: "),
    ("https://deploy:urlvalue-25@pypi.corp.example/simple", "urlvalue-25", "@pypi.corp.example/simple"),
    (
        "https://oauth2accesstoken@europe-python.pkg.dev/p/r/simple",
        "oauth2accesstoken",
        "@europe-python.pkg.dev",
    ),
    ("RAY_AUTH_TOKEN=rayvalue-27", "rayvalue-27", "RAY_AUTH_TOKEN="),
    ('{"credentials": "deploy:credvalue-28"}', "credvalue-28", '"credentials": '),
    ('{"Authorization": ["Bearer listvalue-29"]}', "listvalue-29", '"Authorization": ["'),
]


@pytest.mark.parametrize(("line", "secret", "kept"), FORMS, ids=[secret for _, secret, _ in FORMS])
def test_every_known_form_loses_its_value_and_keeps_its_name(line, secret, kept):
    clean = redact(line)
    assert secret not in clean and REDACTED in clean and kept in clean, clean


@pytest.mark.parametrize(("line", "secret", "kept"), FORMS, ids=[secret for _, secret, _ in FORMS])
def test_a_secret_inside_a_json_encoded_line_goes_and_the_line_stays_json(line, secret, kept):
    """`rayslice run`'s journal writes each log line as a JSON string: the forms are escaped
    there (quotes as \\"), and what redaction leaves must still parse."""
    encoded = json.dumps({"t": 1.0, "line": line})
    clean = redact(encoded)
    assert secret not in clean, clean
    assert REDACTED in json.loads(clean)["line"] and kept in json.loads(clean)["line"]


@pytest.mark.parametrize(
    "line",
    [
        "step 120 loss 0.51234 tokens_per_sec=51234.5 max_tokens=4096",
        "tokenizer=gpt2 sort_keys=True num_keys: 12 monkeypatch=1",
        "GoogleAccessId=sa@p.iam.gserviceaccount.com&Expires=1765000000",
        "the password is checked by the server",
        "-----BEGIN CERTIFICATE-----\nMIIcert\n-----END CERTIFICATE-----",
        "python -m rayslice.workloads.jax_train --steps 20 --batch 8",
    ],
)
def test_what_is_no_secret_stays_as_written(line):
    assert redact(line) == line


def test_quotes_escaped_inside_a_value_do_not_end_it():
    assert redact(r'PASSWORD="a\"b c" rest') == f'PASSWORD="{REDACTED}" rest'
    encoded = json.dumps({"line": 'HF_TOKEN="x\\"y" next'})  # JSON inside JSON
    clean = redact(encoded)
    assert json.loads(clean)["line"] == f'HF_TOKEN="{REDACTED}" next'


KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIEkeyline1\nkeyline2xyz\n-----END RSA PRIVATE KEY-----\n"


def test_a_private_key_goes_from_begin_to_end_and_what_follows_stays():
    assert redact(f"before\n{KEY}after\n") == f"before\n{REDACTED}\nafter\n"
    escaped = json.dumps({"type": "service_account", "private_key": KEY, "client_email": "a@b"})
    clean = json.loads(redact(escaped))
    assert clean["private_key"] == REDACTED and clean["client_email"] == "a@b"


@pytest.mark.parametrize("cut", range(1, KEY.count("\n")))
def test_a_key_cut_in_two_at_any_line_is_removed_from_both_halves(cut):
    """A BEGIN without its END goes to the end of its text; an END without its BEGIN from the
    start: whoever split the text (a shipping pass, a journal flush), neither half keeps any of
    the key."""
    lines = f"log a\n{KEY}log b\n".splitlines(keepends=True)
    first, second = "".join(lines[: cut + 1]), "".join(lines[cut + 1 :])
    shipped = redact(first) + redact(second)
    for part in ("MIIEkeyline1", "keyline2xyz"):
        assert part not in shipped
    assert shipped.startswith("log a\n") and shipped.endswith("log b\n")


def test_a_log_is_held_back_from_a_begin_whose_end_has_not_come():
    head = b"ray started\n"
    begin = b"-----BEGIN PRIVATE KEY-----\nMIIE\n"
    assert shippable(head + begin) == len(head)  # up to the BEGIN's line; the rest waits
    assert shippable(begin) == 0
    whole = head + begin + b"-----END PRIVATE KEY-----\nnext\n"
    assert shippable(whole) == len(whole)
    assert shippable(head + begin, final=True) == len(head + begin)  # the last pass ships all
    # A BEGIN that never ends does not stop the log for ever: past the bound it ships, cut at a line.
    filler = b"x" * 99 + b"\n"
    long = head + begin + filler * (PEM_HOLD_BYTES // len(filler) + 10)
    cut = shippable(long)
    assert len(head) + PEM_HOLD_BYTES <= cut < len(long) and long[cut - 1 : cut] == b"\n"
    assert shippable(b"-----END PRIVATE KEY-----\n" + head) == len(head) + 26  # an END alone: no hold
