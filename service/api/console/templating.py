"""Jinja2 for the console: autoescaping on for every template, so every message field (payload,
headers, ids, errors) reaches the page as text, never as markup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.responses import HTMLResponse

from service.api.console import views
from service.api.console.assets import asset_url

TEMPLATES_DIR = Path(__file__).parent / "templates"

environment = Environment(
    loader=FileSystemLoader(TEMPLATES_DIR),
    autoescape=True,  # every template, whatever its name
    undefined=StrictUndefined,  # a misspelt name fails the test that renders it
    trim_blocks=True,
    lstrip_blocks=True,
)
environment.globals.update(asset_url=asset_url, url=views.url)
environment.filters.update(when=views.when, age=views.age, ago=views.ago, duration=views.duration)


def render_html(template: str, **context: Any) -> str:
    return environment.get_template(template).render(**context)


def page(
    template: str,
    *,
    title: str,
    csrf: str | None,
    nav: str = "",
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    """A whole page; `csrf` is the session's token (None before sign-in: no navigation)."""
    html = render_html(template, title=title, csrf=csrf, nav=nav, **context)
    return HTMLResponse(html, status_code=status_code)


def fragment(template: str, **context: Any) -> HTMLResponse:
    """A part of a page that its script refreshes in place."""
    return HTMLResponse(render_html(template, **context))
