"""`_cluster.wait_ready` against a real local Ray: the first failure ends the wait at once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray

from rayslice.errors import JobFailed
from rayslice.workloads import _cluster

pytestmark = pytest.mark.slow  # starts a local Ray (seconds, but the quick subset starts none)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    # A local ray.init() in Ray 2.60 turns token auth on unless told otherwise: it writes a token to
    # ~/.ray/auth_token and sets RAY_AUTH_MODE in this process, which other tests would then see.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_AUTH_MODE", "disabled")
        for attempt in range(2):
            try:
                ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
                break
            except Exception as exc:  # Ray raises a bare Exception for this one
                # Ray gives the node a fixed 30 s to register with its GCS: on 2 cores busy with
                # a simulated cluster beside this test (pytest-xdist), once more, then fail.
                if attempt or "timed out during startup" not in str(exc):
                    raise
                ray.shutdown()
        yield
        ray.shutdown()


@ray.remote(max_retries=0)
def _sleep(seconds: float) -> str:
    import time

    time.sleep(seconds)
    return "slept"


@ray.remote(max_retries=0)
def _fail() -> None:
    raise RuntimeError("this host's task failed")


def test_a_failed_task_is_raised_before_the_others_finish(local_ray: None) -> None:
    # The sleeper outlasts the timeout: waiting for every task first would end in JobFailed.
    refs = [_sleep.remote(600), _fail.remote()]
    with pytest.raises(ray.exceptions.RayTaskError, match="this host's task failed"):
        _cluster.wait_ready(refs, 60, "two tasks")
    ray.cancel(refs[0], force=True)


def test_tasks_that_do_not_finish_in_time_are_a_clear_error(local_ray: None) -> None:
    refs = [_sleep.remote(0), _sleep.remote(600)]
    with pytest.raises(JobFailed, match=r"two tasks did not finish within 3 s \(1/2 done\)"):
        _cluster.wait_ready(refs, 3, "two tasks")
    ray.cancel(refs[1], force=True)


def test_every_result_in_order_when_all_succeed(local_ray: None) -> None:
    assert _cluster.wait_ready([_sleep.remote(0.2), _sleep.remote(0)], 60, "two tasks") == ["slept"] * 2


@ray.remote(max_retries=0)
def _report_then_wait(progress: _cluster.Progress, gate) -> str:
    progress("step   0  loss 1.00000")
    gate.get(timeout=120)  # opened only once the driver has shown the line
    progress("step   1  loss 0.50000")
    return "done"


def test_what_a_task_reports_is_shown_while_it_is_still_running(local_ray: None, monkeypatch) -> None:
    """The task cannot finish before the driver shows its first line: `wait_ready` holding the
    lines until the tasks end would leave the task waiting, and fail it after its gate's timeout."""
    from ray.util.queue import Queue

    gate = Queue(actor_options={"num_cpus": 0})
    shown: list[str] = []

    def show(line: str) -> None:
        shown.append(line)
        gate.put("go")

    monkeypatch.setattr(_cluster, "show_line", show)
    progress = _cluster.Progress()
    assert _cluster.wait_ready([_report_then_wait.remote(progress, gate)], 300, "one task", progress) == [
        "done"
    ]
    assert shown == ["step   0  loss 1.00000", "step   1  loss 0.50000"]


def test_the_progress_queue_lives_on_the_drivers_node(local_ray: None, monkeypatch) -> None:
    """A queue placed by Ray's default scheduler can land on a TPU host; when that host's slice is
    preempted, the driver's next read fails the job with an error `--max-restarts` does not restart
    on (seen in the recovery acceptance test). Pinned hard to the driver's node, it outlives any slice."""
    made: list[dict] = []

    class Recording(_cluster.Queue):  # type: ignore[misc, valid-type]
        def __init__(self, actor_options: dict) -> None:
            made.append(actor_options)
            super().__init__(actor_options=actor_options)

    monkeypatch.setattr(_cluster, "Queue", Recording)
    _cluster.Progress()
    [options] = made
    strategy = options["scheduling_strategy"]
    assert strategy.node_id == ray.get_runtime_context().get_node_id()
    assert strategy.soft is False
