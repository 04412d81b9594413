"""The fault table in docs/faults.md: scenario → outcome, written by the tests that ran them.

Each suite owns one section of the page, between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``,
and rewrites it only when every scenario of that section ran and passed in the session, so the
page never mixes a fresh row with a stale one.
"""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "faults.md"


class FaultTable:
    def __init__(self, section: str, scenarios: dict[str, str]):
        self.section = section
        self.scenarios = scenarios  # id → scenario as the table shows it
        self.outcomes: dict[str, str] = {}

    def record(self, scenario: str, outcome: str) -> None:
        assert scenario in self.scenarios, scenario
        self.outcomes[scenario] = outcome

    def complete(self) -> bool:
        return set(self.outcomes) == set(self.scenarios)

    def markdown(self) -> str:
        rows = [f"| {self.scenarios[key]} | {self.outcomes[key]} |" for key in self.scenarios]
        return "\n".join(["| Scenario | Outcome |", "|---|---|", *rows])

    def write(self, page: Path = PAGE) -> None:
        begin, end = f"<!-- {self.section}:begin -->", f"<!-- {self.section}:end -->"
        text = page.read_text()
        pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise AssertionError(f"{page} has no {begin} … {end} section")
        page.write_text(pattern.sub(lambda _: f"{begin}\n{self.markdown()}\n{end}", text))


def section(page_text: str, name: str) -> str:
    match = re.search(f"<!-- {name}:begin -->(.*?)<!-- {name}:end -->", page_text, re.S)
    return match.group(1) if match else ""
