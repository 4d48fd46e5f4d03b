"""The README and the docs link only to files that exist: a renamed results folder or document
breaks a test, not a reader's click."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "scripts").rglob("*.md")])
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")  # [text](target) and ![alt](target), anchors dropped


def links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]


def test_the_link_pattern_finds_relative_links_and_skips_web_ones():
    text = "see [a](docs/a.md), ![p](img/p.png), [b](b.md#part), [web](https://x.org/a.md)"
    assert links(text) == ["docs/a.md", "img/p.png", "b.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_in_the_repository(doc):
    missing = [t for t in links(doc.read_text()) if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links to missing files: {missing}"
