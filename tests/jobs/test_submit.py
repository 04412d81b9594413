"""`rayslice run` without a cluster: its command line, where it sends a token, and when it
restarts a job (what a job uploads: test_upload.py).

The token tests answer Ray's client from a small HTTP server that records the headers it was sent.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from rayslice import cli, spec
from rayslice.errors import EXIT_INVALID, EXIT_NO_CLUSTER, InvalidInput, JobFailed
from rayslice.jobs import connection, restarts, submit, upload
from rayslice.local.simulation.state import STATE_DIR_ENV, SimulationState, make_plan
from tests import serving

# The environment variables the requests library reads its proxies from, in both cases.
PROXY_VARIABLES = [
    name for base in ("http_proxy", "https_proxy", "all_proxy", "no_proxy") for name in (base, base.upper())
]


@pytest.fixture(autouse=True)
def _no_ambient_cluster(monkeypatch, tmp_path):
    """No RAY_ADDRESS, no proxy and an empty default state dir, unless a test sets them."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "no-simulation"))


def test_run_list_prints_one_line_per_workload(capsys):
    assert cli.main(["run", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(upload.workloads())  # checked in test_upload.py


@pytest.mark.parametrize(
    "address, url",
    [
        ("http://10.0.0.2:8265", "http://10.0.0.2:8265"),
        ("http://10.0.0.2:8265/", "http://10.0.0.2:8265"),
        ("10.0.0.2:8265", "http://10.0.0.2:8265"),
        ("head", "http://head:8265"),
    ],
)
def test_jobs_url(address, url):
    assert connection.jobs_url(address) == url


def test_a_name_that_is_not_a_workload_is_refused_with_suggestions(capsys):
    assert cli.main(["run", "jax_multihots", "--address", "http://127.0.0.1:9"]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "'jax_multihots' is not a workload (did you mean jax_multihost" in err


def test_no_cluster_reachable_is_a_clear_error(capsys):
    assert cli.main(["run", "jax_multihost"]) == EXIT_NO_CLUSTER
    assert "no Ray cluster to submit to" in capsys.readouterr().err
    assert cli.main(["run", "jax_multihost", "--address", "http://127.0.0.1:9"]) == EXIT_NO_CLUSTER
    assert "no Ray cluster reachable at http://127.0.0.1:9" in capsys.readouterr().err


# ---- arguments after `--` reach the job wherever run's options stand --------------------------


@pytest.fixture
def submitted(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []

    def fake_submit(target, job_args, **options):
        calls.append((target, list(job_args), options["address"]))
        return "SUCCEEDED"

    monkeypatch.setattr(submit, "submit", fake_submit)
    return calls


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["jax_train", "--", "--steps", "20"], ("jax_train", ["--steps", "20"], None)),
        (["--address", "X", "jax_train", "--", "--steps", "20"], ("jax_train", ["--steps", "20"], "X")),
        (["jax_train", "--address", "X", "--", "--steps", "20"], ("jax_train", ["--steps", "20"], "X")),
        (["jax_train", "--address=X"], ("jax_train", [], "X")),
        # a job option that has the same name as one of run's stays the job's
        (
            ["jax_train", "--address", "h", "--", "--steps", "5", "--address", "x", "--"],
            ("jax_train", ["--steps", "5", "--address", "x", "--"], "h"),
        ),
        (["dir/mine.py", "--", "a b", "-x"], ("dir/mine.py", ["a b", "-x"], None)),
    ],
)
def test_job_arguments_after_the_double_dash_reach_the_job(argv, expected, submitted):
    assert cli.main(["run", *argv]) == 0
    assert submitted == [expected]


@pytest.mark.parametrize(
    "argv", [["jax_train", "--steps", "20"], ["jax_train", "stray", "--", "--steps", "2"]]
)
def test_job_arguments_without_the_double_dash_are_refused(argv, submitted, capsys):
    assert cli.main(["run", *argv]) == EXIT_INVALID
    assert submitted == []
    assert "Error:" in capsys.readouterr().err


def test_the_module_form_runs_the_same_command(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "rayslice", "run", "--address", "http://127.0.0.1:9", "jax_train", "--", "-x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == EXIT_NO_CLUSTER, result.stderr
    assert "Traceback" not in result.stderr


# ---- which cluster, and which token --------------------------------------------------------


def fake_simulation(state_dir: Path, *, token: str | None) -> str:
    """A state dir as `rayslice local up` leaves it (state file, token); returns the head's IP."""
    import ipaddress

    state_dir.mkdir(mode=0o700, parents=True)
    plan = make_plan(
        spec.load({"acceleratorType": "v6e-4"}, require_zone=False),
        run_id="c0ffee",
        network=ipaddress.IPv4Network("100.64.77.0/24"),
    )
    SimulationState(plan=plan, state_dir=str(state_dir)).save()
    if token is not None:
        (state_dir / "ray-token").write_text(token)
    return plan.head.ip


def test_the_simulated_slice_is_found_in_the_default_state_dir(tmp_path, monkeypatch):
    state_dir = tmp_path / "sim"
    head_ip = fake_simulation(state_dir, token="sim-secret")
    monkeypatch.setenv(STATE_DIR_ENV, str(state_dir))
    target = connection.choose_target(None, None)
    assert target.url == f"http://{head_ip}:8265" and target.source == "simulator"
    assert target.token_file is not None and target.token_file.read_text() == "sim-secret"


def test_ray_address_wins_over_the_simulator_and_gets_no_simulator_token(tmp_path, monkeypatch):
    state_dir = tmp_path / "sim"
    fake_simulation(state_dir, token="sim-secret")
    monkeypatch.setenv(STATE_DIR_ENV, str(state_dir))
    monkeypatch.setenv("RAY_ADDRESS", "http://10.1.2.3:8265")
    assert connection.choose_target(None, None) == connection.Target(
        "http://10.1.2.3:8265", None, "RAY_ADDRESS"
    )
    assert connection.choose_target("other:8265", None) == connection.Target(
        "http://other:8265", None, "--address"
    )


class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []

    require: ClassVar[str | None] = None  # answer 401/403 unless this Authorization header comes

    def do_GET(self) -> None:  # the Jobs client's version check
        type(self).seen.append(dict(self.headers))
        if self.require is not None and self.headers.get("Authorization") != self.require:
            refused = b"Unauthorized: Missing authentication token"
            self.send_response(401 if self.headers.get("Authorization") is None else 403)
            self.end_headers()
            self.wfile.write(refused)
            return
        body = json.dumps({"ray_version": "2.60.0", "version": "4", "ray_commit": "x", "session_name": "s"})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[dict[str, str]]]]:
    _Recorder.seen = []
    _Recorder.require = None
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    serving.start(server)
    yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.seen
    serving.stop(server)


def _authorization(headers: list[dict[str, str]]) -> set[str | None]:
    return {next((v for k, v in h.items() if k.lower() == "authorization"), None) for h in headers}


def test_the_simulators_token_goes_to_the_simulator_only(tmp_path, monkeypatch, recorder):
    url, seen = recorder
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    token = tmp_path / "sim-token"
    token.write_text("sim-secret\n")
    monkeypatch.setattr(connection, "simulated_cluster", lambda: (url, token))
    connection.connect(connection.choose_target(None, None))
    assert _authorization(seen) == {"Bearer sim-secret"}
    seen.clear()
    connection.connect(connection.choose_target(url, None))  # the same server, named by the user
    assert seen and _authorization(seen) == {None}
    seen.clear()
    mine = tmp_path / "mine"
    mine.write_text("user-secret")
    connection.connect(connection.choose_target(url, mine))
    assert _authorization(seen) == {"Bearer user-secret"}


def test_a_cluster_that_wants_a_token_says_how_to_give_one(tmp_path, recorder, capsys):
    url, _ = recorder
    _Recorder.require = "Bearer right"
    assert cli.main(["run", "--address", url, "jax_train"]) == EXIT_NO_CLUSTER
    err = capsys.readouterr().err
    assert "uses token auth and no token was sent: pass --token-file F" in err and "Traceback" not in err
    (tmp_path / "wrong").write_text("wrong")
    assert cli.main(["run", "--address", url, "--token-file", str(tmp_path / "wrong"), "jax_train"]) == 3
    assert f"the token in {tmp_path / 'wrong'} was refused" in capsys.readouterr().err


def test_an_unreadable_or_empty_token_file_is_bad_input(tmp_path):
    with pytest.raises(InvalidInput, match="cannot read token file"):
        connection.auth_headers(tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(InvalidInput, match="is empty"):
        connection.auth_headers(tmp_path / "empty")


# ---- --max-restarts: a node's death restarts the job, the job's own failure does not -----------

NODE_DIED = (
    "ray.exceptions.NodeDiedError: Task failed because the node it was running on is dead or unavailable. "
    "Node IP: 10.0.0.3, node ID: 5f3c. This can happen if the node was preempted, had a hardware failure, "
    "or its raylet crashed unexpectedly."
)


@pytest.mark.parametrize(
    "text, dead",
    [
        (f"Traceback (most recent call last):\n  File 'x.py'\n{NODE_DIED}", True),
        (
            "The actor died unexpectedly before finishing this task.\n\tthe actor's node was preempted: spot",
            True,
        ),
        ("\tthe actor's node was terminated unexpectedly: health check failed", True),
        ("The node with node id: 5f3c and address: 10.0.0.3 has missed too many heartbeats from it.", True),
        ("ray.exceptions.LocalRayletDiedError: The task's local raylet died. Check raylet.out", True),
        (
            "Job entrypoint command failed with exit code 1, last available logs:\nValueError: loss is nan",
            False,
        ),
        ("The actor is dead because its worker process has died. Worker exit type: USER_ERROR", False),
        ("error: asks for 8 TPU chips on one host, but the largest host in the cluster has 4", False),
    ],
)
def test_node_death_is_told_apart_from_a_jobs_own_failure(text, dead):
    reason = restarts.node_death_reason(text)
    assert (reason is not None) == dead
    if dead:
        assert reason.removesuffix("...") in text and len(reason) <= 200


def tpu_node(slice_name: str, worker: int, alive: bool = True) -> dict:
    from rayslice import names
    from rayslice.workloads import _cluster

    return {
        "NodeID": f"{slice_name}-{worker}",
        "NodeManagerAddress": f"10.0.0.{worker}",
        "Alive": alive,
        "Resources": {"CPU": 2.0, "TPU": 4.0},
        "Labels": {
            names.SLICE_NAME_LABEL: slice_name,
            _cluster.WORKER_ID_LABEL: str(worker),
            _cluster.TOPOLOGY_LABEL: "4x4",
            _cluster.POD_TYPE_LABEL: "v6e-16",
        },
    }


WHOLE = [tpu_node("s0", w) for w in range(4)]
BROKEN = [tpu_node("s0", w) for w in range(3)]


class FakeJobs:
    """The Jobs API as `submit` uses it; each submission takes the next (status, message, logs)."""

    def __init__(self, outcomes: list[tuple[str, str, str]]):
        self.outcomes = list(outcomes)
        self.submitted: list[str] = []

    def submit_job(self, entrypoint: str, runtime_env: dict) -> str:
        self.submitted.append(entrypoint)
        self.current = self.outcomes.pop(0)
        return f"job-{len(self.submitted)}"

    async def tail_job_logs(self, job_id: str):
        yield self.current[2]

    def get_job_status(self, job_id: str):
        from ray.job_submission import JobStatus

        return JobStatus(self.current[0])

    def get_job_info(self, job_id: str):
        from types import SimpleNamespace

        return SimpleNamespace(message=self.current[1])

    def get_job_logs(self, job_id: str) -> str:
        return self.current[2]


@pytest.fixture
def cluster(monkeypatch):
    """A fake Jobs API plus a queue of node lists the state API returns, one per poll."""
    import time

    polls: list[list[dict]] = []
    monkeypatch.setattr(time, "sleep", lambda s: None)
    monkeypatch.setattr(
        restarts, "cluster_nodes", lambda target: polls.pop(0) if len(polls) > 1 else polls[0]
    )

    def make(outcomes):
        jobs = FakeJobs(outcomes)
        monkeypatch.setattr(connection, "connect", lambda target: jobs)
        return jobs, polls

    return make


def test_a_job_lost_with_its_node_is_resubmitted_once_the_slice_is_whole(cluster, capsys):
    jobs, polls = cluster(
        [("FAILED", "Job entrypoint command failed", NODE_DIED), ("SUCCEEDED", "", "done\n")]
    )
    polls += [WHOLE, BROKEN, BROKEN, WHOLE, WHOLE]  # before; after the death: 2 broken polls, then whole
    status = submit.submit("jax_train", ["--steps", "5"], address="http://h:8265", max_restarts=2)
    assert status == "SUCCEEDED"
    assert jobs.submitted == ["python -m rayslice.workloads.jax_train --steps 5"] * 2
    assert polls == [WHOLE]  # it kept polling until the slice was whole twice in a row
    out = capsys.readouterr().out
    assert "restart 1 of 2 after ray.exceptions.NodeDiedError: Task failed because the node" in out


def test_the_node_a_failure_names_must_be_gone_before_the_slice_counts_as_whole(cluster, capsys):
    """Right after a preemption Ray still lists the lost node as alive (its health check has not
    given up yet): the slice looks whole, but the job would land on a dead host."""
    stale = [*WHOLE[:3], {**WHOLE[3], "NodeID": "5F3C"}]  # NODE_DIED names node 5f3c
    jobs, polls = cluster(
        [("FAILED", "Job entrypoint command failed", NODE_DIED), ("SUCCEEDED", "", "done\n")]
    )
    polls += [WHOLE, stale, stale, stale, WHOLE, WHOLE]
    assert submit.submit("jax_train", [], address="http://h:8265", max_restarts=1) == "SUCCEEDED"
    assert len(jobs.submitted) == 2
    assert polls == [WHOLE]  # every stale poll was waited out


def test_dead_node_ids_are_read_from_rays_messages():
    raylet = "The node with node id: 769C8EE5fdd14d2b and address: 10.0.0.8 has been marked dead"
    assert restarts.dead_node_ids(f"{NODE_DIED}\n{raylet}") == {"5f3c", "769c8ee5fdd14d2b"}
    assert restarts.dead_node_ids("ValueError: loss is nan") == frozenset()


def test_a_job_that_fails_on_its_own_is_not_restarted(cluster, capsys):
    jobs, polls = cluster([("FAILED", "exit code 1", "ValueError: loss is nan\n")] * 3)
    polls += [WHOLE]
    with pytest.raises(JobFailed, match="job job-1 FAILED: exit code 1"):
        submit.submit("jax_train", [], address="http://h:8265", max_restarts=2)
    assert len(jobs.submitted) == 1
    assert "restart" not in capsys.readouterr().out


def test_restarts_stop_at_the_limit(cluster, capsys):
    jobs, polls = cluster([("FAILED", "lost", NODE_DIED)] * 3)
    polls += [WHOLE]
    with pytest.raises(JobFailed, match="job job-3 FAILED"):
        submit.submit("jax_train", [], address="http://h:8265", max_restarts=2)
    assert len(jobs.submitted) == 3
    out = capsys.readouterr().out
    assert "restart 1 of 2 after" in out and "restart 2 of 2 after" in out and "restart 3" not in out


def test_without_max_restarts_a_node_death_fails_at_once(cluster):
    jobs, polls = cluster([("FAILED", "lost", NODE_DIED)])
    with pytest.raises(JobFailed):
        submit.submit("jax_train", [], address="http://h:8265")
    assert len(jobs.submitted) == 1 and polls == []  # the cluster is not even read


def test_a_cluster_that_never_heals_ends_the_restarts(cluster, monkeypatch):
    jobs, polls = cluster([("FAILED", "lost", NODE_DIED), ("SUCCEEDED", "", "")])
    polls += [WHOLE, BROKEN]
    with pytest.raises(JobFailed, match=r"not whole again after 1s \(incomplete slices: s0; 3 of 4"):
        submit.submit("jax_train", [], address="http://h:8265", max_restarts=1, rejoin_timeout_s=1)
    assert len(jobs.submitted) == 1


def test_max_restarts_reaches_submit_from_the_command_line(monkeypatch):
    seen = {}
    monkeypatch.setattr(submit, "submit", lambda target, args, **options: seen.update(options) or "SUCCEEDED")
    assert cli.main(["run", "jax_train", "--max-restarts", "3", "--", "--steps", "2"]) == 0
    assert seen["max_restarts"] == 3
    assert cli.main(["run", "jax_train", "--max-restarts", "-1"]) == EXIT_INVALID


# ---- single-host jobs on a multi-host slice: refused before anything is uploaded ---------------


def v6e_4_node(name: str) -> dict:
    from rayslice.workloads import _cluster

    node = tpu_node(name, 0)
    node["Labels"] |= {_cluster.TOPOLOGY_LABEL: "2x2", _cluster.POD_TYPE_LABEL: "v6e-4"}
    return node


@pytest.mark.parametrize(
    "job, job_args, nodes, multihost",
    [
        ("jax_single_host", [], WHOLE, "jax_multihost"),
        ("jax_single_host", ["--chips", "4", "--timeout", "60"], WHOLE, "jax_multihost"),
        ("jax_single_host", ["--slice", "s0"], [*WHOLE, v6e_4_node("one")], "jax_multihost"),
        ("xla_multi_device", ["--accelerator-type=v6e-16"], [*WHOLE, v6e_4_node("one")], "xla_multihost"),
    ],
)
def test_a_single_host_job_on_a_multi_host_slice_is_refused_before_submission(
    cluster, capsys, monkeypatch, job, job_args, nodes, multihost
):
    jobs, polls = cluster([("SUCCEEDED", "", "")])
    polls.append(nodes)
    staged = []
    monkeypatch.setattr(upload, "runtime_env", lambda *args: staged.append(args) or {})
    assert cli.main(["run", job, "--address", "http://h:8265", "--", *job_args]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert f"{job} needs a single-host slice" in err and f"Run {multihost} instead" in err
    assert jobs.submitted == [] and staged == []  # nothing was uploaded or submitted


@pytest.mark.parametrize(
    "job_args, nodes",
    [
        ([], [*WHOLE, v6e_4_node("one")]),  # the job will take the single-host slice
        (["--chips", "1"], WHOLE),  # part of a host is a program of its own
        (["--chips", "x"], WHOLE),  # a malformed option is the job's to report
    ],
)
def test_a_single_host_job_that_can_run_is_submitted(cluster, job_args, nodes):
    jobs, polls = cluster([("SUCCEEDED", "", "")])
    polls.append(nodes)
    assert submit.submit("jax_single_host", job_args, address="http://h:8265") == "SUCCEEDED"
    assert jobs.submitted == [" ".join(["python -m rayslice.workloads.jax_single_host", *job_args])]


def test_a_multi_host_job_does_not_read_the_cluster_first(cluster):
    jobs, polls = cluster([("SUCCEEDED", "", "")])
    assert submit.submit("jax_multihost", [], address="http://h:8265") == "SUCCEEDED"
    assert len(jobs.submitted) == 1 and polls == []  # the state API was never asked


# ---- the job's log reaches the terminal as the job writes it -----------------------------------


class StreamingJobs(FakeJobs):
    """A Jobs API whose log stream records what the client had printed before each next chunk."""

    def __init__(self, chunks: list[str], capsys: pytest.CaptureFixture[str]):
        super().__init__([("SUCCEEDED", "", "".join(chunks))])
        self.chunks, self.capsys = chunks, capsys
        self.printed_before: list[str] = []

    async def tail_job_logs(self, job_id: str):
        for chunk in self.chunks:
            self.printed_before.append(self.capsys.readouterr().out)
            yield chunk


def test_each_chunk_of_the_log_is_printed_before_the_next_one_is_read(monkeypatch, capsys):
    chunks = ["slice s0 (v6e-16)\n", "step   0  loss 1.00000\n", "step   1  loss 0.50000\n", "END\n"]
    jobs = StreamingJobs(chunks, capsys)
    monkeypatch.setattr(connection, "connect", lambda target: jobs)
    assert submit.submit("jax_train", [], address="http://h:8265") == "SUCCEEDED"
    assert jobs.printed_before == ["", *chunks[:-1]]  # nothing waits for the end of the stream
    assert capsys.readouterr().out == chunks[-1]


class StallingJobs(FakeJobs):
    """A Jobs API whose log stream brings the first lines, then stalls for good while the job
    runs on and ends (seen with Ray 2.60's dashboard on the simulator)."""

    async def tail_job_logs(self, job_id: str):
        yield self.current[2].split("RAN")[0]
        await asyncio.Event().wait()


def test_a_log_stream_that_stalls_ends_once_the_job_is_over_and_the_rest_is_printed(monkeypatch, capsys):
    monkeypatch.setattr(submit, "STATUS_POLL_S", 0.01)
    log = "Connected to Ray cluster\nRAN [h0]\nSTILL [h0]\n"
    jobs = StallingJobs([("SUCCEEDED", "", log)])
    jobs.current = jobs.outcomes[0]
    assert submit.follow(jobs, "job-1") == "SUCCEEDED"  # type: ignore[arg-type]
    assert capsys.readouterr().out == log  # each line once, in order


class RotatedJobs(StallingJobs):
    """A stream whose lines are not the start of the stored log (which no run has shown: the two
    read one file)."""

    def get_job_logs(self, job_id: str) -> str:
        return "rotated\nRAN [h0]\n"


def test_a_stream_that_does_not_match_the_stored_log_is_followed_by_the_whole_stored_log(monkeypatch, capsys):
    monkeypatch.setattr(submit, "STATUS_POLL_S", 0.01)
    jobs = RotatedJobs([("SUCCEEDED", "", "first\nRAN [h0]\n")])
    jobs.current = jobs.outcomes[0]
    assert submit.follow(jobs, "job-1") == "SUCCEEDED"  # type: ignore[arg-type]
    marked = "rayslice: the log stream and the job's stored log differ; the stored log:"
    assert capsys.readouterr().out == f"first\n{marked}\nrotated\nRAN [h0]\n"


class UnreadableLogJobs(StallingJobs):
    """A job over, its stored log unreadable (its node gone, the head busy)."""

    def get_job_logs(self, job_id: str) -> str:
        raise RuntimeError("Request failed with status code 500")


def test_a_stored_log_that_cannot_be_read_leaves_the_jobs_outcome_as_it_is(monkeypatch, capsys):
    monkeypatch.setattr(submit, "STATUS_POLL_S", 0.01)
    jobs = UnreadableLogJobs([("SUCCEEDED", "", "first\nRAN [h0]\n")])
    jobs.current = jobs.outcomes[0]
    assert submit.follow(jobs, "job-1") == "SUCCEEDED"  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert out == "first\n"
    assert (
        err == "rayslice: the rest of the job's log could not be read: Request failed with status code 500\n"
    )


def test_a_failed_job_whose_stream_stalled_still_fails_with_rays_message(monkeypatch, capsys):
    monkeypatch.setattr(submit, "STATUS_POLL_S", 0.01)
    jobs = StallingJobs([("FAILED", "exit code 1", "started\nRAN\nTraceback\n")])
    jobs.current = jobs.outcomes[0]
    with pytest.raises(JobFailed, match="job job-1 FAILED: exit code 1"):
        submit.follow(jobs, "job-1")  # type: ignore[arg-type]
    assert capsys.readouterr().out == "started\nRAN\nTraceback\n"


# ---- a token never crosses the internet in clear; nothing is uploaded from a refused folder ----


@pytest.mark.parametrize(
    "address, token, refused",
    [
        ("http://34.1.2.3:8265", True, True),  # a public head (externalIps)
        ("34.1.2.3", True, True),  # a bare host means http
        ("http://[2600::1]:8265", True, True),
        ("http://[::ffff:34.1.2.3]:8265", True, True),  # IPv4-mapped stays public
        ("https://34.1.2.3:8265", True, False),  # encrypted
        ("http://34.1.2.3:8265", False, False),  # no token to leak
        ("http://10.0.0.2:8265", True, False),
        ("http://127.0.0.1:8265", True, False),  # the tunnel's end
        ("http://100.64.77.2:8265", True, False),  # shared address space (the simulator)
        ("http://[fd00::2]:8265", True, False),
    ],
)
def test_a_token_goes_over_http_only_to_internal_addresses(tmp_path, monkeypatch, address, token, refused):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text("secret")
    choose = lambda: connection.choose_target(address, token_file if token else None)  # noqa: E731
    if refused:
        with pytest.raises(InvalidInput, match="refusing to send the Ray token over plain http"):
            choose()
    else:
        assert choose().url == connection.jobs_url(address)


def test_rays_own_token_mode_counts_as_sending_a_token(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(InvalidInput, match="dashboard_tunnel_command"):
        connection.choose_target("http://34.1.2.3:8265", None)
    monkeypatch.setenv("RAY_ADDRESS", "http://34.1.2.3:8265")
    with pytest.raises(InvalidInput, match=r"34\.1\.2\.3"):
        connection.choose_target(None, None)


def test_a_host_name_is_judged_by_the_addresses_it_resolves_to(tmp_path, monkeypatch):
    import socket

    resolved = {"head.example.com": "34.1.2.3", "head.internal": "10.0.0.2"}

    def getaddrinfo(host, *args, **kwargs):
        if host not in resolved:
            raise socket.gaierror("no such host")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (resolved[host], 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    token_file = tmp_path / "token"
    token_file.write_text("secret")
    with pytest.raises(InvalidInput, match=r"head.example.com is 34.1.2.3, not a private address"):
        connection.choose_target("head.example.com:8265", token_file)
    assert connection.choose_target("head.internal", token_file).url == "http://head.internal:8265"
    # a name that does not resolve cannot be connected to either: no token leaves
    assert connection.choose_target("nowhere", token_file).url == "http://nowhere:8265"


@pytest.mark.parametrize(
    "proxies, refused",
    [
        ({"HTTP_PROXY": "http://user:secret-pw@34.1.2.3:3128"}, True),
        ({"http_proxy": "34.1.2.3:3128"}, True),  # no scheme: requests reads it as http://
        ({"ALL_PROXY": "socks5://34.1.2.3:1080"}, True),
        ({"HTTP_PROXY": "http://[2600::1]:3128"}, True),
        ({"HTTP_PROXY": "http://34.1.2.3:3128", "NO_PROXY": "10.0.0.2"}, False),  # goes direct
        ({"HTTP_PROXY": "http://34.1.2.3:3128", "no_proxy": "10.0.0.0/8"}, False),
        ({"HTTP_PROXY": "http://10.0.0.99:3128"}, False),  # a proxy inside the user's network
        ({"HTTPS_PROXY": "http://34.1.2.3:3128"}, False),  # for https URLs only
    ],
)
def test_a_token_goes_over_http_only_through_an_internal_proxy(tmp_path, monkeypatch, proxies, refused):
    """A plain http request through a proxy goes to the proxy whole, Authorization included."""
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    for name, value in proxies.items():
        monkeypatch.setenv(name, value)
    token_file = tmp_path / "token"
    token_file.write_text("secret")
    choose = lambda: connection.choose_target("http://10.0.0.2:8265", token_file)  # noqa: E731
    if refused:
        with pytest.raises(InvalidInput, match="through the proxy") as raised:
            choose()
        assert "NO_PROXY" in str(raised.value) and "secret-pw" not in str(raised.value)
    else:
        assert choose().url == "http://10.0.0.2:8265"
    # No token, or https: the proxy sees nothing it may not.
    assert connection.choose_target("http://10.0.0.2:8265", None).url == "http://10.0.0.2:8265"
    assert connection.choose_target("https://10.0.0.2:8265", token_file).url == "https://10.0.0.2:8265"


def test_the_proxy_judged_is_the_one_rays_client_hands_the_token_to(tmp_path, monkeypatch, recorder):
    """The recording server stands in for a proxy: Ray's Jobs client sends it the request for the
    cluster, token included, exactly where `connection.proxy_for` said it would."""
    proxy, seen = recorder
    monkeypatch.setenv("HTTP_PROXY", proxy)
    token_file = tmp_path / "token"
    token_file.write_text("secret")
    target = connection.choose_target("http://10.0.0.2:8265", token_file)  # the proxy is loopback
    judged = connection.proxy_for(target.url)
    assert judged is not None and f"http://{judged.netloc}" == proxy
    connection.connect(target)
    assert seen and seen[0]["Authorization"] == "Bearer secret"


@pytest.fixture
def no_upload(monkeypatch) -> list[object]:
    """Records every connection `run` opens: a refused run must open none."""
    opened: list[object] = []
    monkeypatch.setattr(connection, "connect", lambda target: opened.append(target))
    return opened


def test_run_refuses_a_public_http_address_with_a_token_before_anything_is_sent(tmp_path, capsys, no_upload):
    (tmp_path / "token").write_text("secret")
    argv = ["run", "--address", "http://34.1.2.3:8265", "--token-file", str(tmp_path / "token"), "jax_train"]
    assert cli.main(argv) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "refusing to send the Ray token over plain http" in err and "Traceback" not in err
    assert no_upload == []


def test_run_refuses_a_link_out_of_the_folder_and_an_ancestor_of_home(
    tmp_path, monkeypatch, capsys, no_upload
):
    home = tmp_path / "home" / "me"
    (home / ".config" / "gcloud").mkdir(parents=True)
    (home / ".config" / "gcloud" / "credentials.db").write_text("secret")
    monkeypatch.setenv("HOME", str(home))
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text("print('hi')\n")
    (job / "creds").symlink_to(home / ".config" / "gcloud")
    assert cli.main(["run", "--address", "http://10.0.0.2:8265", str(job / "train.py")]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "symlink creds" in err and "points outside the folder" in err and "Traceback" not in err
    (job / "creds").unlink()
    (home / "work").mkdir()
    (home / "work" / "run.py").write_text("")
    argv = ["run", "--address", "http://10.0.0.2:8265", "--working-dir", str(tmp_path / "home")]
    assert cli.main([*argv, str(home / "work" / "run.py")]) == EXIT_INVALID
    assert "it holds your home folder" in capsys.readouterr().err
    assert no_upload == []


def test_run_says_what_a_script_uploads(tmp_path, monkeypatch, capsys):
    job = tmp_path / "job"
    (job / "data").mkdir(parents=True)
    (job / "train.py").write_text("print('hi')\n")
    (job / "data" / "input.csv").write_text("x" * 3000)
    (job / ".env").write_text("API_KEY=1")
    (job / "sa.json").write_text('{"type": "service_account", "private_key": "k"}')
    jobs = FakeJobs([("SUCCEEDED", "", "hi\n")])
    monkeypatch.setattr(connection, "connect", lambda target: jobs)
    submit.submit(str(job / "train.py"), [], address="http://10.0.0.2:8265")
    err = capsys.readouterr().err
    assert f"uploading 2 files (2.9 KiB) from {job}" in err
    assert "kept back as credentials or simulator state: sa.json" in err
    assert "data/input.csv" not in err
    jobs.outcomes.append(("SUCCEEDED", "", ""))
    submit.submit(str(job / "train.py"), [], address="http://10.0.0.2:8265", verbose=True)
    err = capsys.readouterr().err
    assert "  data/input.csv (2.9 KiB)\n" in err and "  train.py (12 B)" in err and ".env" not in err


class _StopRecorder:
    """The one Jobs API call an interrupt makes with `--stop-on-interrupt`."""

    def __init__(self) -> None:
        self.stopped: list[str] = []

    def stop_job(self, job_id: str) -> bool:
        self.stopped.append(job_id)
        return True


@pytest.mark.parametrize(
    "target, command",
    [
        (connection.Target("http://10.0.0.2:8265", None, "simulator"), "rayslice run --stop J"),
        (
            connection.Target("http://10.0.0.2:8265", Path("/tmp/sim token"), "simulator"),
            "rayslice run --stop J",
        ),
        (
            connection.Target("http://localhost:8265", Path("/tmp/my token"), "--address"),
            "rayslice run --address http://localhost:8265 --token-file '/tmp/my token' --stop J",
        ),
        (connection.Target("http://h:8265", None, "RAY_ADDRESS"), "rayslice run --stop J"),
    ],
)
def test_an_interrupt_names_the_command_that_stops_the_job_on_the_same_cluster(target, command):
    client = _StopRecorder()
    left = submit._interrupted(client, "J", target, stop=False)  # type: ignore[arg-type]
    assert f"job J keeps running on {target.url}; stop it with `{command}`" in str(left)
    assert left.exit_code == 130 and client.stopped == []
    stopped = submit._interrupted(client, "J", target, stop=True)  # type: ignore[arg-type]
    assert client.stopped == ["J"] and "stop job J" in str(stopped)


@pytest.mark.parametrize(
    "job_id", ["", "../../api/jobs", ".", "..", "-h", "_x", "a b", "x" * 129, "raysubmit_1\n"]
)
def test_stop_refuses_what_is_not_a_job_id_before_any_request(job_id, capsys):
    """A job ID starts with a letter or a digit: "." or ".." would reach Ray as a path step of
    /api/jobs/, "-h" reads as an option. One line, exit 2, no request."""
    assert cli.main(["run", "--stop", job_id]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "is not a Ray job ID" in err and err.count("\n") == 1, err


SIGTERM_IN_A_TASK = r"""
import asyncio, os, signal, sys, time
from rayslice.jobs.submit import _sigterm_interrupts

async def main():
    async def busy():  # synchronous work inside a task, as the log stream's record writes are
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline:
            sum(range(1000))
    task = asyncio.ensure_future(busy())
    while not task.done():
        await asyncio.wait({task}, timeout=0.1)

try:
    with _sigterm_interrupts():
        asyncio.run(main())
except KeyboardInterrupt:
    print("INTERRUPTED")
"""


def test_a_sigterm_while_the_log_streams_interrupts_without_a_tasks_traceback():
    """SIGTERM that arrives while a task of `asyncio.run` runs synchronous code ends the run as
    Ctrl-C does (KeyboardInterrupt out of `asyncio.run`), with no "Task exception was never
    retrieved" traceback printed under `rayslice run`'s interrupt message."""
    result = subprocess.run(
        [sys.executable, "-c", SIGTERM_IN_A_TASK], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "INTERRUPTED", result.stderr
    assert "Traceback" not in result.stderr, result.stderr
