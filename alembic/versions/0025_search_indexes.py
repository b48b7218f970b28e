"""Search: the indexes that find a message by what it holds (issue 67).

- `inbox_payload(body)`: a delivery's body as jsonb, or NULL when it is not UTF-8 JSON. The
  body is stored as the sender's bytes (a signature covers them), so what is searched is this
  function of them, and a GIN index (`jsonb_ops`: keys and values, so that a JSONPath with
  `.**` is served too) over it answers containment (`@>`), `path=value`, `exists` and a value
  anywhere (`@?`). PL/pgSQL for its exception handler: a body that is not JSON (or nests
  past the server's stack) is indexed as NULL instead of failing its insert. A body over
  256 KiB is not searched: its entries would cost its insert more than the rest of ingest.
  The handler starts a subtransaction a call, which a parallel worker may not, hence
  PARALLEL UNSAFE; IMMUTABLE because the database's encoding,
  the one thing `convert_from` depends on, never changes under it.
- The stored headers' values (`jsonb_path_ops`: containment only, half the size).
- The dedup key's prefix, in byte order whatever the database's collation (`text_pattern_ops`).

Each is built while inserts wait, as 0003, 0006 and 0015 are; on a large inbox, build them
beforehand with CREATE INDEX CONCURRENTLY (docs/search.md, "On a large inbox"): IF NOT EXISTS
then skips them.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-14
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # As service.core.schema.PAYLOAD_FUNCTION writes it: OR REPLACE, for a database where an
    # operator created it beforehand (docs/search.md, "On a large inbox").
    op.execute(
        "CREATE OR REPLACE FUNCTION inbox_payload(body bytea) RETURNS jsonb "
        "LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL UNSAFE AS "
        "$$BEGIN IF octet_length(body) > 262144 THEN RETURN NULL; END IF; "
        "RETURN convert_from(body, 'UTF8')::jsonb; "
        "EXCEPTION WHEN OTHERS THEN RETURN NULL; END$$"
    )
    # A source's payloads are searched only when it asks (`search_payload`): the index costs
    # ingest about half its rate. Rows stored before then are not searchable by payload.
    op.execute(
        "ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS searchable boolean NOT NULL "
        "DEFAULT false"
    )
    op.execute(
        "CREATE INDEX IF NOT EXISTS inbox_messages_payload_idx ON inbox_messages "
        "USING gin (inbox_payload(body)) WHERE searchable"
    )
    # Without GIN's pending list: every delivery adds its dozen header entries at once,
    # rather than one insert in many merging megabytes of them while its batch waits (with
    # the list, bench/search --part ingest measured a p99 of 243 ms against 54 ms without
    # the search indexes).
    op.execute(
        "CREATE INDEX IF NOT EXISTS inbox_messages_headers_idx ON inbox_messages "
        "USING gin (headers jsonb_path_ops) WITH (fastupdate = off)"
    )
    op.execute(
        "CREATE INDEX IF NOT EXISTS inbox_messages_message_id_prefix_idx ON inbox_messages "
        "(message_id text_pattern_ops)"
    )


def downgrade() -> None:
    op.execute("DROP INDEX inbox_messages_message_id_prefix_idx")
    op.execute("DROP INDEX inbox_messages_headers_idx")
    op.execute("DROP INDEX inbox_messages_payload_idx")
    op.execute("ALTER TABLE inbox_messages DROP COLUMN searchable")
    op.execute("DROP FUNCTION inbox_payload(bytea)")
