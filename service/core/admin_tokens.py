"""Admin tokens: from `INBOX_ADMIN_TOKENS`, or one generated on first start and kept on disk.

Apart from the HTTP layer's checks (`service.api.security`) because `serve`'s supervisor prints
the token in its banner, and needs no FastAPI for that.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from service.core.settings import Settings

TOKEN_FILE = "admin-token"


def token_path(settings: Settings) -> Path:
    return settings.data_dir / TOKEN_FILE


def ensure_admin_tokens(settings: Settings) -> tuple[list[str], Path | None]:
    """The admin tokens in force, and the file holding a generated one (None when configured)."""
    configured = [t.get_secret_value() for t in settings.admin_tokens]
    if configured:
        return configured, None
    path = token_path(settings)
    if not path.exists():
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        # Write aside, then link into place: two processes starting at once must agree on one
        # token, and neither may read a half-written file.
        scratch = path.with_name(f".{TOKEN_FILE}.{os.getpid()}")
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        try:
            os.link(scratch, path)
        except FileExistsError:
            pass
        finally:
            scratch.unlink()
    return [path.read_text().strip()], path
