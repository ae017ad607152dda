"""Every repository path the docs cite exists, and every relative link between them resolves.

A doc that names a module, test, benchmark or chart that was moved or removed sends the next
reader to nothing; this reads README.md, BENCHMARKS.md and docs/*.md the way a reader would.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
TREES = ("probes", "tests", "benchmarks", "charts", "scripts", "targets", "docs")
PATH_SUFFIXES = (".py", ".md", ".yaml", ".yml")
# File names the docs use for the user's own files or a command's output, not the repository's.
NOT_REPOSITORY_FILES = {"probe.yaml", "report.md"}

_CODE = re.compile(r"```.*?```", re.S)
_INLINE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def _tracked_names() -> set[str]:
    names = {p.name for p in ROOT.iterdir() if p.is_file()}
    for tree in TREES:
        names.update(p.name for p in (ROOT / tree).rglob("*") if "__pycache__" not in p.parts)
    return names


def _cited_paths(text: str) -> set[str]:
    """Tokens of inline code that read as repository paths (`probes/x.py`, `benchmarks/y.py
    --quick`, `_gclog.py`), with a pytest node id or a trailing colon cut off."""
    found = set()
    for span in _INLINE.findall(_CODE.sub("", text)):
        for token in span.split():
            token = token.split("::", 1)[0].rstrip(",;:.)").lstrip("(")
            if any(c in token for c in "*<>{}$=|\\"):
                continue
            if token.startswith(tuple(t + "/" for t in TREES)) or token.endswith(PATH_SUFFIXES):
                found.add(token)
    return found


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _CODE.sub("", path.read_text())
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_path_exists(doc: Path) -> None:
    names = _tracked_names()
    missing = []
    for token in sorted(_cited_paths(doc.read_text())):
        if "/" in token:
            if not (ROOT / token).exists():
                missing.append(token)
        elif token not in names and token not in NOT_REPOSITORY_FILES:
            missing.append(token)
    assert not missing, f"{doc.name} cites paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in _LINK.findall(_CODE.sub("", doc.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s) and mailto: not the repository's
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists() or (dest.suffix == ".md" and anchor and anchor not in _anchors(dest)):
            broken.append(target)
    assert not broken, f"{doc.name} has links that resolve to nothing: {broken}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    # A page nobody links to is a page a newcomer never finds.
    linked = {t.partition("#")[0] for t in _LINK.findall(_CODE.sub("", DOCS[0].read_text()))}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages and not pages - linked, sorted(pages - linked)


def test_the_checks_see_a_missing_path_and_a_broken_anchor(tmp_path: Path) -> None:
    # The scanner itself: a moved module and a renamed heading must both be caught.
    assert _cited_paths("see `probes/gone.py` and `.venv/bin/python benchmarks/x.py --quick`") \
        == {"probes/gone.py", "benchmarks/x.py"}
    assert _cited_paths("```\n`probes/in_a_block.py`\n```\nplain probes/not_code.py") == set()
    assert _slug("The gate arithmetic: how long a decision takes") \
        == "the-gate-arithmetic-how-long-a-decision-takes"
    assert _slug("`skewprobe run`") == "skewprobe-run"
    page = tmp_path / "page.md"
    page.write_text("# Real heading\n\n```\n# not a heading\n```\n")
    assert _anchors(page) == {"real-heading"}
