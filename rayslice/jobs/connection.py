"""Where a job goes and how the client reaches it: the Jobs API address and the token for it.

The token question is answered by where the address came from: the simulated slice's token goes
to the simulated slice only; an address the user names gets the token file the user names (or
whatever Ray's own `RAY_AUTH_*` variables say), never the simulator's.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import requests.utils

from rayslice import addresses, clusters
from rayslice.errors import InvalidInput, NoCluster, NoCredentials
from rayslice.names import DASHBOARD_PORT
from rayslice.observability.record import RECORD_ENV

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

# Ray's client adds the token from its own environment when this variable says "token".
RAY_AUTH_MODE_ENV = "RAY_AUTH_MODE"


@dataclass(frozen=True)
class Target:
    """Where a job will go: the Jobs API URL, the token file for it (if any), and how it was found."""

    url: str
    token_file: Path | None
    source: str  # "--address", "RAY_ADDRESS" or "simulator"
    # Where `rayslice run` records the job (rayslice.observability.record): the simulation's
    # record, else $RAYSLICE_RECORD; None: not recorded.
    record: str | None = None


def jobs_url(address: str) -> str:
    """Accept `http(s)://host:port`, `host:port` or a bare host (dashboard port 8265)."""
    if "://" in address:
        return address.rstrip("/")
    return f"http://{address}" if ":" in address else f"http://{address}:{DASHBOARD_PORT}"


def simulated_cluster() -> tuple[str, Path | None] | None:
    """(dashboard URL, token file) of the simulated slice in the default state dir, if one is up.

    The simulator registers its finder (`rayslice.clusters`); a client installed without the
    simulator has none and gets None.
    """
    found = clusters.find()
    return None if found is None else (found.dashboard_url, found.token_file)


def simulated_record() -> str | None:
    """The simulated cluster's record location, if one is up and keeps one."""
    found = clusters.find()
    return None if found is None else found.record


def choose_target(address: str | None, token_file: Path | None) -> Target:
    """--address, else RAY_ADDRESS, else the simulated slice; its token only in the last case.

    A token never goes over plain http to an address outside the user's own networks
    (`refuse_clear_text_token`).
    """
    recorded = os.environ.get(RECORD_ENV) or None
    if address:
        target = Target(jobs_url(address), token_file, "--address", recorded)
    elif os.environ.get("RAY_ADDRESS"):
        target = Target(jobs_url(os.environ["RAY_ADDRESS"]), token_file, "RAY_ADDRESS", recorded)
    else:
        found = simulated_cluster()
        if found is None:
            raise NoCluster(
                "no Ray cluster to submit to: start the simulated slice with `rayslice local up`, "
                "or pass --address http://HEAD:8265 (or set RAY_ADDRESS)"
            )
        url, simulator_token = found
        target = Target(url, token_file or simulator_token, "simulator", recorded or simulated_record())
    refuse_clear_text_token(target)
    return target


def sends_token(target: Target) -> bool:
    """Whether requests to `target` carry a token: ours from a token file, or Ray's own when its
    client runs in token mode (it then adds the token it finds in its environment)."""
    return target.token_file is not None or os.environ.get(RAY_AUTH_MODE_ENV, "").lower() == "token"


_TUNNEL_HINT = (
    "Open the dashboard tunnel instead (`pulumi stack output dashboard_tunnel_command`, see "
    "docs/run.md) and pass --address http://localhost:8265, or use an https:// address"
)


def refuse_clear_text_token(target: Target) -> None:
    """`InvalidInput` (exit 2) when a token would cross the network in clear: plain http to an
    address that is not loopback, private or shared address space, or through a proxy at such an
    address. The bearer token gives root on every host, so it travels in clear only inside the
    user's own networks; from anywhere else the dashboard is reached through the tunnel the
    deploy pages describe (then it is http://localhost:8265).

    The proxy is the one the requests library, which Ray's Jobs client and `restarts` use, takes
    from the environment for this URL (``http_proxy``, ``all_proxy`` and ``no_proxy``, in either
    case: `proxy_for`). A plain http request through a proxy is sent to the proxy whole, headers
    included, so the proxy must be internal too."""
    url = urllib.parse.urlsplit(target.url)
    if url.scheme != "http" or not sends_token(target):
        return
    host = url.hostname or ""
    public = [str(a) for a in _addresses(host) if not addresses.is_internal(a)]
    if public:
        raise InvalidInput(
            f"refusing to send the Ray token over plain http to {target.url} ({host} is "
            f"{', '.join(public)}, not a private address): anyone on the way could read it and run "
            f"code as root on every host. {_TUNNEL_HINT}"
        )
    proxy = proxy_for(target.url)
    if proxy is None:
        return
    proxy_host = proxy.hostname or ""
    public = [str(a) for a in _addresses(proxy_host) if not addresses.is_internal(a)]
    if public:
        where = f"{proxy_host}:{proxy.port}" if proxy.port else proxy_host  # never its credentials
        raise InvalidInput(
            f"refusing to send the Ray token over plain http to {target.url} through the proxy "
            f"{where} that the environment names (http_proxy/HTTP_PROXY or all_proxy; {proxy_host} "
            f"is {', '.join(public)}, not a private address): the proxy and everyone on the way to "
            f"it could read the token. Add {host} to NO_PROXY to go direct. {_TUNNEL_HINT}"
        )


def proxy_for(url: str) -> urllib.parse.SplitResult | None:
    """The proxy the requests library would send a request for `url` through, from the
    environment; None when it goes direct (no proxy set, or `url`'s host is in ``no_proxy``).
    requests 2.x: `get_environ_proxies` (None for a bypassed host, `should_bypass_proxies`) and
    `select_proxy` (the scheme's proxy, else ``all``), as `Session.request` applies them."""
    chosen = requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url, no_proxy=None))
    if not chosen:
        return None
    return urllib.parse.urlsplit(chosen if "://" in chosen else f"http://{chosen}")


def _addresses(host: str) -> list[addresses.Address]:
    """The IP addresses `host` names: itself if it is one, else what it resolves to now (none
    when it does not resolve; the connection then fails before any token is sent)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


def auth_headers(token_file: Path | None) -> dict[str, str]:
    """The Authorization header for a token file; none without one (Ray's own env then applies)."""
    if token_file is None:
        return {}
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise InvalidInput(f"cannot read token file {token_file}: {exc.strerror}") from None
    if not token:
        raise InvalidInput(f"token file {token_file} is empty")
    return {"Authorization": f"Bearer {token}"}


def connect(target: Target) -> JobSubmissionClient:
    """A Jobs API client for `target`; `NoCredentials` or `NoCluster` (exit 3) when it cannot be had."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(target.url, headers=auth_headers(target.token_file))
    except AuthenticationError as exc:
        given = f"the token in {target.token_file} was refused" if target.token_file else "no token was sent"
        raise NoCredentials(
            f"the Ray cluster at {target.url} uses token auth and {given}: pass --token-file F with the "
            f"cluster's token ({str(exc).splitlines()[0]})"
        ) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise NoCluster(f"no Ray cluster reachable at {target.url}: {exc}") from None
