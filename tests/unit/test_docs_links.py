"""Every relative link of the README and docs/ leads somewhere: the file exists in the
repository and, for a `page.md#anchor` link, the page has a heading with that anchor (as
GitHub makes it: lower case, punctuation dropped, spaces to hyphens, `-1`, `-2` for repeats).
The README points into docs/ and the pages point at each other; a section moved or renamed
must take its links along."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*```.*?^\s*```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading's text."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (code blocks hold no headings)."""
    seen: dict[str, int] = {}
    found = set()
    for match in re.finditer(r"^#{1,6}\s+(.+)$", FENCE.sub("", text), re.M):
        name = anchor(match.group(1))
        count = seen.get(name, 0)
        seen[name] = count + 1
        found.add(name if count == 0 else f"{name}-{count}")
    return found


def broken(page: Path, text: str) -> list[str]:
    """The relative links of ``text`` (the page at ``page``) that lead nowhere, and why."""
    problems = []
    for link in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto:
            continue
        path, _, name = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists() or ROOT not in (target, *target.parents):
            problems.append(f"{link}: no such file")
        elif name and target.suffix == ".md" and name not in anchors(target.read_text()):
            problems.append(f"{link}: {target.relative_to(ROOT)} has no heading #{name}")
    return problems


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_to_a_file_and_heading(page: Path) -> None:
    assert broken(page, page.read_text()) == []


def test_the_readme_links_into_docs() -> None:
    """The scan finds the README's links (a scan that found none would prove nothing)."""
    linked = {link.partition("#")[0] for link in LINK.findall((ROOT / "README.md").read_text())}
    assert {"docs/commands.md", "docs/runbook.md", "docs/inventory.md"} <= linked


def test_the_readme_stays_a_front_page() -> None:
    """The README is what the toolkit is, the two set-up commands, a first deploy, the exit
    codes and links into docs/, in at most 200 lines; the rest lives in docs/."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, "README.md is over 200 lines: move detail into docs/"
    for heading in ("## Set-up on a fresh Debian 12 machine (as root)", "## A first deploy",
                    "## Exit codes"):
        assert f"\n{heading}\n" in text, heading
    assert "bash scripts/demo" in text and "bash scripts/test" in text


def test_a_wrong_link_is_caught() -> None:
    """The check itself fails on a missing page, a missing anchor; a heading's anchor is
    GitHub's (code spans, dots and slashes dropped; repeats numbered)."""
    page = ROOT / "docs" / "commands.md"
    assert broken(page, "[a](nowhere.md) [b](runbook.md#no-such-step) [c](../README.md#exit-codes)"
                  ) == ["nowhere.md: no such file",
                        "runbook.md#no-such-step: docs/runbook.md has no heading #no-such-step"]
    assert anchors("# A\n## From a step in `tasks/*.yml` to its code\n## A\n```\n# no\n```\n") \
        == {"a", "from-a-step-in-tasksyml-to-its-code", "a-1"}
