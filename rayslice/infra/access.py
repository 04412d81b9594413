"""The exact commands a user runs next: SSH and IAP tunnels to hosts, fetching the Ray token.

Hosts have no external IP and the firewall admits SSH only from IAP, so every command goes
through ``--tunnel-through-iap``. Which command has that flag differs by platform:

- Compute Engine instances (``compute`` hosts and the CPU head VM): GA ``gcloud compute ssh``
  has it (cloud.google.com/sdk/gcloud/reference/compute/ssh).
- Cloud TPU VMs (``tpu-vm``): GA ``gcloud compute tpus tpu-vm ssh`` does NOT; its synopsis
  lists ``--internal-ip`` only (cloud.google.com/sdk/gcloud/reference/compute/tpus/tpu-vm/ssh).
  The alpha command has ``--tunnel-through-iap``
  (cloud.google.com/sdk/gcloud/reference/alpha/compute/tpus/tpu-vm/ssh), so TPU VM commands
  use ``gcloud alpha`` (a user may need ``gcloud components install alpha``).
 The Ray dashboard binds to the head's internal address
(the boot script passes ``--dashboard-host``), so the tunnel forwards a local port to that
address rather than to the head's localhost. Pure functions of strings: the cluster applies
them to its outputs, tests call them directly.
"""

from __future__ import annotations

import shlex

from rayslice.names import DASHBOARD_PORT


def _scope(zone: str, project: str | None) -> list[str]:
    return [f"--zone={zone}", *([f"--project={project}"] if project else [])]


def _forward(head_ip: str) -> list[str]:
    return ["--", "-N", "-L", f"{DASHBOARD_PORT}:{head_ip}:{DASHBOARD_PORT}"]


# The gcloud release track whose `compute tpus tpu-vm ssh` has --tunnel-through-iap.
TPU_VM_SSH_TRACK = "alpha"


def tpu_ssh(slice_name: str, zone: str, project: str | None, worker: str = "0") -> str:
    """SSH to one host of a TPU VM slice (``worker="all"`` runs a command on every host)."""
    return shlex.join(
        [
            "gcloud",
            TPU_VM_SSH_TRACK,
            "compute",
            "tpus",
            "tpu-vm",
            "ssh",
            slice_name,
            *_scope(zone, project),
            f"--worker={worker}",
            "--tunnel-through-iap",
        ]
    )


def vm_ssh(instance: str, zone: str, project: str | None) -> str:
    """SSH to a Compute Engine VM: the CPU head, or a host of a ``compute`` slice."""
    return shlex.join(["gcloud", "compute", "ssh", instance, *_scope(zone, project), "--tunnel-through-iap"])


def tpu_dashboard_tunnel(slice_name: str, zone: str, project: str | None, head_ip: str) -> str:
    """Forward localhost:8265 to the Ray dashboard / Jobs API on worker 0 of a slice."""
    return f"{tpu_ssh(slice_name, zone, project)} {shlex.join(_forward(head_ip))}"


def vm_dashboard_tunnel(instance: str, zone: str, project: str | None, head_ip: str) -> str:
    """Forward localhost:8265 to the Ray dashboard / Jobs API on the CPU head VM."""
    return f"{vm_ssh(instance, zone, project)} {shlex.join(_forward(head_ip))}"


def jobs_api_address(head_ip: str) -> str:
    """The Ray Jobs API (and dashboard) address inside the VPC."""
    return f"http://{head_ip}:{DASHBOARD_PORT}"


def local_jobs_api_address() -> str:
    """The Jobs API address on the user's machine while a dashboard tunnel runs."""
    return f"http://localhost:{DASHBOARD_PORT}"


def token_command(secret: str, project: str | None) -> str:
    """Print the Ray token (for RAY_AUTH_TOKEN) from Secret Manager; needs secretAccessor."""
    return shlex.join(
        [
            "gcloud",
            "secrets",
            "versions",
            "access",
            "latest",
            f"--secret={secret}",
            *([f"--project={project}"] if project else []),
        ]
    )
