"""The fault tables of docs/faults.md: each scenario a test runs, and the outcome it asserts.

A test module that runs fault scenarios declares one `FaultTable`, a section of the page between
``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``: each row is what is done to the host and, in
words, the outcome its test asserts. Tests never write the page (a test run must leave the
checkout as it was, and parallel workers would race on one file): tests/startup_scripts/
faults_page.py renders the page from the declarations, `scripts/write_faults_page.py` writes it,
and test_faults_page.py fails, naming the script, while the committed page differs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    scenario: str  # what is done, as the table shows it
    outcome: str  # what the test that runs the scenario asserts, in words


@dataclass(frozen=True)
class FaultTable:
    section: str
    faults: dict[str, Fault]  # id → row, in the page's order

    def markdown(self) -> str:
        rows = [f"| {fault.scenario} | {fault.outcome} |" for fault in self.faults.values()]
        return "\n".join(["| Scenario | Outcome |", "|---|---|", *rows])


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def section(page_text: str, name: str) -> str:
    """The text between the section's markers ("" when the page has no such section)."""
    begin, end = _markers(name)
    match = re.search(re.escape(begin) + "(.*?)" + re.escape(end), page_text, re.S)
    return match.group(1) if match else ""


def with_table(page_text: str, table: FaultTable) -> str:
    """The page with the table's section replaced by the table; the rest is kept as it is."""
    begin, end = _markers(table.section)
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(page_text):
        raise ValueError(f"the page has no {begin} … {end} section")
    return pattern.sub(lambda _: f"{begin}\n{table.markdown()}\n{end}", page_text)
