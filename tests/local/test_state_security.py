"""The simulator trusts nothing it reads back (issue 14.2): a private state dir, 0600 secrets from
creation, a state file checked name by name before `down` acts on it, token auth unless insecure.
Nothing here creates a namespace; the root-only halves live in tests/integration/test_simulator.py."""

from __future__ import annotations

import ipaddress
import json
import os
import stat
from pathlib import Path

import pytest

from rayslice import spec
from rayslice.errors import SimulatorError
from rayslice.local.host import firewall, private_files
from rayslice.local.host.netns import in_netns
from rayslice.local.host.private_files import ensure_private_dir, write_private
from rayslice.local.host.processes import ProcessRef, process_ref
from rayslice.local.simulation import services, simulator
from rayslice.local.simulation.simulator import Simulation
from rayslice.local.simulation.state import (
    CLOUD_API_PROCESS,
    STATE_FILE,
    SimulationState,
    cloud_api_argv,
    make_plan,
)

NET = ipaddress.IPv4Network("100.64.9.0/24")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def open_umask():
    """Umask 000: modes must come from the code, not from a friendly umask."""
    old = os.umask(0)
    yield
    os.umask(old)


def test_state_dir_is_created_0700_and_secrets_0600_without_any_chmod(tmp_path, monkeypatch, open_umask):
    state_dir = ensure_private_dir(tmp_path / "a" / "sim")
    assert _mode(state_dir) == 0o700

    def no_chmod(*args, **kwargs):
        raise AssertionError("a secret must be created with its mode, never narrowed afterwards")

    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(os, "fchmod", no_chmod)
    monkeypatch.setattr(Path, "chmod", no_chmod)
    token = state_dir / "ray-token"
    write_private(token, "secret")
    assert _mode(token) == 0o600 and token.read_text() == "secret"
    write_private(token, "rotated")  # replaced atomically, still 0600
    assert _mode(token) == 0o600 and token.read_text() == "rotated"
    assert sorted(p.name for p in state_dir.iterdir()) == ["ray-token"], "no temp file left behind"


def test_an_existing_dir_of_ours_is_narrowed_to_0700(tmp_path):
    loose = tmp_path / "sim"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    ensure_private_dir(loose)
    assert _mode(loose) == 0o700


def test_a_non_private_dir_with_other_files_is_refused_not_narrowed(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o755)
    (project / "notes.txt").write_text("mine")
    with pytest.raises(SimulatorError, match="new or empty directory"):
        ensure_private_dir(project)
    assert _mode(project) == 0o755


def test_a_symlinked_state_dir_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "sim"
    link.symlink_to(target)
    with pytest.raises(SimulatorError, match="symlink"):
        ensure_private_dir(link)
    with pytest.raises(SimulatorError, match="symlink"):
        Simulation.open(link)


def test_a_state_dir_writable_by_others_is_refused(tmp_path):
    loose = tmp_path / "sim"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(SimulatorError, match="writable by group or others"):
        ensure_private_dir(loose)
    assert _mode(loose) == 0o777, "a refused dir is left as it was"


def test_a_state_dir_owned_by_someone_else_is_refused(tmp_path, monkeypatch):
    foreign = tmp_path / "sim"
    foreign.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(foreign, 65534, 65534)  # nobody's
    else:  # we own it; pretend to be another (non-root) user
        monkeypatch.setattr(private_files.os, "geteuid", lambda: os.getuid() + 4242)
    with pytest.raises(SimulatorError, match="owned by uid"):
        ensure_private_dir(foreign)


# ---- a tampered state file ------------------------------------------------------------------------


def _saved_state(state_dir: Path) -> dict:
    """A state file as `Simulation.create` writes it (tpu-vm v6e-16 with a head VM), as JSON."""
    cluster = spec.load({"platform": "tpu-vm", "acceleratorType": "v6e-16", "head": "vm"}, require_zone=False)
    plan = make_plan(cluster, run_id="a1b2c3", network=NET)
    ensure_private_dir(state_dir)
    worker = plan.hosts[1].name
    SimulationState(
        plan=plan,
        state_dir=str(state_dir),
        processes={
            f"boot:{worker}": ProcessRef(4321, 99),
            f"metadata:{worker}": ProcessRef(4322, 99),
            CLOUD_API_PROCESS: ProcessRef(4323, 99),
        },
        shared_paths=("/opt/venv",),
        firewall="nft",
    ).save()
    return json.loads((state_dir / STATE_FILE).read_text())


def _host(raw: dict, **changes) -> None:
    raw["plan"]["hosts"][1].update(changes)


TAMPERINGS = {
    "state dir elsewhere": lambda raw, victim: raw.update(state_dir=str(victim)),
    "host name ../../": lambda raw, victim: _host(raw, name="../../victim"),
    "netns ../../": lambda raw, victim: _host(raw, netns="../../victim"),
    "netns of another tool": lambda raw, victim: _host(raw, netns="docker-ns"),
    "veth not ours": lambda raw, victim: _host(raw, veth="eth0"),
    "bridge not ours": lambda raw, victim: raw["plan"].update(bridge="docker0"),
    "root outside": lambda raw, victim: raw["plan"].update(root=str(victim)),
    "run id ../": lambda raw, victim: raw["plan"].update(run_id="../x"),
    "process of no host": lambda raw, victim: raw["processes"].update(
        {"boot:../../x": {"pid": 1, "start_time": 1}}
    ),
    "process pid 1": lambda raw, victim: raw["processes"].update(
        {f"boot:{raw['plan']['hosts'][1]['name']}": {"pid": 1, "start_time": 1}}
    ),
    "cloud api with a host": lambda raw, victim: raw["processes"].update(
        {f"{CLOUD_API_PROCESS}:{raw['plan']['hosts'][1]['name']}": {"pid": 4324, "start_time": 1}}
    ),
    "another root process kind": lambda raw, victim: raw["processes"].update(
        {"cloud-api-x": {"pid": 4324, "start_time": 1}}
    ),
    "cloud api key prefix": lambda raw, victim: raw["processes"].update(
        {"cloud": {"pid": 4324, "start_time": 1}}
    ),
    "process of another kind": lambda raw, victim: raw["processes"].update(
        {f"recovery:{raw['plan']['hosts'][0]['name']}": {"pid": 4326, "start_time": 1}}
    ),
    "cloud api pid 1": lambda raw, victim: raw["processes"].update(
        {CLOUD_API_PROCESS: {"pid": 1, "start_time": 1}}
    ),
    "shared path ..": lambda raw, victim: raw.update(shared_paths=["/opt/../etc"]),
    "firewall command": lambda raw, victim: raw.update(firewall="rm -rf /"),
    "not a state file": lambda raw, victim: raw.update(plan={"surprise": True}),
}


@pytest.mark.parametrize("tamper", TAMPERINGS.values(), ids=TAMPERINGS.keys())
def test_a_tampered_state_file_is_refused_and_nothing_is_deleted(tmp_path, tamper):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    state_dir = tmp_path / "sim"
    raw = _saved_state(state_dir)
    Simulation.open(state_dir)  # untampered: accepted
    tamper(raw, victim)
    write_private(state_dir / STATE_FILE, json.dumps(raw))
    with pytest.raises(SimulatorError, match="nothing was touched"):
        Simulation.open(state_dir)
    assert (victim / "precious").read_text() == "keep me"
    assert (state_dir / STATE_FILE).exists()


def test_a_moved_state_dir_is_refused(tmp_path):
    _saved_state(tmp_path / "sim")
    (tmp_path / "sim").rename(tmp_path / "moved")
    with pytest.raises(SimulatorError, match="names state dir"):
        Simulation.open(tmp_path / "moved")


def test_a_state_file_that_is_a_symlink_or_writable_by_others_is_refused(tmp_path):
    state_dir = tmp_path / "sim"
    raw = _saved_state(state_dir)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(raw))
    (state_dir / STATE_FILE).unlink()
    (state_dir / STATE_FILE).symlink_to(elsewhere)
    with pytest.raises(SimulatorError, match="symlink"):
        Simulation.open(state_dir)
    (state_dir / STATE_FILE).unlink()
    write_private(state_dir / STATE_FILE, json.dumps(raw))
    (state_dir / STATE_FILE).chmod(0o666)
    with pytest.raises(SimulatorError, match="writable by group or others"):
        Simulation.open(state_dir)


def test_a_state_dir_the_caller_cannot_read_says_whose_it_is(tmp_path, monkeypatch):
    _saved_state(tmp_path / "sim")
    monkeypatch.setattr(simulator.os, "access", lambda path, mode: False)  # as another, non-root user
    with pytest.raises(SimulatorError, match=f"private to uid {os.geteuid()} .*sudo"):
        Simulation.open(tmp_path / "sim")


def test_a_recorded_pid_outside_the_hosts_namespace_is_not_ours():
    assert not in_netns(os.getpid(), "rsl-a1b2c3-no-such-host")
    assert not in_netns(2**22 + 7, "rsl-a1b2c3-no-such-host")  # no such process


# ---- token auth unless insecure; the packet filter ---------------------------------------------


def test_rayauth_none_needs_insecure_and_insecure_turns_token_auth_off(tmp_path, monkeypatch):
    monkeypatch.setattr(simulator, "require_root", lambda: None)
    open_cluster = spec.load({"platform": "tpu-vm", "rayAuth": "none"}, require_zone=False)
    with pytest.raises(SimulatorError, match="--insecure"):
        Simulation.create(open_cluster, tmp_path / "sim")
    assert not (tmp_path / "sim").exists(), "refused before anything was created"
    token_cluster = spec.load({"platform": "tpu-vm"}, require_zone=False)
    assert token_cluster.ray_auth == "token"
    assert simulator._auth_spec(token_cluster, insecure=False) is token_cluster
    insecure = simulator._auth_spec(token_cluster, insecure=True)
    assert insecure.ray_auth == "none"
    assert insecure.as_config() == {**token_cluster.as_config(), "rayAuth": "none"}  # nothing else changes


def test_insecure_without_a_packet_filter_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(simulator, "require_root", lambda: None)
    monkeypatch.setattr(firewall, "available_backend", lambda: firewall.NONE)
    with pytest.raises(SimulatorError, match="nftables"):
        Simulation.create(
            spec.load({"platform": "tpu-vm"}, require_zone=False), tmp_path / "sim", insecure=True
        )
    assert not (tmp_path / "sim").exists()


def test_the_nft_table_drops_non_root_traffic_to_the_bridge_only():
    rules = firewall.nft_ruleset("a1b2c3", "100.64.9.0/24")
    assert rules.startswith("table inet rsla1b2c3 {")
    assert 'oifname "rsla1b2c3" meta skuid != 0 drop' in rules
    assert "ip daddr 100.64.9.0/24 meta skuid != 0 drop" in rules
    assert 'oifname "rsla1b2c3" iifname != "rsla1b2c3" drop' in rules
    assert rules.count("drop") == 4 and "policy drop" not in rules  # nothing else on the machine changes
    assert rules.count("policy accept") == 3
    iptables = firewall.iptables_rules("a1b2c3", "100.64.9.0/24")
    assert all("rayslice simulation a1b2c3" in rule for rule in iptables)
    assert all(rule[-2:] == ["-j", "DROP"] for rule in iptables if rule[1] != "INPUT")
    with pytest.raises(SimulatorError, match="six hex digits"):
        firewall.nft_ruleset("x; flush ruleset", "100.64.9.0/24")


def _owner_matches(rule: list[str], uid: int) -> bool:
    """Whether an iptables rule's owner match (if it has one) matches a socket of `uid`."""
    if "--uid-owner" not in rule:
        return True
    at = rule.index("--uid-owner")
    return (uid == int(rule[at + 1])) != (rule[at - 1] == "!")


@pytest.mark.parametrize("uid, dropped", [(0, False), (1000, True), (65534, True)])
def test_the_iptables_rules_drop_non_root_traffic_to_the_bridge_only(uid, dropped):
    output = [r for r in firewall.iptables_rules("a1b2c3", "100.64.9.0/24") if r[1] == "OUTPUT"]
    assert {r[0] for r in output} == {"iptables", "ip6tables"}
    assert all(r[-2:] == ["-j", "DROP"] for r in output)
    assert [_owner_matches(r, uid) for r in output] == [dropped] * len(output)


def _input_verdicts(rules: list[list[str]], source: str, *, reply: bool) -> list[str]:
    """The INPUT verdicts of the iptables rules, in order, for a packet from the bridge."""
    verdicts = []
    for rule in (r for r in rules if r[:2] == ["iptables", "INPUT"]):
        assert rule[rule.index("-i") + 1] == "rsla1b2c3"
        if "--ctstate" in rule:
            state = rule[rule.index("--ctstate") + 1]
            if (state == "NEW") == reply:
                continue
        if "-s" in rule and rule[rule.index("-s") + 1] != source:
            continue
        verdicts.append(rule[-1])
    return verdicts


def test_a_host_reaches_the_machine_only_with_replies_or_as_the_admitted_controller():
    nft = firewall.nft_ruleset("a1b2c3", "100.64.9.0/24", ["100.64.9.2"])
    chain = nft[nft.index("chain input") :]
    replies = chain.index('iifname "rsla1b2c3" ct state established,related accept')
    admitted = chain.index('iifname "rsla1b2c3" ip saddr 100.64.9.2 meta l4proto tcp ct state new accept')
    assert replies < admitted < chain.index('iifname "rsla1b2c3" drop')
    assert "100.64.9.3" not in nft
    rules = firewall.iptables_rules("a1b2c3", "100.64.9.0/24", ["100.64.9.2"])
    assert _input_verdicts(rules, "100.64.9.3", reply=False)[0] == "DROP"  # any other host's SYN
    assert _input_verdicts(rules, "100.64.9.2", reply=False)[0] == "ACCEPT"  # the controller's
    assert _input_verdicts(rules, "100.64.9.3", reply=True)[0] == "ACCEPT"  # replies to the machine
    with pytest.raises(SimulatorError, match="not an IPv4 address"):
        firewall.nft_ruleset("a1b2c3", "100.64.9.0/24", ["1.2.3.4 accept; flush ruleset"])


def test_iptables_rules_are_inserted_ahead_of_the_chains_own_in_their_order(monkeypatch):
    ran: list[list[str]] = []
    monkeypatch.setattr(firewall, "_run", lambda argv, **_: ran.append(list(argv)))
    monkeypatch.setattr(firewall.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    firewall.install(firewall.IPTABLES, "a1b2c3", "100.64.9.0/24", ["100.64.9.2"])
    inputs = [argv for argv in ran if argv[:5] == ["iptables", "-w", "-I", "INPUT", argv[4]]]
    assert [argv[4] for argv in inputs] == ["1", "2", "3"]
    assert [argv[-1] for argv in inputs] == ["ACCEPT", "ACCEPT", "DROP"]


def test_the_cloud_api_process_is_accepted_and_stopped_only_while_it_runs_its_own_command(
    tmp_path, monkeypatch
):
    """`destroy` signals the recorded emulation only if its PID still runs `cloud_api_argv` for this
    state dir: a reused PID running anything else (here: this test process) is left alone."""
    state_dir = tmp_path / "sim"
    _saved_state(state_dir)
    sim = Simulation.open(state_dir)
    assert sim.state.processes[CLOUD_API_PROCESS] == ProcessRef(4323, 99)
    me = process_ref(os.getpid())
    assert me is not None
    sim.state.processes[CLOUD_API_PROCESS] = me
    stopped: list[ProcessRef] = []
    monkeypatch.setattr(services, "stop", lambda ref, grace_s: stopped.append(ref))
    sim._stop_cloud_api()
    assert stopped == []  # alive, but its command line is pytest's, not the emulation's
    argv = cloud_api_argv("/any/python", state_dir)
    monkeypatch.setattr(services, "cmdline", lambda pid: argv if pid == me.pid else [])
    sim._stop_cloud_api()
    assert stopped == [me]
    other = cloud_api_argv("/any/python", tmp_path / "other-sim")
    monkeypatch.setattr(services, "cmdline", lambda pid: other)
    sim._stop_cloud_api()
    assert stopped == [me]  # another simulation's emulation is not ours
