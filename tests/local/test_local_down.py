"""`rayslice local down` removes the simulation whatever its record holds: collecting the record
(which its hosts wrote part of) may fail in any way, and the removal still happens, with one
warning line instead of a traceback."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rayslice import cli
from rayslice.local import commands
from rayslice.local.simulation import recording


@pytest.mark.parametrize(
    "failure", [RecursionError("deep"), KeyError("x"), OSError(5, "EIO"), TypeError("t")]
)
def test_down_destroys_even_when_collecting_the_record_fails(
    failure: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    destroyed: list[str] = []
    sim = SimpleNamespace(
        plan=SimpleNamespace(run_id="ab12cd", hosts=["h0"], bridge="rs-br0"),
        destroy=lambda: destroyed.append("ab12cd"),
    )

    def collect(_sim: object) -> str:
        raise failure

    monkeypatch.setattr(commands, "require_root", lambda: None)
    monkeypatch.setattr(commands, "_open", lambda state_dir: sim)
    monkeypatch.setattr(recording, "collect", collect)
    assert cli.main(["local", "down", "--state-dir", str(Path("/nonexistent"))]) == 0
    out, err = capsys.readouterr()
    assert destroyed == ["ab12cd"]
    assert "removed simulation ab12cd" in out
    assert "its record could not be completed" in out and "Traceback" not in out + err
