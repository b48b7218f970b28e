"""Signing in to the console over HTTP and reading its forms, for the console's HTTP tests."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import httpx

from tests.admin_seed import TOKEN

CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    match = CSRF_FIELD.search(html)
    assert match is not None, "no CSRF field on the page"
    return match.group(1)


async def sign_in(client: httpx.AsyncClient, token: str = TOKEN, base: str = "") -> str:
    """Sign in through the form; returns the signed-in session's CSRF token."""
    form = await client.get(f"{base}/console/sign-in")
    assert form.status_code == 200
    response = await client.post(
        f"{base}/console/sign-in",
        data={"csrf_token": csrf_of(form.text), "token": token, "next": "/console/"},
    )
    assert response.status_code == 303, response.text
    overview = await client.get(f"{base}/console/")
    assert overview.status_code == 200
    return csrf_of(overview.text)


class PageParts(HTMLParser):
    """The parts of a page that could run code: script elements, event handler attributes,
    inline styles, `javascript:` links."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.handlers: list[str] = []
        self.inline_styles = 0
        self.script_links: list[str] = []
        self.elements: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append(tag)
        if tag == "script":
            self.scripts.append(dict(attrs))
        if tag == "style":
            self.inline_styles += 1
        for name, value in attrs:
            if name.startswith("on"):
                self.handlers.append(f"{tag} {name}")
            if name == "style":
                self.inline_styles += 1
            if name in ("href", "src", "action") and (value or "").lower().startswith(
                "javascript:"
            ):
                self.script_links.append(value or "")


def page_parts(html: str) -> PageParts:
    parser = PageParts()
    parser.feed(html)
    return parser
