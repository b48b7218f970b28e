"""The READMEs and the pages under docs/ link only to what exists: every relative link names a
file of the repository, and every `#fragment` one of the target page's headings, as GitHub
makes their anchors."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")])

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
# `[text](target)` and `[text](target "title")`; an image's `![alt](src)` is a link too.
LINK = re.compile(r"\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, ...


def prose(text: str) -> str:
    """The page without its fenced code blocks, where nothing is a link or a heading."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, inline markup and punctuation
    (but `-` and `_`) dropped, each space a `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated one gets `-1`, `-2`, ... as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for match in HEADING.finditer(prose(page.read_text())):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    text = CODE_SPAN.sub("", prose(page.read_text()))
    return [m.group(1) for m in LINK.finditer(text) if not EXTERNAL.match(m.group(1))]


def test_the_pages_are_found() -> None:
    assert ROOT / "docs" / "benchmarks.md" in PAGES
    assert len(PAGES) > 5


def test_slug_follows_github() -> None:
    assert slug("Issue 13: a plain insert first (2026-12-04 10:00\u201312:05)") == (
        "issue-13-a-plain-insert-first-2026-12-04-10001205"
    )
    assert slug("`ctx.insert`: a row without a model") == "ctxinsert-a-row-without-a-model"
    assert slug("bench/ingest on `7045b8a`") == "benchingest-on-7045b8a"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        file = (page.parent / unquote(path)).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif fragment and file.suffix == ".md" and unquote(fragment) not in anchors(file):
            broken.append(f"{target}: no such heading in {file.relative_to(ROOT)}")
    assert not broken, broken


def section(page: Path, anchor: str) -> str:
    """The text under the heading whose anchor is `anchor`, up to the next heading."""
    text = prose(page.read_text())
    headings = list(HEADING.finditer(text))
    for match, following in zip(headings, [*headings[1:], None], strict=True):
        if slug(match.group(1)) == anchor:
            return text[match.end() : following.start() if following else len(text)]
    raise AssertionError(f"no heading #{anchor} in {page.relative_to(ROOT)}")


@pytest.mark.parametrize(
    ("phrase", "subject"),
    [
        ("in order", "order"),
        ("rate limit", "rate_limit"),
        ("be paused by an operator", "pause"),
        ("a forward that is", "breaker"),
    ],
)
def test_the_readme_links_each_thing_a_source_can_do_to_where_it_is_documented(
    phrase: str, subject: str
) -> None:
    readme = (ROOT / "README.md").read_text()
    after = readme[readme.index(phrase) :]
    target = LINK.search(after)
    assert target is not None
    path, _, fragment = target.group(1).partition("#")
    assert subject in section(ROOT / path, fragment).lower(), target.group(1)


CODE = sorted(p for top in ("service", "tests", "bench") for p in (ROOT / top).rglob("*.py"))
# `docs/handlers.md` or `docs/handlers.md#ordering-keys` in a comment or docstring.
CITATION = re.compile(r"\bdocs/([\w.-]+\.md)(?:#([\w-]+))?")
# A section of a specification that was never in the repository (written so that this file
# does not cite it itself).
SPEC_SECTION = re.compile(r"\bSPEC \u00a7")


def test_code_cites_only_docs_pages_and_headings_that_exist() -> None:
    broken = []
    for path in CODE:
        name = str(path.relative_to(ROOT))
        text = path.read_text()
        cites_spec = bool(SPEC_SECTION.search(text))
        if cites_spec:
            broken.append(f"{name}: cites a SPEC section; name the docs page instead")
        for page, fragment in CITATION.findall(text):
            target = ROOT / "docs" / page
            if not target.exists():
                broken.append(f"{name}: docs/{page}: no such page")
            elif fragment and fragment not in anchors(target):
                broken.append(f"{name}: docs/{page}#{fragment}: no such heading")
    assert not broken, broken
