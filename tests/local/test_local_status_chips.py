"""`rayslice local status` shows each TPU host's chips, and `--watch` shows it again until Ctrl-C."""

from __future__ import annotations

from click.testing import CliRunner

from rayslice.local import commands
from rayslice.local.simulation import status


def test_the_report_shows_each_hosts_chips_or_why_not():
    chip = {"chip": 0, "duty_cycle_pct": 97.4, "hbm_used": 3 * 2**30, "hbm_total": 32 * 2**30}
    report = {
        "run_id": "a1b2c3",
        "slices": 1,
        "accelerator_type": "v6e-8",
        "head": "slice",
        "network": "100.64.9.0/24",
        "dashboard": "http://100.64.9.2:8265",
        "hosts": [],
        "ray": {"error": "head dashboard not reachable"},
        "cloud": {"error": "no cloud API emulation"},
        "chips": {
            "s0-w0": {"chips": [chip]},
            "s0-w1": {"error": "no answer in 2 s"},
        },
    }
    lines = status.format_report(report).splitlines()
    assert "chips (duty cycle, HBM GiB used/total):" in lines
    assert "  s0-w0: 0: 97% 3.0/32.0" in lines
    assert "  s0-w1: no answer in 2 s" in lines


def test_watch_shows_the_status_again_until_ctrl_c(monkeypatch, tmp_path):
    shown: list[int] = []
    monkeypatch.setattr(commands, "_status_text", lambda where, as_json: f"report {len(shown)}")

    def sleep(seconds: float) -> None:
        shown.append(int(seconds))
        if len(shown) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(commands.time, "sleep", sleep)
    result = CliRunner().invoke(
        commands.local_group, ["status", "--state-dir", str(tmp_path), "--watch", "5"]
    )
    assert result.exit_code == 0, result.output
    assert shown == [5, 5, 5]
    assert "report 0" in result.output and "report 2" in result.output
    once = CliRunner().invoke(commands.local_group, ["status", "--state-dir", str(tmp_path)])
    assert once.exit_code == 0 and once.output.strip() == "report 3"
    assert CliRunner().invoke(commands.local_group, ["status", "--watch", "0.1"]).exit_code == 2
