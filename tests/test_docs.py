"""The README and docs/: short README, links that resolve, no stale counts, nothing outside the repo.

A clone of this repository is all a reader has: a link must land on a file in it, and no doc or
code may point at notes that only sat beside the team's checkouts.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
README_LIMIT = 8000
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]

# Written in pieces so this file does not match itself.
OUTSIDE_REFERENCES = ("../" + "shared", "FACTS" + ".md", "ARCHITECTURE" + ".md")
TEXT_SUFFIXES = {".py", ".md", ".j2", ".sh", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".ini", ".json"}
SKIP_DIRS = {".git", ".venv", ".state", ".wheelhouse", "build", "dist", "__pycache__", ".pytest_cache"}

# [text](target) and [label]: target; images too. Angle-bracket autolinks are always absolute.
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
TEST_COUNT = re.compile(r"\b\d[\d,]*\s+(?:tests?|test cases)\b", re.I)


def _prose(text: str) -> str:
    """The page without its fenced code blocks (a link inside code is not a link)."""
    return FENCE.sub("", text)


def relative_links(text: str) -> list[str]:
    """Every link target in a Markdown page that points into the repository (no scheme, no bare anchor)."""
    prose = _prose(text)
    targets = INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)
    return [t for t in targets if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t) and not t.startswith("#")]


def _repository_files() -> list[Path]:
    """Files of the repository: tracked plus untracked-but-not-ignored (git), else a filtered walk."""
    if (REPO / ".git").exists():
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout.decode()
        return [REPO / p for p in out.split("\0") if p and (REPO / p).is_file()]
    files = []
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        files += [Path(root) / n for n in names]
    return files


def test_the_link_parser_finds_relative_links_and_skips_urls_anchors_and_code():
    text = (
        'See [arch](docs/architecture.md#flow), ![img](docs/a.png "t") and [web](https://x.org/a.md).\n'
        "[top](#top) <https://example.com>\n"
        "[ref]: docs/decisions.md\n"
        "```bash\n[not a link](nowhere.md)\n```\n"
    )
    assert relative_links(text) == ["docs/architecture.md#flow", "docs/a.png", "docs/decisions.md"]


def test_readme_is_short():
    size = len(README.read_text(encoding="utf-8"))
    assert size <= README_LIMIT, (
        f"README.md has {size} characters; keep it at most {README_LIMIT} (move detail to docs/)"
    )


def test_docs_exist_beside_the_readme():
    names = {p.name for p in DOCS}
    assert {"README.md", "architecture.md", "decisions.md", "benchmarks.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_to_a_file_in_the_repository(page):
    broken = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(REPO) or not path.is_file():
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)} links to what is not a file in the repository: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_test_count_in_prose(page):
    found = TEST_COUNT.findall(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(REPO)} states test counts, which go stale: {found}"


def test_nothing_points_outside_the_repository():
    offenders = []
    for path in _repository_files():
        if path.suffix not in TEXT_SUFFIXES and path.name != "README":
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        offenders += [f"{path.relative_to(REPO)}: {ref}" for ref in OUTSIDE_REFERENCES if ref in text]
    assert not offenders, "these cite files that are not in the repository: " + "; ".join(offenders)


# A tracker's numbers mean nothing to a reader of a clone: name the rule, page or test instead.
TRACKER_REFERENCE = re.compile(r"\b(?:issue|defect)s?\s+#?\d+", re.I)


def _shipped_text_files() -> list[Path]:
    """The package (every file), docs/ and the README: what a user of a clone reads."""
    shipped = []
    for path in _repository_files():
        relative = path.relative_to(REPO)
        if relative.parts[0] in {"rayslice", "docs"} or relative == Path("README.md"):
            shipped.append(path)
    return shipped


def test_the_tracker_pattern_matches_numbered_references_only():
    assert TRACKER_REFERENCE.findall("fixed in Issue 23, item 3; see defect 7 and issues #4")
    assert not TRACKER_REFERENCE.findall("an issue with 2 hosts; no defect; issue-free in 10 s")


def test_no_tracker_numbers_in_the_package_docs_or_readme():
    offenders = []
    for path in _shipped_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        offenders += [f"{path.relative_to(REPO)}: {m}" for m in TRACKER_REFERENCE.findall(text)]
    assert not offenders, (
        "these cite a tracker's numbers, which a reader of a clone cannot follow; "
        "name the rule, page or test instead: " + "; ".join(offenders)
    )


def test_the_docs_index_lists_every_page():
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    listed = {target.split("#", 1)[0] for target in relative_links(index)}
    missing = [p.name for p in DOCS if p.name != "README.md" and p.name not in listed]
    assert not missing, f"docs/README.md does not list {missing}; add a line for each"
