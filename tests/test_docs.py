"""The documentation holds together: README.md is a front page (under 300 lines) whose quick
start gives the two commands CI and contributors run, and every relative link in README.md and
docs/*.md names a file that exists and, with a `#fragment`, a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    found: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = re.sub(r"[^a-z0-9 _-]", "", line.lstrip("#").strip().lower())
            found.add(title.replace(" ", "-"))
    return found


def test_anchors_follow_githubs_rule() -> None:
    page = REPO / "docs" / "observe.md"
    assert "managed-clusters-eks-gke-aks-exec-credential-plugins-and---context" in anchors(page)
    assert "with-akri_log_formatjson-in-the-daemonsets-env" not in anchors(page)  # in a fence


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{page.name}: {broken}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    unlinked = [p.name for p in PAGES[1:] if f"(docs/{p.name}" not in readme]
    assert not unlinked


def test_readme_is_a_front_page_with_the_quick_start_commands() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = quick.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    assert commands == ["scripts/just demo", "scripts/just test"]
    assert "bash scripts/just test" in (REPO / ".ci" / "run").read_text()
