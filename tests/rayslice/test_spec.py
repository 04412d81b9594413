"""ClusterSpec: defaults, coercion, and one test per validation error."""

from __future__ import annotations

import pytest

from rayslice import spec

BASE = {"acceleratorType": "v6e-16", "zone": "us-east5-b"}


def load(**overrides):
    return spec.load({**BASE, **overrides})


def problems(**overrides) -> list[str]:
    with pytest.raises(spec.SpecError) as err:
        load(**overrides)
    return err.value.problems


def test_defaults():
    s = load()
    assert s.accelerator_type == "v6e-16" and s.tpu.hosts == 4
    assert (s.platform, s.slices, s.head, s.preset, s.ray_auth, s.capacity) == (
        "tpu-vm",
        1,
        "slice",
        "jax",
        "token",
        "on-demand",
    )
    assert s.runtime_version == "v2-alpha-tpuv6e"
    assert s.external_ips is False
    assert s.ray_version == spec.DEFAULT_RAY_VERSION


def test_head_defaults_to_vm_for_several_slices():
    assert load(slices="2").head == "vm"


def test_strings_are_coerced_like_pulumi_config():
    s = load(slices="2", externalIps="true", labels='{"team": "ml"}', requirements='["optax>=0.2"]')
    assert (s.slices, s.external_ips, dict(s.labels), s.requirements) == (
        2,
        True,
        {"team": "ml"},
        ("optax>=0.2",),
    )


def test_unknown_accelerator_type_names_neighbours():
    [message] = problems(acceleratorType="v5p-7", zone="us-east5-a")
    assert "v5p-8, v5p-16, v5p-32" in message


def test_zone_without_the_generation_lists_zones():
    [message] = problems(zone="us-central2-b")
    assert "does not offer TPU v6e" in message and "us-east5-b" in message


def test_malformed_zone():
    [message] = problems(zone="moon-1")
    assert "not a GCP zone name" in message


def test_missing_zone_names_where_the_generation_is():
    with pytest.raises(spec.SpecError) as err:
        spec.load({"acceleratorType": "v5p-16"})
    assert err.value.problems == [
        "zone is not set: set rayslice:zone or gcp:zone (v5p is offered in us-central1-a, us-east5-a)"
    ]


def test_zone_is_optional_for_the_simulator():
    assert spec.load({"acceleratorType": "v6e-16"}, require_zone=False).zone == "us-central1-b"


def test_runtime_version_of_another_generation():
    [message] = problems(runtimeVersion="v2-alpha-tpuv5")
    assert "built for v5p, not v6e" in message and "v2-alpha-tpuv6e" in message


def test_runtime_version_on_gke_is_refused():
    [message] = problems(platform="gke", runtimeVersion="v2-alpha-tpuv6e")
    assert "TPU VM API only" in message


def test_multislice_on_a_generation_without_it():
    [message] = problems(acceleratorType="v3-32", zone="us-central1-a", slices="2")
    assert "v3 does not support multislice" in message


def test_slices_out_of_range():
    [message] = problems(slices="0")
    assert "out of range" in message


def test_tpu7x_on_tpu_vm_points_to_gke():
    [message] = problems(acceleratorType="tpu7x-16", zone="us-central1-c")
    assert "--platform gke" in message


def test_tpu7x_on_gke_is_valid():
    assert (
        load(platform="gke", acceleratorType="tpu7x-16", zone="us-central1-c").tpu.placement
        == "workload-policy"
    )


@pytest.mark.parametrize(
    "key, value",
    [
        ("name", "Rayslice"),
        ("name", "ray_slice"),
        ("name", "a" * 41),
        ("name", "x-"),
        ("network", "my net"),
        ("subnetwork", "$(touch /tmp/x)"),
        ("project", "p"),
    ],
)
def test_gcp_names(key, value):
    [message] = problems(**{key: value}, **({"network": "vpc"} if key == "subnetwork" else {}))
    assert key in message and repr(value) in message


@pytest.mark.parametrize(
    "labels",
    [
        {"Team": "ml"},
        {"team": "ML"},
        {"team": "a b"},
        {"team": "$(id)"},
        {"1team": "x"},
        {"t": "x" * 64},
    ],
)
def test_labels_break_gcp_rules(labels):
    [message] = problems(labels=labels)
    assert "GCP label rules" in message


@pytest.mark.parametrize("line", ["$(touch /tmp/x)", "foo bar", "numpy>>1", "`id`"])
def test_requirement_lines_must_be_pep508(line):
    [message] = problems(requirements=[line])
    assert "PEP 508" in message


def test_requirement_urls_are_refused():
    [message] = problems(requirements=["pkg @ https://example.invalid/pkg.whl"])
    assert "packageIndex" in message


def test_requirements_with_markers_are_kept_literally():
    line = 'requests; python_version < "3.12"'
    assert load(requirements=[line]).requirements == (line,)


@pytest.mark.parametrize("version", ["2.60", "latest", "2.60.0; rm -rf /", "v2.60.0"])
def test_malformed_ray_version(version):
    [message] = problems(rayVersion=version)
    assert "rayVersion" in message and "malformed" in message


@pytest.mark.parametrize(
    "key, value",
    [
        ("platform", "tpu-pod"),
        ("capacity", "cheap"),
        ("head", "laptop"),
        ("preset", "tf"),
        ("rayAuth", "disabled"),
        ("kuberay", "manual"),
    ],
)
def test_choices(key, value):
    [message] = problems(**{key: value})
    assert f"{key}={value!r} is not valid" in message


@pytest.mark.parametrize("key, value", [("slices", "two"), ("externalIps", "yes"), ("labels", "[1]")])
def test_types(key, value):
    [message] = problems(**{key: value})
    assert key in message


def test_dashboard_open_to_the_internet_is_refused():
    [message] = problems(dashboardSourceRanges=["0.0.0.0/0"])
    assert "internet" in message


def test_dashboard_range_must_be_cidr():
    [message] = problems(dashboardSourceRanges=["office"])
    assert "CIDR" in message


def test_package_index_must_be_a_plain_url():
    [message] = problems(packageIndex="https://x.invalid/simple'; id")
    assert "packageIndex" in message


def test_head_slice_with_several_slices():
    [message] = problems(slices="2", head="slice")
    assert "head=vm" in message


def test_reserved_on_gke_needs_a_reservation():
    [message] = problems(platform="gke", capacity="reserved")
    assert "reservation=" in message


def test_gke_keys_on_tpu_vm():
    [message] = problems(gkeCluster="prod")
    assert "platform=gke" in message


def test_subnetwork_needs_its_network():
    [problem] = problems(subnetwork="tpu-subnet")
    assert "set network to the VPC that holds this subnetwork too" in problem
    assert load(network="shared-vpc", subnetwork="tpu-subnet").subnetwork == "tpu-subnet"


@pytest.mark.parametrize("slices, longest_ok", [(1, 32), (10, 32), (11, 31)])
def test_gke_name_leaves_room_for_the_longest_node_pool(slices, longest_ok):
    """GKE allows 40 characters per node pool; "<name>-slice-<last index>" is the longest."""
    gke = {"platform": "gke", "slices": slices, "head": "vm"}
    assert len(load(**gke, name="a" * longest_ok).slice_name(slices - 1)) <= spec.GKE_NODE_POOL_NAME_MAX
    [problem] = problems(**gke, name="a" * (longest_ok + 1))
    assert f"shorten name to at most {longest_ok} characters" in problem
    assert load(name="a" * (longest_ok + 1), slices=slices, head="vm").name  # TPU VM names may be longer


@pytest.mark.parametrize("key", ["network", "subnetwork"])
def test_existing_gke_cluster_brings_its_own_network(key):
    extra = {"network": "shared-vpc"} if key == "subnetwork" else {}
    found = problems(platform="gke", gkeCluster="team", **extra, **{key: "x-net"})
    assert any(f"{key} is not used with gkeCluster" in p for p in found), found


def test_unknown_key_suggests_the_right_one():
    [message] = problems(acceleratortype="v6e-16")
    assert "did you mean 'acceleratorType'" in message


def test_every_problem_is_reported_at_once():
    found = problems(acceleratorType="v5p-7", slices="x", preset="tf", labels={"A": "b"})
    assert len(found) == 4


def test_as_config_round_trips():
    s = load(slices="2", labels={"team": "ml"}, requirements=["optax"])
    assert spec.load(s.as_config()) == s


def test_stack_file_with_gcp_fallbacks(tmp_path):
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(
        "config:\n  gcp:project: my-project-1\n  gcp:zone: us-east5-a\n"
        "  rayslice:acceleratorType: v5p-16\n  rayslice:labels:\n    team: ml\n"
        "  rayslice:requirements:\n    - optax>=0.2\n"
    )
    s = spec.load_cli(str(path), ["slices=2"])
    assert (s.project, s.zone, s.accelerator_type, s.slices, dict(s.labels), s.requirements) == (
        "my-project-1",
        "us-east5-a",
        "v5p-16",
        2,
        {"team": "ml"},
        ("optax>=0.2",),
    )


def test_stack_file_unknown_rayslice_key_is_reported(tmp_path):
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text("config:\n  rayslice:zones: us-east5-a\n")
    with pytest.raises(spec.SpecError, match="did you mean 'zone'"):
        spec.load_cli(str(path), [])


def test_stack_file_problems(tmp_path):
    with pytest.raises(spec.SpecError, match="cannot read stack file"):
        spec.read_stack_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("config: [\n")
    with pytest.raises(spec.SpecError, match="not valid YAML"):
        spec.read_stack_file(bad)


def test_override_syntax():
    with pytest.raises(spec.SpecError, match="KEY=VALUE"):
        spec.parse_overrides(["slices"])
    assert spec.parse_overrides(["rayslice:zone=us-east5-a"]) == {"zone": "us-east5-a"}
