"""The YAML and TypeScript examples, as a platform team writes them after `pulumi package add`.

Neither language runs here (no Pulumi CLI, no node_modules). Each example's TpuRayCluster is
checked against the checked-in schema: every property it sets exists and has the schema's type,
allowed value and plainness (a plain input takes no other resource's output). The YAML program
is then run the way the engine runs it: its VPC resources registered, the cluster constructed
by the provider process over gRPC. It must declare what the Python example of the same team
(examples/platform-team/) declares. The TypeScript program must pass the same inputs as the
YAML one; its object literal is read by a parser of the small subset of TypeScript it uses.
"""

from __future__ import annotations

import json
import re
import runpy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayslice.infra import provider
from tests.infra.provider import engine

EXAMPLES = engine.REPO / "examples"
YAML_PROGRAM = EXAMPLES / "yaml" / "Pulumi.yaml"
TS_PROGRAM = EXAMPLES / "typescript" / "index.ts"
PYTHON_PROGRAM = EXAMPLES / "platform-team"
SCHEMA = json.loads((engine.REPO / provider.SCHEMA_FILE).read_text())
COMPONENT = "rayslice:index:TpuRayCluster"
PROJECT = "my-gcp-project"


@dataclass(frozen=True)
class Config:
    """A config value in a program: known before anything is created, so fit for plain inputs."""

    key: str


# ---- checking a component's properties against the schema --------------------------------------


def problems(properties: dict[str, Any], spec: dict[str, Any], where: str = "") -> list[str]:
    """Every way `properties` breaks the schema's `spec` (a resource's inputs or an object type)."""
    found = []
    declared = spec.get("inputProperties", spec.get("properties", {}))
    required = spec.get("requiredInputs", spec.get("required", []))
    found += [f"{where}{name}: required, not set" for name in required if name not in properties]
    for name, value in properties.items():
        if name not in declared:
            found.append(f"{where}{name}: not in the schema")
        else:
            found += _value_problems(value, declared[name], f"{where}{name}")
    return found


_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,)}


def _value_problems(value: Any, prop: dict[str, Any], where: str) -> list[str]:
    if isinstance(value, engine.Ref):
        if prop.get("plain"):
            return [f"{where}: plain input, set from another resource's output"]
        return []  # an output of the right type is the program's language's business
    if isinstance(value, Config):
        value = "config value"  # Pulumi config values are strings
    ref = prop.get("$ref")
    if ref:
        target = SCHEMA["types"][ref.removeprefix("#/types/")]
        if "enum" in target:
            allowed = [member["value"] for member in target["enum"]]
            return [] if value in allowed else [f"{where}: {value!r} is not one of {allowed}"]
        if not isinstance(value, dict):
            return [f"{where}: an object wanted, got {value!r}"]
        return problems(value, target, f"{where}.")
    kind = prop["type"]
    if kind == "array":
        if not isinstance(value, list):
            return [f"{where}: an array wanted, got {value!r}"]
        return [p for i, v in enumerate(value) for p in _value_problems(v, prop["items"], f"{where}[{i}]")]
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{where}: an object wanted, got {value!r}"]
        items = prop["additionalProperties"]
        return [p for k, v in value.items() for p in _value_problems(v, items, f"{where}.{k}")]
    if (isinstance(value, bool) and kind != "boolean") or not isinstance(value, _TYPES[kind]):
        return [f"{where}: {kind} wanted, got {value!r}"]
    return []


def test_checker_finds_what_is_wrong():
    spec = SCHEMA["resources"][COMPONENT]
    assert problems({"acceleratorType": "v6e-16", "capacity": "spot", "slices": 2}, spec) == []
    assert problems(
        {
            "acceleratorTyp": "v6e-16",
            "capacity": "sometimes",
            "slices": "2",
            "queued": 1,
            "labels": {"team": 3},
            "zone": engine.Ref("vpc", "zone"),
            "existingNetwork": {"subnetwork": engine.Ref("subnet", "name")},
        },
        spec,
    ) == [
        "acceleratorTyp: not in the schema",
        "capacity: 'sometimes' is not one of ['on-demand', 'spot', 'reserved', 'flex-start']",
        "slices: integer wanted, got '2'",
        "queued: boolean wanted, got 1",
        "labels.team: string wanted, got 3",
        "zone: plain input, set from another resource's output",
        "existingNetwork.network: required, not set",
    ]


# ---- the YAML program --------------------------------------------------------------------------

_INTERPOLATION = re.compile(r"^\$\{([^}.]+)(?:\.([^}]+))?\}$")


def _yaml_value(value: Any, config: set[str]) -> Any:
    """A YAML property with its ``${...}`` as `engine.Ref` (a resource's output) or `Config`."""

    def read(leaf: Any) -> Any:
        match = _INTERPOLATION.match(leaf) if isinstance(leaf, str) else None
        if match is None:
            assert "${" not in str(leaf), f"{leaf}: an interpolation this test does not read"
            return leaf
        head, prop = match.groups()
        if prop is None:
            assert head in config, f"{leaf}: neither a config key nor a resource output"
            return Config(head)
        return engine.Ref(head, prop)

    return engine.transformed(value, read)


def _full_token(short: str) -> str:
    """``gcp:compute:Network`` as the engine expands it: ``gcp:compute/network:Network``."""
    package, module, name = short.split(":")
    if module == "index":
        return short
    return f"{package}:{module}/{name[0].lower()}{name[1:]}:{name}"


def _yaml_program() -> tuple[dict[str, Any], dict[str, tuple[str, Any]]]:
    program = yaml.safe_load(YAML_PROGRAM.read_text())
    config = set(program.get("config", {}))
    resources = {
        name: (_full_token(r["type"]), _yaml_value(r.get("properties", {}), config))
        for name, r in program["resources"].items()
    }
    return program, resources


def test_yaml_program_adds_this_package():
    program, _ = _yaml_program()
    assert program["runtime"] == "yaml"
    source = (YAML_PROGRAM.parent / program["packages"]["rayslice"]).resolve()
    assert source == engine.REPO and (source / "PulumiPlugin.yaml").is_file()


def test_yaml_program_sets_what_the_schema_declares():
    program, resources = _yaml_program()
    clusters = [props for token, props in resources.values() if token == COMPONENT]
    assert len(clusters) == 1
    assert problems(clusters[0], SCHEMA["resources"][COMPONENT]) == []
    outputs = SCHEMA["resources"][COMPONENT]["properties"]
    for expression in program["outputs"].values():
        head, prop = _INTERPOLATION.match(expression).groups()  # type: ignore[union-attr]
        assert resources[head][0] != COMPONENT or prop in outputs, expression


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with engine.provider(tmp_path_factory.mktemp("provider")) as running:
        yield running


def _config(value: Any) -> Any:
    """Config values as the stack sets them (`pulumi config set gcpProject my-gcp-project`)."""
    return engine.transformed(value, lambda leaf: PROJECT if isinstance(leaf, Config) else leaf)


def test_yaml_program_declares_what_the_python_program_declares(client):
    _, resources = _yaml_program()
    program = [
        engine.Declared(token, name, _config(props))
        for name, (token, props) in resources.items()
        if token != COMPONENT
    ]
    (name,) = [name for name, (token, _) in resources.items() if token == COMPONENT]
    constructed = engine.construct(client, COMPONENT, name, _config(resources[name][1]), program=program)
    assert constructed.error is None, constructed.error

    def python_program() -> None:
        runpy.run_path(str(PYTHON_PROGRAM), run_name="__main__")  # as Pulumi's Python host does

    registrations, fake, _ = engine.python_run(python_program, {"gcp:project": PROJECT})
    assert engine.declared(constructed.registrations, frozenset({COMPONENT})) == engine.declared(
        registrations
    )
    assert constructed.fake.twin.refused == [] and fake.twin.refused == []
    # The team's VPC, not one of rayslice's: four resources of the program, none of the cluster.
    networks = [r for r in constructed.registrations if r.type == "gcp:compute/network:Network"]
    assert [r.name for r in networks] == ["platform-vpc"]


# ---- the TypeScript program --------------------------------------------------------------------

_TS_TOKEN = re.compile(
    r"""\s*(?:(?P<comment>//[^\n]*)|(?P<string>"(?:[^"\\]|\\.)*")|(?P<number>-?\d+(?:\.\d+)?)"""
    r"""|(?P<name>[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*)|(?P<punct>[{}\[\]:,]))"""
)


class _Literal:
    """A reader of the TypeScript object literals the example passes: string, number and boolean
    literals, arrays, objects with plain keys, and names (a const, or a member of one)."""

    def __init__(self, text: str, names: dict[str, Any]) -> None:
        self.tokens = [
            (kind, value)
            for match in _TS_TOKEN.finditer(text)
            for kind, value in match.groupdict().items()
            if value is not None and kind != "comment"
        ]
        self.names = names
        self.at = 0

    def _next(self) -> tuple[str, str]:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def value(self) -> Any:
        kind, text = self._next()
        if kind == "string":
            return json.loads(text)
        if kind == "number":
            return float(text) if "." in text else int(text)
        if kind == "name":
            if text in ("true", "false"):
                return text == "true"
            head, _, member = text.partition(".")
            bound = self.names[head]  # KeyError: a name the example never declared
            return engine.Ref(bound, member) if member else bound
        if text == "[":
            items = []
            while self.tokens[self.at] != ("punct", "]"):
                items.append(self.value())
                if self.tokens[self.at] == ("punct", ","):
                    self.at += 1
            self.at += 1
            return items
        if text == "{":
            fields = {}
            while self.tokens[self.at] != ("punct", "}"):
                key_kind, key = self._next()
                assert key_kind in ("name", "string") and self._next() == ("punct", ":"), key
                fields[json.loads(key) if key_kind == "string" else key] = self.value()
                if self.tokens[self.at] == ("punct", ","):
                    self.at += 1
            self.at += 1
            return fields
        raise AssertionError(f"unexpected {text!r} in the example's object literal")


def _ts_program() -> tuple[str, dict[str, Any], list[str]]:
    """The cluster's name and inputs, and the outputs the program exports from it."""
    text = TS_PROGRAM.read_text()
    names: dict[str, Any] = {}
    for var, name in re.findall(r'const (\w+) = new [\w.]+\("([^"]+)"', text):
        names[var] = name  # a resource: its members are outputs
    for var, key in re.findall(r'const (\w+) = new pulumi\.Config\("\w+"\)\.require\("(\w+)"\)', text):
        names[var] = Config(key)
    for var, literal in re.findall(r'const (\w+) = ("[^"]*");', text):
        names[var] = json.loads(literal)
    (call,) = re.finditer(r'const (\w+) = new rayslice\.TpuRayCluster\("([^"]+)",', text)
    inputs = _Literal(text[call.end() :], names).value()
    exported = re.findall(rf"export const \w+ = {call.group(1)}\.(\w+);", text)
    return call.group(2), inputs, exported


def test_literal_reader_reads_the_subset():
    names = {"vpc": "platform-vpc", "project": Config("project")}
    text = '{ a: "x", "b": [1, 2.5], c: { d: true }, e: vpc.name, f: project, } // done'
    assert _Literal(text, names).value() == {
        "a": "x",
        "b": [1, 2.5],
        "c": {"d": True},
        "e": engine.Ref("platform-vpc", "name"),
        "f": Config("project"),
    }
    with pytest.raises(KeyError):
        _Literal("{ a: subnet.name }", names).value()


def test_typescript_program_sets_what_the_schema_declares():
    _, inputs, exported = _ts_program()
    spec = SCHEMA["resources"][COMPONENT]
    assert problems(inputs, spec) == []
    assert exported and all(name in spec["properties"] for name in exported)


def test_typescript_program_passes_what_the_yaml_program_passes():
    """The YAML program ran through Construct; the TypeScript one passes the same inputs (its
    config values apart: gcp:project there, the program's own key in YAML)."""
    name, inputs, exported = _ts_program()
    program, resources = _yaml_program()
    assert resources[name][0] == COMPONENT
    assert _config(inputs) == _config(resources[name][1])
    yaml_outputs = [_INTERPOLATION.match(e).group(2) for e in program["outputs"].values()]  # type: ignore[union-attr]
    assert exported == yaml_outputs
    packages = re.search(r"rayslice: (\S+)", (TS_PROGRAM.parent / "Pulumi.yaml").read_text())
    assert packages is not None and (TS_PROGRAM.parent / packages.group(1)).resolve() == engine.REPO


def test_examples_do_not_leave_a_file_unread():
    """Every file of the two examples is one this module reads or a manifest it names."""
    assert sorted(p.name for p in (EXAMPLES / "yaml").iterdir()) == ["Pulumi.yaml"]
    assert sorted(p.name for p in (EXAMPLES / "typescript").iterdir()) == [
        "Pulumi.yaml",
        "index.ts",
        "package.json",
        "tsconfig.json",
    ]
    package = json.loads((EXAMPLES / "typescript" / "package.json").read_text())
    assert package["dependencies"]["@pulumi/rayslice"] == "file:sdks/rayslice"
    assert Path(package["main"]).name == TS_PROGRAM.name
