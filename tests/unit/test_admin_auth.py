"""Admin auth without a database: every admin route documented as such, token matching."""

from __future__ import annotations

from service.api.security import matching_token, token_fingerprint
from tests.admin_seed import ADMIN_ROUTES, route_template


def test_admin_routes_cover_the_openapi_admin_paths() -> None:
    from service.app import create_app
    from service.core.settings import Settings

    spec = create_app(Settings(database_url="postgresql://x/y")).openapi()
    documented = {
        (method.upper(), path)
        for path, operations in spec["paths"].items()
        if path.startswith("/admin")
        for method in operations
    }
    assert documented == {(m, route_template(p)) for m, p in ADMIN_ROUTES}
    for path, operations in spec["paths"].items():
        if path.startswith("/admin"):
            for operation in operations.values():
                assert "401" in operation["responses"]
                assert operation["summary"]


def test_token_matching_and_fingerprints() -> None:
    tokens = ["alpha-token", "beta-token"]
    assert matching_token("beta-token", tokens) == "beta-token"
    assert matching_token("beta-toke", tokens) is None
    assert matching_token("", tokens) is None
    assert matching_token("alpha-token", []) is None
    assert token_fingerprint("alpha-token") != token_fingerprint("beta-token")
    assert "alpha" not in token_fingerprint("alpha-token")
