"""The demand publisher against a real local Ray with token auth: what it publishes is what the
controller's parser reads, and `slices_wanted` makes the right whole slices of it.

Ray runs in a driver subprocess (`DRIVER`), so this test process never joins a cluster nor changes
its own Ray settings. The one local node fakes a TPU host of slice `SLICE`: ``TPU: 4``, its
slice-name resource and the ``ray.io/tpu-slice-name`` label, as Ray's TPU detection gives a host.
Both subprocesses run with RAY_AUTH_MODE=token and the token in a file of their own, as on the
head (the boot script's `ray_environment`), and HOME in the test's directory, so no
~/.ray/auth_token is written or read. Nothing runs `ray stop`: the driver's ray.shutdown() ends
its cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from rayslice import names
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery import demand
from rayslice.startup_scripts.variables import DEMAND_PUBLISHER

pytestmark = pytest.mark.slow  # starts a local Ray

SLICE = "fake-slice-0"
HEAD = demand.head_resource("v6e-16")
CHIPS_PER_SLICE = 16

# The cluster and its demand. Held: an actor uses the host's 4 chips, so the slice is busy and
# the rest waits. Pending: one slice head reservation (as `reserve_tpu_slice` makes it): 1 slice;
# a group of 5 x 4 chips: 2 slices; 4 tasks of 4 chips: 1 slice; a group pinned to SLICE (as
# slice_placement_group pins its workers): none; a task waiting for a bundle of the pending
# group: none (it is part of the group's demand). Asked with request_resources (as Ray Train's
# elastic scaling asks for its workers): 8 x 4 chips, 2 slices in all. Then, on "release", all of
# it is let go, and an empty request_resources withdraws the ask.
DRIVER = f"""
import json, sys
import ray
from ray.autoscaler.sdk import request_resources
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

ray.init(num_cpus=2, resources={{"TPU": 4, {SLICE!r}: 1}}, labels={{{names.SLICE_NAME_LABEL!r}: {SLICE!r}}},
         include_dashboard=False, log_to_driver=False, configure_logging=False)

@ray.remote(num_cpus=0, resources={{"TPU": 4}})
class Holder:
    def ping(self):
        return 1

@ray.remote(num_cpus=0, resources={{"TPU": 4}})
def work():
    return 1

holder = Holder.remote()
ray.get(holder.ping.remote(), timeout=120)
groups = [
    placement_group([{{{HEAD!r}: 1}}]),
    placement_group([{{"TPU": 4}}] * 5, strategy="SPREAD"),
    placement_group([{{"TPU": 4}}] * 4, strategy="SPREAD",
                    bundle_label_selector=[{{{names.SLICE_NAME_LABEL!r}: {SLICE!r}}}] * 4),
]
refs = [work.remote() for _ in range(4)]
refs.append(work.options(scheduling_strategy=PlacementGroupSchedulingStrategy(groups[1], 0)).remote())
request_resources(bundles=[{{"TPU": 4}}] * 8)
print(json.dumps({{"gcs": ray.get_runtime_context().gcs_address}}), flush=True)
sys.stdin.readline()
for ref in refs:
    ray.cancel(ref, force=True)
for group in groups:
    remove_placement_group(group)
ray.kill(holder)
request_resources(bundles=[])
print("released", flush=True)
sys.stdin.readline()
ray.shutdown()
"""


def _environment(tmp_path: Path, token: str) -> dict[str, str]:
    token_file = tmp_path / f"token-{token}"
    token_file.write_text(token)
    token_file.chmod(0o600)
    return {
        **os.environ,
        "HOME": str(tmp_path),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
        "RAY_USAGE_STATS_ENABLED": "0",
    }


def _line(stream: IO[str], timeout: float) -> str:
    """The next line of `stream`, or AssertionError after `timeout` seconds."""
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert found and found[0], "the driver printed nothing in time"
    return found[0]


def _publisher(gcs: str, url: str, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The publisher as the head's supervisor runs it (`publish_demand` in startup.sh.j2)."""
    log.touch()
    command = [
        sys.executable,
        str(DEMAND_PUBLISHER),
        f"--gcs-address={gcs}",
        f"--attribute-url={url}",
        f"--slice-label={names.SLICE_NAME_LABEL}",
        "--interval-s=1",
        f"--log-file={log}",
    ]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _published(metadata: MetadataServer) -> demand.Demand | None:
    text = metadata.guest.get(names.GUEST_ATTRIBUTE_NAMESPACE, {}).get(names.DEMAND_KEY)
    return demand.parse(text) if text else None


def _wait(
    metadata: MetadataServer,
    condition: Callable[[demand.Demand], bool],
    what: str,
    log: Path,
    timeout: float = 90,
) -> demand.Demand:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = _published(metadata)
        if value is not None and condition(value):
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what}: last published {_published(metadata)}; log:\n{log.read_text()[-3000:]}")


def test_what_the_head_publishes_of_real_ray_makes_the_right_whole_slices(
    tmp_path: Path, metadata: MetadataServer
) -> None:
    env = _environment(tmp_path, "2b7e151628aed2a6abf7158809cf4f3c")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert driver.stdin is not None and driver.stdout is not None
    publisher: subprocess.Popen[bytes] | None = None
    log = tmp_path / "publisher.log"
    try:
        gcs = json.loads(_line(driver.stdout, 180))["gcs"]
        url = (
            f"{metadata.url}/computeMetadata/v1/instance/guest-attributes/"
            f"{names.GUEST_ATTRIBUTE_NAMESPACE}/{names.DEMAND_KEY}"
        )
        publisher = _publisher(gcs, url, log, env)
        # With another token the GCS refuses every read: logged, retried, and nothing published.
        stranger_log = tmp_path / "stranger.log"
        stranger = _publisher(gcs, url + "-stranger", stranger_log, _environment(tmp_path, "0" * 32))
        try:
            deadline = time.monotonic() + 60
            while "AuthenticationError" not in stranger_log.read_text() and time.monotonic() < deadline:
                time.sleep(0.5)
            assert "cannot publish the demand (AuthenticationError" in stranger_log.read_text()
            time.sleep(2)
            assert stranger.poll() is None  # still trying
        finally:
            stranger.terminate()
            stranger.wait(30)
        assert names.DEMAND_KEY + "-stranger" not in metadata.guest.get(names.GUEST_ATTRIBUTE_NAMESPACE, {})
        busy = _wait(
            metadata,
            lambda d: demand.slices_wanted(d, "v6e-16", CHIPS_PER_SLICE) == 4,
            "4 slices wanted (1 head reservation, 20 chips of a group, 16 chips of tasks)",
            log,
        )
        assert busy.slices == {SLICE: demand.SliceUse(nodes=1, busy=True, idle_s=0.0)}
        # Asked for in all, busy slice included: 32 chips, 2 slices (not counted as pending).
        assert demand.slices_asked(busy, "v6e-16", CHIPS_PER_SLICE) == 2
        assert not busy.truncated and time.time() - busy.at < 30
        pinned = [g for g in busy.pgs if any(b.slice == SLICE for b in g.bundles)]
        assert [g.strategy for g in pinned] == ["SPREAD"]

        driver.stdin.write("release\n")
        driver.stdin.flush()
        assert _line(driver.stdout, 60).strip() == "released"
        idle = _wait(
            metadata,
            lambda d: (
                d.slices.get(SLICE) is not None
                and not d.slices[SLICE].busy
                and d.slices[SLICE].idle_s > 0
                and demand.slices_asked(d, "v6e-16", CHIPS_PER_SLICE) == 0
            ),
            "the slice idle and nothing asked for once everything is released",
            log,
        )
        assert demand.slices_wanted(idle, "v6e-16", CHIPS_PER_SLICE) == 0
        assert "cannot publish" not in log.read_text()
    finally:
        if publisher is not None:
            publisher.terminate()
            publisher.wait(30)
        if driver.poll() is None:
            driver.stdin.close()  # the driver shuts its Ray down
            try:
                driver.wait(120)
            except subprocess.TimeoutExpired:
                driver.kill()
                driver.wait(30)
    assert not (tmp_path / ".ray" / "auth_token").exists()  # the token came from its own file
