"""What the documentation tests share: the repository's markdown pages, their headings and
anchors, and their fenced blocks.

An *anchor* is the id a renderer gives a heading, so that `page.md#anchor` can point at it.
GitHub (which renders README.md and the pages in the repository) and MkDocs (which builds
docs/ as a site, mkdocs.yml) make them differently, so a page knows both sets.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DOCS",
    "REPO",
    "Fence",
    "Page",
    "fences",
    "github_slug",
    "markdown_files",
    "mkdocs_slug",
    "page",
]

REPO = Path(__file__).resolve().parents[3]
DOCS = REPO / "docs"

_FENCE_OPEN = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
_ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_COMMENT = re.compile(r"^\s*<!--\s*(.*?)\s*-->\s*$")
_INLINE_MARKUP = re.compile(r"[`*_]|<[^>]+>")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


@dataclass(frozen=True, slots=True)
class Fence:
    """A fenced code block: its info string, its body and the markers right above it."""

    path: Path
    line: int  # 1-based line of the opening fence
    info: str
    body: str
    markers: frozenset[str]  # the HTML comments (`<!-- cluster-only -->`) just above the fence

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


@dataclass(frozen=True, slots=True)
class Page:
    """A markdown file's headings (as text) and the anchors both renderers give them."""

    path: Path
    headings: tuple[str, ...]
    github_anchors: frozenset[str]
    mkdocs_anchors: frozenset[str]

    def has_anchor(self, anchor: str) -> bool:
        """True when `anchor` works where the page is read: on GitHub, and on the site too for
        a page under docs/."""
        if anchor not in self.github_anchors:
            return False
        return not self.path.is_relative_to(DOCS) or anchor in self.mkdocs_anchors


def github_slug(heading: str) -> str:
    """GitHub's heading id: lower case, punctuation but hyphens dropped, each space a hyphen."""
    text = heading.strip().lower()
    text = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return text.replace(" ", "-")


def mkdocs_slug(heading: str) -> str:
    """Python-Markdown's `toc` slugify, the MkDocs default: ASCII only, runs of spaces and
    hyphens as one hyphen."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _heading_text(raw: str) -> str:
    """A heading as a reader sees it: links as their text, no code or emphasis markers."""
    return _INLINE_MARKUP.sub("", _LINK.sub(r"\1", raw)).strip()


def _unique(slugs: list[str], *, sep: str) -> frozenset[str]:
    """Repeated headings get numbered ids (`-1` on GitHub, `_1` in MkDocs)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for slug in slugs:
        count = seen.get(slug, 0)
        out.add(slug if count == 0 else f"{slug}{sep}{count}")
        seen[slug] = count + 1
    return frozenset(out)


def _fence_spans(lines: list[str]) -> list[tuple[int, int, re.Match[str]]]:
    """(first line, closing line, opening match) of each fenced block, 0-based; an unclosed
    fence runs to the end of the file, as CommonMark reads it."""
    spans: list[tuple[int, int, re.Match[str]]] = []
    i = 0
    while i < len(lines):
        match = _FENCE_OPEN.match(lines[i])
        if not match:
            i += 1
            continue
        char, width = match["fence"][0], len(match["fence"])
        closing = re.compile(rf" {{0,3}}{re.escape(char)}{{{width},}}\s*")
        end = i + 1
        while end < len(lines) and not closing.fullmatch(lines[end]):
            end += 1
        spans.append((i, end, match))
        i = end + 1
    return spans


def _outside_fences(lines: list[str]) -> list[str]:
    """The lines with every fenced block blanked (a `#` in a shell block is no heading)."""
    out = list(lines)
    for first, last, _ in _fence_spans(lines):
        out[first : last + 1] = [""] * len(out[first : last + 1])
    return out


@functools.cache
def page(path: Path) -> Page:
    """The headings and anchors of one markdown file (read once)."""
    headings = [
        _heading_text(match[2])
        for line in _outside_fences(path.read_text(encoding="utf-8").splitlines())
        if (match := _ATX_HEADING.match(line))
    ]
    return Page(
        path=path,
        headings=tuple(headings),
        github_anchors=_unique([github_slug(h) for h in headings], sep="-"),
        mkdocs_anchors=_unique([mkdocs_slug(h) for h in headings], sep="_"),
    )


def markdown_files() -> list[Path]:
    """The repository's own markdown: the top level's and docs/'s."""
    return sorted(REPO.glob("*.md")) + sorted(DOCS.rglob("*.md"))


def fences(path: Path) -> list[Fence]:
    """Every fenced block of a markdown file, with the HTML comments right above it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Fence] = []
    for first, last, match in _fence_spans(lines):
        markers: set[str] = set()
        above = first - 1
        while above >= 0 and (comment := _HTML_COMMENT.match(lines[above])):
            markers.add(comment[1])
            above -= 1
        out.append(
            Fence(
                path=path,
                line=first + 1,
                info=match["info"].lower(),
                body="\n".join(lines[first + 1 : last]),
                markers=frozenset(markers),
            )
        )
    return out
