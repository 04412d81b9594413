"""Hostile input through the CLI, key by key: issue 43's audit of 252 values, run again as a test.

Every stack key gets hostile strings, numbers and structures, written into a stack file as the
YAML text a careless user (or whoever can edit the file) writes; the CIDR keys get hostile
ranges, and the file itself hostile contents. `rayslice validate` must then either

- refuse the value: exit 2, exactly one line on stderr, bounded in length, naming the key; or
- accept it harmlessly: it read what `pulumi up` reads (the Pulumi CLI hands the program each
  scalar's text as written, a list or mapping as JSON: pulumi/pulumi
  sdk/go/common/resource/config/value.go, `unmarshalValue`, which asks gopkg.in/yaml for a string
  first, and yaml's decoder gives a string target the scalar's text), every rendered boot script
  passes `bash -n` and holds each string the user gave only shell-quoted, and a CIDR it accepts
  is as narrow as the key's rule says.
"""

from __future__ import annotations

import ipaddress
import json
import resource
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rayslice import cli, spec
from rayslice.errors import InvalidInput
from rayslice.startup_scripts import render
from rayslice.startup_scripts.controller import render_controller
from rayslice.startup_scripts.pod import render_pod_start
from tests.conftest import REPO

# What a key needs beside it to apply at all (so the value is judged, not "applies to X only").
TPU_VM = {"platform": "tpu-vm", "acceleratorType": "v5litepod-8", "zone": "us-central1-a"}
ELASTIC = {"slices": "2", "minSlices": "1"}
GKE = {"platform": "gke"}
CONTEXT: dict[str, dict[str, str]] = {
    "minSlices": {"slices": "2"},
    "idleTimeoutSeconds": ELASTIC,
    "maxUsdPerHour": ELASTIC,
    "maxRunHours": {"capacity": "flex-start", "zone": "us-east5-a"},  # a flex-start zone of v6e
    "queued": TPU_VM,
    "queueDeadlineHours": {**TPU_VM, "queued": "true"},
    "runtimeVersion": TPU_VM,
    "reservation": {"capacity": "reserved"},
    "subnetwork": {"network": "vpc"},
    "packageIndexCredentialsSecret": {"packageIndex": "https://idx.example/simple"},
    "allowInsecurePackageIndex": {"packageIndex": "http://idx.example/simple"},
    "allowWideDashboardRanges": {"dashboardSourceRanges": '["34.0.0.0/8", "35.0.0.0/8"]'},
    "dashboardSourceRanges": {"rayAuth": "none"},
    "gkeCluster": GKE,
    "gkeAuthorizedNetworks": GKE,
    "allowWideGkeAuthorizedNetworks": {**GKE, "gkeAuthorizedNetworks": '["34.0.0.0/8", "35.0.0.0/8"]'},
    "kuberay": GKE,
}
BASE = {"zone": "us-east5-b"}

# Strings: each written as a double-quoted YAML scalar (JSON's escapes are YAML's), so the text
# Pulumi hands over is the string itself.
STRINGS: dict[str, str] = {
    "command substitution": "$(touch /tmp/rayslice-pwned)",
    "backticks": "`id`",
    "semicolon": "a;id",
    "pipe and ampersand": "a|b&c",
    "quotes": "a'b\"c",
    "space": "a b",
    "newline": "a\nb",
    "carriage return": "a\rb",
    "NUL": "a\x00b",
    "escape sequence": "\x1b[31mred",
    "zero-width space": "ray\u200bslice",
    "right-to-left override": "a\u202eb",
    "Cyrillic confusable": "r\u0430yslice",
    "fullwidth digits": "\uff11\uff10",
    "Arabic-Indic digit": "\u0662",
    "path traversal": "../../etc/passwd",
    "absolute path": "/etc/shadow",
    "option-like": "--help",
    "glob": "*",
    "empty": "",
    "URL with shell characters": "https://idx.example/a&b(c)*!",
    "marker with quotes": "optax; python_version < \"3.12\" and sys_platform == 'linux'",
    "long, under the cap": "a" * 4000,
    "very long": "a" * 5000,
}
# Scalars written bare: (YAML text, the text Pulumi hands the program).
NUMBERS: dict[str, tuple[str, str]] = {
    "negative": ("-1", "-1"),
    "zero": ("0", "0"),
    "negative zero": ("-0", "-0"),
    "huge": ("9" * 40, "9" * 40),
    "over 4,300 digits": ("9" * 4400, "9" * 4400),
    "float": ("1.5", "1.5"),
    "exponent": ("1e3", "1e3"),
    "octal-looking": ("010", "010"),
    "leading zeros": ("0200", "0200"),
    "YAML 1.2 octal": ("0o17", "0o17"),
    "hex": ("0x10", "0x10"),
    "binary": ("0b11", "0b11"),
    "underscores": ("1_000", "1_000"),
    "sexagesimal": ("1:30", "1:30"),
    "infinity": (".inf", ".inf"),
    "not a number": (".nan", ".nan"),
    "yes": ("yes", "yes"),
    "on": ("on", "on"),
    "true": ("true", "true"),
    "null": ("~", ""),
    "plus sign": ("+5", "+5"),
    "date": ("2001-01-01", "2001-01-01"),
    "quoted with a space": ('" 5"', " 5"),
}
STRUCTURES: dict[str, str] = {
    "list": "[x]",
    "mapping": "{x: y}",
    "list of lists": "[[x]]",
    "mapping of numbers": "{x: 010}",
}


def _everything_but(address: str) -> list[str]:
    whole = ipaddress.ip_network("0.0.0.0/0" if ":" not in address else "::/0")
    return [str(n) for n in whole.address_exclude(ipaddress.ip_network(address))]  # type: ignore[arg-type]


CIDRS: dict[str, list[str]] = {
    "whole IPv4": ["0.0.0.0/0"],
    "half of IPv4": ["0.0.0.0/1"],
    "both halves": ["0.0.0.0/1", "128.0.0.0/1"],
    "everything but one address": _everything_but("1.2.3.4/32"),
    "whole IPv6": ["::/0"],
    "Teredo": ["2001::/32"],
    "IETF protocol assignments": ["2001::/23"],
    "6to4": ["2002::/16"],
    "IPv4-mapped public": ["::ffff:8.8.8.0/120"],
    "IPv4-mapped whole": ["::ffff:0:0/96"],
    "IPv4-mapped halves": ["::ffff:0:0/97", "::ffff:128.0.0.0/97"],
    "IPv4-mapped private": ["::ffff:10.0.0.0/104"],
    "documentation range": ["192.0.2.0/24"],
    "link-local": ["169.254.0.0/16"],
    "private": ["10.0.0.0/8", "192.168.0.0/16"],
    "shared address space": ["100.64.0.0/10"],
    "unique local": ["fd00::/8"],
    "one public /24": ["34.1.2.0/24"],
    "host bits set": ["10.0.0.1/8"],
    "prefix too long": ["10.0.0.0/33"],
    "not an address": ["localhost"],
    "leading space": [" 10.0.0.0/8"],
    "scoped": ["fe80::1%eth0/64"],
}
CIDR_KEYS = ("dashboardSourceRanges", "gkeAuthorizedNetworks")

# The test's own list of ranges that never reach the internet (RFC 1918, RFC 6598, RFC 4193,
# loopback), to judge what the spec accepts with rayAuth=none.
INTERNAL = [
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8")
] + [ipaddress.ip_network(n) for n in ("fc00::/7", "::1/128")]
MAPPED = ipaddress.ip_network("::ffff:0:0/96")


def _as_ipv4(net: Any) -> Any:
    if net.version == 6 and net.subnet_of(MAPPED):
        return ipaddress.ip_network((int(net.network_address) & 0xFFFFFFFF, net.prefixlen - 96))
    return net


def _internal(net: Any) -> bool:
    net = _as_ipv4(net)
    return any(net.version == i.version and net.subnet_of(i) for i in INTERNAL)


def _public_cover(ranges: tuple[str, ...], version: int) -> int:
    nets = [_as_ipv4(ipaddress.ip_network(r, strict=False)) for r in ranges]
    public = [n for n in nets if n.version == version and not _internal(n)]
    return sum(n.num_addresses for n in ipaddress.collapse_addresses(public))


def _values(key: str) -> dict[str, tuple[str, str | None]]:
    """Every hostile value for `key`: name -> (YAML text, the text Pulumi hands the program, or
    None for a list or mapping, which Pulumi hands over as JSON)."""
    values: dict[str, tuple[str, str | None]] = {
        name: (json.dumps(value, ensure_ascii=False), value) for name, value in STRINGS.items()
    }
    values.update({name: (text, pulumi) for name, (text, pulumi) in NUMBERS.items()})
    values.update({name: (text, None) for name, text in STRUCTURES.items()})
    if key in CIDR_KEYS:
        values.update({f"CIDRs: {name}": (json.dumps(ranges), None) for name, ranges in CIDRS.items()})
    return values


def _stack_file(path: Path, values: dict[str, str]) -> Path:
    lines = ["config:"] + [f"  rayslice:{key}: {text}" for key, text in values.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _validate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["validate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _assert_one_line_refusal(code: int, err: str, *named: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert err.startswith("rayslice: ") and err.endswith("\n") and err.count("\n") == 1, err[:2000]
    assert len(err) < 1500, f"{len(err)} characters: {err[:300]}..."
    assert any(n in err for n in named), err


def _scripts(cluster: spec.ClusterSpec) -> list[str]:
    scripts = [render(cluster)]
    if cluster.runs_recovery:
        scripts.append(render_controller(cluster))
    if cluster.platform == "gke":
        scripts.append(render_pod_start(cluster))
    return scripts


def _user_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in _user_strings(item)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_user_strings(k), *_user_strings(v))]
    return []


def _assert_harmless(cluster: spec.ClusterSpec, key: str) -> None:
    """Every string the user gave reaches every boot script only shell-quoted, and the scripts
    parse."""
    field = next(k.field for k in spec.KEYS if k.name == key)
    given = _user_strings(getattr(cluster, field))
    for script in _scripts(cluster):
        checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        assert checked.returncode == 0, checked.stderr
        for text in given:
            quoted = shlex.quote(text)
            if quoted != text:  # each occurrence lies within a quoted one
                inside = script.count(quoted) * quoted.count(text)
                assert script.count(text) == inside, f"{text!r} appears unquoted"


@pytest.mark.parametrize("key", sorted(spec.KEY_NAMES))
def test_hostile_values_are_refused_in_one_line_or_harmless(tmp_path, capsys, key):
    """Each value of `_values(key)` in turn; the failures of all of them are listed together."""
    failures = []
    for name, (text, pulumi) in _values(key).items():
        try:
            _judge(tmp_path / "Pulumi.s.yaml", capsys, key, text, pulumi)
        except Exception as failure:  # a traceback is a finding too: listed with the others
            failures.append(f"{key}: {name}: {type(failure).__name__}: {str(failure)[:500]}")
    assert not failures, "\n".join(failures)


def _judge(path: Path, capsys: pytest.CaptureFixture[str], key: str, text: str, pulumi: str | None) -> None:
    context = {**BASE, **CONTEXT.get(key, {})}
    context.pop(key, None)
    code, _, err = _validate(capsys, "--stack-file", str(_stack_file(path, {**context, key: text})))
    if code != 0:
        _assert_one_line_refusal(code, err, key, "stack file")
    deployed: spec.ClusterSpec | None = None
    if pulumi is not None:
        # What `pulumi up` reads: the program gets every scalar as text, and the spec reads it.
        try:
            deployed = spec.load({**context, key: pulumi})
        except InvalidInput:
            deployed = None
        assert (code == 0) == (deployed is not None), f"validate exits {code}, pulumi up reads {deployed}"
    if code != 0:
        return
    cluster = spec.load_cli(str(path), [])
    if pulumi is not None:
        assert cluster == deployed, "validate reads another value than pulumi up deploys"
    if key == "dashboardSourceRanges":  # with rayAuth=none (CONTEXT): internal ranges only
        nets = [ipaddress.ip_network(r, strict=False) for r in cluster.dashboard_source_ranges]
        assert all(_internal(n) for n in nets), nets
    if key == "gkeAuthorizedNetworks":  # public ranges together at most a /8 (a /32 of IPv6)
        ranges = cluster.gke_authorized_networks
        assert _public_cover(ranges, 4) <= 2**24 and _public_cover(ranges, 6) <= 2**96, ranges
    _assert_harmless(cluster, key)


# ---- the stack file itself -------------------------------------------------------------------


def _alias_bomb() -> str:
    lines = ["config:", "  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join([*lines, "  rayslice:labels: {team: *a8}"]) + "\n"


FILES: dict[str, bytes] = {
    "not UTF-8": b"config:\n  rayslice:name: \xff\xfe\n",
    "UTF-16 with its byte order mark": "config:\n  rayslice:name: ray\n".encode("utf-16"),
    "NUL byte": b"config:\n  rayslice:name: a\x00b\n",
    "integer of 4,400 digits": b"config:\n  rayslice:slices: " + b"9" * 4400 + b"\n",
    "integer of 4,400 digits in a mapping": b"config:\n  rayslice:labels: {a: " + b"9" * 4400 + b"}\n",
    "date out of range in a list": b"config:\n  rayslice:requirements: [0000-01-01]\n",
    "2 MiB": b"config:\n  rayslice:name: " + b"a" * (2 << 20) + b"\n",
    "deep nesting": b"config:\n  rayslice:labels: " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "alias bomb": _alias_bomb().encode(),
    "a list, not a mapping": b"- config\n",
    "config is a list": b"config: [a]\n",
    "a mapping as a key": b"config:\n  {a: b}: c\n",
    "unclosed bracket": b"config:\n  rayslice:labels: [\n",
    "tab indentation": b"config:\n\trayslice:name: a\n",
    "40,000 unknown keys": ("config:\n" + "".join(f"  rayslice:k{i}: 1\n" for i in range(40_000))).encode(),
    "an unknown key with an escape sequence": b'config:\n  "rayslice:\\e[2J": 1\n',
    "a name of 1 MB": b"config:\n  rayslice:name: " + b"a" * 1_000_000 + b"\n",
    "binary garbage": bytes(range(256)) * 4,
}


@pytest.mark.parametrize("contents", FILES.values(), ids=list(FILES))
def test_hostile_stack_file_is_refused_in_one_line(tmp_path, capsys, contents):
    path = tmp_path / "Pulumi.s.yaml"
    path.write_bytes(contents)
    code, _, err = _validate(capsys, "--stack-file", str(path), "--set", "zone=us-east5-b")
    _assert_one_line_refusal(code, err, "stack file", "rayslice:", "unknown config key", "name")


def test_a_byte_order_mark_is_dropped_as_pulumi_drops_it(tmp_path, capsys):
    path = tmp_path / "Pulumi.s.yaml"
    path.write_bytes(b"\xef\xbb\xbfconfig:\n  rayslice:slices: 2\n  rayslice:zone: us-east5-b\n")
    code, out, err = _validate(capsys, "--stack-file", str(path))
    assert code == 0, err
    assert out.startswith("valid: 2 x v6e-16")


def _limited() -> None:
    """A child's memory, capped so that reading without bound fails fast instead of swapping."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_dev_zero_as_the_stack_file_is_refused_in_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "rayslice", "validate", "--stack-file", "/dev/zero"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limited,
        cwd=REPO,
    )
    _assert_one_line_refusal(result.returncode, result.stderr, "/dev/zero")
    assert "larger than 1 MiB" in result.stderr


# ---- numbers that used to pass validate and crash preview (issue 43, L4) ------------------------

HUGE = "9" * 400


@pytest.mark.parametrize(
    "overrides",
    [
        ["slices=2", "minSlices=1", f"idleTimeoutSeconds={HUGE}"],
        ["slices=2", "minSlices=1", f"maxUsdPerHour={HUGE}"],
        [*(f"{k}={v}" for k, v in TPU_VM.items()), "queued=true", f"queueDeadlineHours={HUGE}"],
    ],
    ids=["idleTimeoutSeconds", "maxUsdPerHour", "queueDeadlineHours"],
)
def test_huge_numbers_are_refused_before_preview_runs_the_program(capsys, overrides):
    args = ["preview", "--set", "zone=us-east5-b"]
    for pair in overrides:
        args += ["--set", pair]
    code = cli.main(args)
    _, err = capsys.readouterr()
    _assert_one_line_refusal(code, err, "is out of range")


def _largest(name: str) -> str:
    key = next(k for k in spec.KEYS if k.name == name)
    assert key.bounds is not None
    return f"{name}={key.bounds[1]}"


@pytest.mark.parametrize(
    "overrides",
    [
        ["zone=us-east5-b", *map(_largest, ("slices", "minSlices", "idleTimeoutSeconds", "maxUsdPerHour"))],
        [
            *(f"{k}={v}" for k, v in TPU_VM.items()),
            "queued=true",
            "capacity=flex-start",
            *map(_largest, ("queueDeadlineHours", "maxRunHours")),
        ],
    ],
    ids=["elastic", "queued flex-start"],
)
def test_the_largest_value_of_every_integer_key_previews(capsys, overrides):
    """The bounds are ones the program and the cost table work with, not merely ones that refuse."""
    args = ["preview"]
    for pair in overrides:
        args += ["--set", pair]
    assert cli.main(args) == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", [["catalog"], ["validate", "--set", "zone=us-east5-b", "--set"]])
def test_a_5000_digit_accelerator_size_is_refused_in_one_line(capsys, command):
    name = "v6e-" + "1" * 5000
    argument = f"acceleratorType={name}" if command[-1] == "--set" else name
    code = cli.main([*command, argument])
    _, err = capsys.readouterr()
    _assert_one_line_refusal(code, err, "acceleratorType", "unknown accelerator type")


def test_every_integer_key_has_bounds_and_the_ceiling_binds():
    """Every number a user gives is bounded; the price ceiling's bound is above the dearest
    cluster the catalog can price, so no real ceiling is refused."""
    from rayslice import catalog

    for key in spec.KEYS:
        if key.type == "integer":
            assert key.bounds is not None, key.name
    dearest = max(
        price
        for platform in catalog.PLATFORMS
        for tpu in catalog.table(platform).values()
        for by_capacity in catalog.slice_prices(tpu).values()
        for price in by_capacity.values()
        if price is not None
    )
    usd = next(k for k in spec.KEYS if k.name == "maxUsdPerHour")
    slices = next(k for k in spec.KEYS if k.name == "slices")
    assert usd.bounds is not None and slices.bounds is not None
    assert usd.bounds[1] >= dearest * slices.bounds[1]


# ---- one wrong value, one problem (issue 43, L10) ----------------------------------------------


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["slices=0", "minSlices=1"], "slices=0 is out of range"),
        ([*(f"{k}={v}" for k, v in TPU_VM.items()), "queued=yes", "queueDeadlineHours=3"], "queued"),
        ([*(f"{k}={v}" for k, v in TPU_VM.items()), "queued=yes", "capacity=flex-start"], "queued"),
        (["platform=aws", "gkeCluster=c"], "platform="),
        (["platform=gke", "name=" + "A" * 45], "name="),
        (
            [
                "packageIndex=https://i.example/\u200b",
                "packageIndexCredentialsSecret=s",
                "allowForeignPackageIndexSecret=true",
            ],
            "packageIndex",
        ),
        (["packageIndex=http://i.example/simple", "allowInsecurePackageIndex=yes"], "allowInsecure"),
        (["allowWideDashboardRanges=maybe", 'dashboardSourceRanges=["34.0.0.0/7"]'], "allowWide"),
        (["capacity=reserved", "reservation=Bad!"], "reservation="),
        (["network=Bad!", "subnetwork=sub"], "network="),
        (["minSlices=-1", "idleTimeoutSeconds=60"], "minSlices=-1 is out of range"),
    ],
)
def test_a_refused_key_hides_no_check_and_starts_no_cascade(capsys, overrides, named):
    args = ["--set", "zone=us-east5-b"]
    for pair in overrides:
        args += ["--set", pair]
    code, _, err = _validate(capsys, *args)
    _assert_one_line_refusal(code, err, named)
    assert "0 to -1" not in err


def test_the_known_keys_are_listed_once_and_the_unknown_ones_counted(tmp_path, capsys):
    keys = {**BASE, **{f"colour{i}": "1" for i in range(1000)}}
    code, _, err = _validate(capsys, "--stack-file", str(_stack_file(tmp_path / "Pulumi.s.yaml", keys)))
    _assert_one_line_refusal(code, err, "unknown config keys")
    assert err.count("known keys:") == 1 and "and 995 more" in err


def test_a_malformed_set_pair_is_echoed_bounded(capsys):
    code, _, err = _validate(capsys, "--set", "zone=us-east5-b", "--set", "x" * 100_000)
    _assert_one_line_refusal(code, err, "must look like KEY=VALUE")


def test_many_problems_are_listed_up_to_a_count_and_the_rest_counted(capsys):
    labels = json.dumps({f"Bad{i}": "x" for i in range(50)})
    code, _, err = _validate(capsys, "--set", "zone=us-east5-b", "--set", f"labels={labels}")
    assert code == 2 and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 + 20 + 1, err  # the heading, 20 problems, the count of the others
    assert lines[-1] == "  ... and 30 more problem(s): fix these first"
