"""Every relative link in README.md and docs/ points at a file that exists, and at a heading
that exists when it names one (GitHub's anchors: lower case, punctuation dropped, spaces to
hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks, inline code removed."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return lines


def anchor(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if match := re.match(r"^#{1,6}\s+(.*)$", line):
            found.add(anchor(match.group(1)))
    return found


def relative_links(path: Path) -> list[str]:
    targets = []
    for line in prose(path):
        for target in LINK.findall(line):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                targets.append(target)
    return targets


def test_the_documents_exist() -> None:
    names = {p.relative_to(REPO).as_posix() for p in DOCUMENTS}
    assert {"README.md", "docs/contracts.md", "docs/architecture.md", "docs/benchmarks.md"} <= names


def test_the_anchor_rule_matches_githubs() -> None:
    assert anchor("Contract 1 — UsageSample") == "contract-1--usagesample"
    assert anchor("`month_end.py`") == "month_endpy"
    assert anchor("Known gaps") == "known-gaps"


@pytest.mark.parametrize("document", [pytest.param(p, id=p.relative_to(REPO).as_posix()) for p in DOCUMENTS])
def test_relative_links_resolve(document: Path) -> None:
    broken = []
    for target in relative_links(document):
        file_part, _, fragment = target.partition("#")
        linked = (document.parent / file_part).resolve() if file_part else document
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{document.relative_to(REPO)}: " + "; ".join(broken)
