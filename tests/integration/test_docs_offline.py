"""`/docs` and `/redoc` work offline: every script, style and icon they load is the service's."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from tests.conftest import AppFactory


class References(HTMLParser):
    """Every `src` and `href` of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("/docs", {"swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"}),
        ("/redoc", {"redoc.standalone.js", "favicon.png"}),
    ],
)
async def test_the_api_docs_load_only_same_origin_assets_and_those_are_served(
    client_for: AppFactory, page: str, expected: set[str]
) -> None:
    async with client_for({}) as client:
        response = await client.get(page)
        assert response.status_code == 200
        html = response.text
        parser = References()
        parser.feed(html)
        assert {url.rsplit("/", 1)[-1] for url in parser.urls} == expected
        assert all(url.startswith("/docs/static/") for url in parser.urls), parser.urls
        # Nor does a script on the page name another origin (a CDN, fonts, a spec validator).
        assert re.findall(r"""["'](?:https?:)?//[^"']+""", html) == []
        assert "'/openapi.json'" in html or '"/openapi.json"' in html
        for url in parser.urls:
            asset = await client.get(url)
            assert asset.status_code == 200, url
            assert len(asset.content) > 100, url
        spec = await client.get("/openapi.json")
    assert spec.status_code == 200
    # The pages themselves are not API operations.
    assert page not in spec.json()["paths"]
