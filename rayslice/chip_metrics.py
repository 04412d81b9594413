"""What `status` shows of the chips: each TPU host's metrics endpoint, read once per host, in parallel.

Every TPU host serves its chips' figures at ``http://<host>:TPU_METRICS_PORT/metrics``
(`rayslice.startup_scripts.tpu_metrics`, the format of GKE's TPU device plugin). `read_hosts`
asks every host at once, one request each, each with a time-out, so a cluster of 64 hosts takes
about as long as its slowest host up to that time-out, and a host that does not answer is marked
with why rather than holding the others up. The page is parsed with prometheus_client's parser,
the one Ray's own agent uses for the same endpoint.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from rayslice import names

TIMEOUT_S = 2.0  # per host; they are asked together
MAX_PARALLEL = 64
# The endpoint's families `status` shows (Ray's names, as the device plugin serves them).
FIELDS = {
    "duty_cycle": "duty_cycle_pct",
    "tensorcore_utilization": "tensorcore_util_pct",
    "memory_used": "hbm_used",
    "memory_total": "hbm_total",
}


def parse(text: str) -> list[dict[str, Any]]:
    """Each chip's figures from an endpoint's page, chip 0 first; a figure the page lacks is None."""
    chips: dict[int, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = FIELDS.get(sample.name)
            accelerator = sample.labels.get("accelerator_id", "")
            if field is None or "-" not in accelerator:
                continue
            index = int(accelerator.rsplit("-", 1)[1])
            chip = chips.setdefault(index, {"chip": index, **dict.fromkeys(FIELDS.values())})
            chip[field] = int(sample.value) if field.startswith("hbm") else float(sample.value)
    return [chips[i] for i in sorted(chips)]


def read_host(
    address: str, port: int = names.TPU_METRICS_PORT, timeout_s: float = TIMEOUT_S
) -> dict[str, Any]:
    """One host's chips ({"chips": [...]}) or why there are none to show ({"error": why})."""
    url = f"http://{address}:{port}/metrics"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # hosts are never behind a proxy
    try:
        with opener.open(url, timeout=timeout_s) as response:
            text = response.read().decode()
    except TimeoutError:
        return {"error": f"no answer in {timeout_s:g} s"}
    except urllib.error.HTTPError as exc:
        return {"error": f"HTTP {exc.code}"}
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            return {"error": f"no answer in {timeout_s:g} s"}
        return {"error": f"not serving ({reason})"}
    try:
        return {"chips": parse(text)}
    except ValueError as exc:
        return {"error": f"unreadable page: {exc}"}


def read_hosts(
    addresses: Mapping[str, str], port: int = names.TPU_METRICS_PORT, timeout_s: float = TIMEOUT_S
) -> dict[str, dict[str, Any]]:
    """`read_host` for every host (name -> address) at once; name -> its answer, in the given order."""
    if not addresses:
        return {}
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(addresses))) as pool:
        answers = {name: pool.submit(read_host, ip, port, timeout_s) for name, ip in addresses.items()}
        return {name: future.result() for name, future in answers.items()}


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def chip_lines(hosts: Mapping[str, dict[str, Any]]) -> list[str]:
    """One line per host: each chip's duty cycle and HBM used/total (GiB), or why there is none."""
    lines = ["chips (duty cycle, HBM GiB used/total):"]
    for name, answer in hosts.items():
        if "error" in answer:
            lines.append(f"  {name}: {answer['error']}")
        elif not answer["chips"]:
            lines.append(f"  {name}: no figures (libtpu reports none while no program runs)")
        else:
            chips = "  ".join(
                f"{c['chip']}: {_pct(c['duty_cycle_pct'])} {_gib(c['hbm_used'])}/{_gib(c['hbm_total'])}"
                for c in answer["chips"]
            )
            lines.append(f"  {name}: {chips}")
    return lines
