"""References to markdown documents hold: the file exists, and so does the part it points at.

A reference is any of these, in code comments and docstrings, manifests and the markdown
itself:

* a path from the repository root to a page under docs/ or to a top-level page, with or
  without an anchor (`docs/usage.md#dractl`, `README.md#the-local-stack`);
* a numbered section of a page that numbers its sections (`docs/contracts.md §4.1`);
* a section named by its heading in quotes (`docs/install.md, "The image"`,
  `README "The local stack"`);
* a relative link in a markdown page (`[Checkpoint](checkpoint.md)`, `[x](#the-local-stack)`).

A reference that no longer holds sends its reader nowhere, so each is a failure here, naming
the file and line.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.unit.docs import pages

# Where references live: the code and manifests, plus the markdown (top level and docs/).
SCANNED_DIRS = ("services", "shared", "devcluster", "bench", "scripts", "deploy", "tests")
SCANNED_FILES = ("Makefile", "Dockerfile", "docker-compose.yml", "pyproject.toml", "mkdocs.yml")
SKIPPED_PARTS = frozenset({"__pycache__", ".pytest_cache", "node_modules"})
SKIPPED_SUFFIXES = frozenset({".pyc", ".so", ".png", ".jpg", ".gz", ".tar", ".bin", ".whl"})

_PAGE = r"(?:docs/[\w./-]+?\.md|README\.md|CONTRIBUTING\.md|CHANGELOG\.md)"
# A path from the repository root; not the tail of a longer path (deploy/.../README.md).
_PATH_REF = re.compile(rf"(?<![\w/.-])(?P<page>{_PAGE})(?:#(?P<anchor>[\w-]+))?")
# A page, then (across a comment's line break) `§` and a section number.
_SECTION_REF = re.compile(
    r"(?<![\w/.-])(?P<page>docs/[\w-]+\.md)`?[\s#/,(]*§\s?(?P<number>\d+(?:\.\d+)?)"
)
# A page (README without its suffix too), an optional `'s` or comma, then a heading in quotes
# that may run onto the comment's next line.
_TITLE_REF = re.compile(
    r"(?<![\w/.\"-])(?P<page>docs/[\w-]+\.md|README(?:\.md)?|CONTRIBUTING(?:\.md)?)`?(?:'s)?,?"
    r"[ \t]+\"(?P<title>[^\"\n]{2,80}(?:\n[ \t]*(?:#|//)?[ \t]*[^\"\n]{1,80})?)\""
)
_MD_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\((?P<target>[^)\s]+)\)")
_COMMENT_BREAK = re.compile(r"\s*\n[ \t]*(?:#|//)?[ \t]*")


@dataclass(frozen=True, slots=True)
class Ref:
    """One reference: where it is written, the page it names and what in that page."""

    source: Path
    line: int
    page: Path
    anchor: str = ""
    number: str = ""
    title: str = ""

    @property
    def where(self) -> str:
        return f"{self.source.relative_to(pages.REPO)}:{self.line}"

    @property
    def target(self) -> str:
        """The page as the repository names it (or as resolved, when outside it)."""
        inside = self.page.is_relative_to(pages.REPO)
        return str(self.page.relative_to(pages.REPO) if inside else self.page)


def _scanned_files() -> Iterator[Path]:
    for name in SCANNED_DIRS:
        for path in sorted((pages.REPO / name).rglob("*")):
            if (
                path.is_file()
                and not SKIPPED_PARTS.intersection(path.parts)
                and path.suffix not in SKIPPED_SUFFIXES
            ):
                yield path
    for name in SCANNED_FILES:
        if (pages.REPO / name).is_file():
            yield pages.REPO / name
    yield from pages.markdown_files()


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _refs_in(path: Path, text: str) -> Iterator[Ref]:
    for match in _PATH_REF.finditer(text):
        yield Ref(
            source=path,
            line=_line(text, match.start()),
            page=pages.REPO / match["page"],
            anchor=match["anchor"] or "",
        )
    for match in _SECTION_REF.finditer(text):
        yield Ref(
            source=path,
            line=_line(text, match.start()),
            page=pages.REPO / match["page"],
            number=match["number"],
        )
    for match in _TITLE_REF.finditer(text):
        name = match["page"]
        yield Ref(
            source=path,
            line=_line(text, match.start()),
            page=pages.REPO / (name if name.endswith(".md") else f"{name}.md"),
            title=_COMMENT_BREAK.sub(" ", match["title"]).strip(),
        )
    if path.suffix == ".md":
        for match in _MD_LINK.finditer(text):
            target = match["target"]
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            yield Ref(
                source=path,
                line=_line(text, match.start()),
                page=(path.parent / file_part).resolve() if file_part else path,
                anchor=anchor,
            )


@functools.cache
def all_refs() -> tuple[Ref, ...]:
    """Every reference in the scanned files (read once per test session)."""
    refs: list[Ref] = []
    for path in _scanned_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable: no prose in it
        refs.extend(_refs_in(path, text))
    return tuple(refs)


def _section_numbers(page: pages.Page) -> set[str]:
    """`4`, `4.1`, ... of headings that start with their number (`## 4. resource.k8s.io/v1`)."""
    numbers: set[str] = set()
    for heading in page.headings:
        match = re.match(r"(\d+(?:\.\d+)*)\.?\s", heading)
        if match:
            numbers.add(match[1])
    return numbers


def _names_heading(title: str, page: pages.Page) -> bool:
    """A quoted title names a heading when it is the heading, or the heading's start up to a
    word boundary ("Signed records" for "Signed records: values that prove their writer")."""
    wanted = title.replace("`", "").lower()
    for heading in page.headings:
        have = heading.lower()
        if have == wanted or (have.startswith(wanted) and not have[len(wanted)].isalnum()):
            return True
    return False


def test_the_scan_finds_references_of_every_kind() -> None:
    refs = all_refs()
    # Guards the patterns themselves: a regex that matched nothing would pass every test below.
    assert sum(1 for r in refs if r.source.suffix == ".py") > 100
    assert sum(1 for r in refs if r.number) > 30
    assert sum(1 for r in refs if r.title) > 5
    assert sum(1 for r in refs if r.anchor) > 50


def test_every_referenced_page_exists() -> None:
    missing = sorted(f"{r.where}: {r.target}" for r in all_refs() if not r.page.exists())
    assert not missing, "references to files that do not exist:\n" + "\n".join(missing)


def test_every_anchor_names_a_heading() -> None:
    broken = sorted(
        f"{r.where}: {r.target}#{r.anchor}"
        for r in all_refs()
        if r.anchor and r.page.suffix == ".md" and r.page.exists()
        if not pages.page(r.page).has_anchor(r.anchor)
    )
    assert not broken, "anchors that no heading has (GitHub and MkDocs ids):\n" + "\n".join(broken)


def test_every_section_number_exists() -> None:
    broken = sorted(
        f"{r.where}: {r.target} §{r.number}"
        for r in all_refs()
        if r.number and r.page.exists()
        if r.number not in _section_numbers(pages.page(r.page))
    )
    assert not broken, "numbered sections that the page does not have:\n" + "\n".join(broken)


def test_every_quoted_section_title_is_a_heading() -> None:
    broken = sorted(
        f'{r.where}: {r.target} "{r.title}"'
        for r in all_refs()
        if r.title and r.page.exists()
        if not _names_heading(r.title, pages.page(r.page))
    )
    assert not broken, "quoted section titles that the page has no heading for:\n" + "\n".join(
        broken
    )


@pytest.mark.parametrize(
    ("heading", "github", "mkdocs"),
    [
        ("Why is my pod Pending? `dractl explain`", "why-is-my-pod-pending-dractl-explain", None),
        ("3.4 `npu-smi info -t topo`", "34-npu-smi-info--t-topo", "34-npu-smi-info-t-topo"),
        ("Install options: the components", "install-options-the-components", None),
    ],
)
def test_slugs_follow_each_renderer(heading: str, github: str, mkdocs: str | None) -> None:
    text = heading.replace("`", "")
    assert pages.github_slug(text) == github
    assert pages.mkdocs_slug(text) == (mkdocs or github)


def _nav_pages(entries: object) -> Iterator[str]:
    """The page files a mkdocs.yml `nav` names, at any depth."""
    if isinstance(entries, str):
        yield entries
    elif isinstance(entries, list):
        for entry in entries:
            yield from _nav_pages(entry)
    elif isinstance(entries, dict):
        for value in entries.values():
            yield from _nav_pages(value)


def test_the_site_nav_lists_every_page_once() -> None:
    # mkdocs build --strict (make lint) fails on a page left out; this says so without it.
    config = yaml.safe_load((pages.REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = list(_nav_pages(config["nav"]))
    on_disk = sorted(str(p.relative_to(pages.DOCS)) for p in pages.DOCS.rglob("*.md"))
    assert sorted(listed) == on_disk
    assert listed[0] == "index.md"
