"""The messages bench/search fills its inbox with: one INSERT of rows `$1`..`$2` of the series,
each row a function of its number `g` alone, so that a resumed or grown fill writes what a
single fill would have.

Three sources in turn (g % 3: stripe, github, shopify), bodies of about 1 KB of JSON as each
provider sends them, stored headers of about 450 bytes (lowercase names, signatures redacted,
as ingest stores them), 10,000 customers (g % 10,000); 1 % dead after 5 attempts (g % 100 = 0),
the rest processed at their first; one attempt row each.

Received times: one message every 259.2 ms, so that the 10 M inbox spans the 30 days issue 67
asks for (a day is 333,333 messages, as in ../shared/research/scale-10m.md), the 10,000,000th
at the anchor (`$3`, the first fill's start). Rows are newest last at every size and never
after the first fill, whatever the order of the fills (1 M, then 3 M, then 10 M writes the
same rows as 10 M at once); a smaller inbox spans less and is older: 1 M spans 30 to 27 days
before the anchor. A query over
"the last day" should count back from the inbox's newest `received_at`, not from now().
Ids follow g, with a gap where a batch was rolled back (the identity does not go back).
"""

from __future__ import annotations

from collections.abc import Iterable

from service.processing.fingerprints import fingerprint

SOURCES = ("stripe", "github", "shopify")
CUSTOMERS = 10_000
PACE_US = 259_200  # 30 days / 10,000,000
ANCHORED_ROW = 10_000_000
ACTOR = "worker:bench-search:1"
# A dead message's last failure, by (g / 100) % 3, with its `error`.
FAILURES = (
    ("ValueError", "amount must be positive"),
    ("KeyError", "'customer'"),
    ("TimeoutError", "fulfilment API did not answer within 10 s"),
)


def text_array(values: Iterable[str]) -> str:
    """An SQL array literal of `values` (ours, quoted here)."""
    quoted = ", ".join("'" + value.replace("'", "''") + "'" for value in values)
    return f"ARRAY[{quoted}]"


def fingerprints() -> dict[str, str]:
    """`source/error_type` -> the service's fingerprint of that failure (no handler or frame)."""
    return {
        f"{source}/{error_type}": fingerprint(source, error_type).key
        for source in SOURCES
        for error_type, _ in FAILURES
    }


# Per row: its number g, customer c, kind k (a source's event type), and time `at`. The
# LATERAL's branches, one a kind of delivery, each keep their row by a filter on g, so that the
# identity keeps the series' order (ids newest last, as the received times).
INSERT_MESSAGES = f"""
WITH series AS (
    SELECT g, g % {CUSTOMERS} AS c, (g / 3) % 8 AS k, g % 100 = 0 AS dead,
           $3::timestamptz - ({ANCHORED_ROW} - g) * interval '{PACE_US} microseconds' AS at,
           md5('delivery' || g) AS d, md5('commit' || g) AS sha
      FROM generate_series($1::bigint, $2::bigint) AS g
), shaped AS (
    SELECT s.*, r.*, to_char(s.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS iso,
           ({text_array(f[0] for f in FAILURES)})[(s.g / 100) % 3 + 1] AS error_type,
           ({text_array(f[1] for f in FAILURES)})[(s.g / 100) % 3 + 1] AS error
      FROM series AS s
     CROSS JOIN LATERAL (
        SELECT 'stripe' AS source, 'evt_' || s.g AS message_id,
               (ARRAY['charge.succeeded', 'charge.refunded', 'invoice.paid',
                      'invoice.payment_failed', 'customer.subscription.created',
                      'customer.subscription.updated', 'payment_intent.succeeded',
                      'payment_intent.payment_failed'])[s.k + 1] AS event_type
         WHERE s.g % 3 = 0
        UNION ALL
        SELECT 'github', concat_ws('-', substr(s.d, 1, 8), substr(s.d, 9, 4), substr(s.d, 13, 4),
                                   substr(s.d, 17, 4), substr(s.d, 21, 12)),
               CASE WHEN s.k % 4 = 3
                    THEN 'pull_request.'
                         || (ARRAY['opened', 'synchronize', 'closed'])[s.g / 24 % 3 + 1]
                    ELSE 'push' END
         WHERE s.g % 3 = 1
        UNION ALL
        SELECT 'shopify', concat_ws('-', substr(s.d, 1, 8), substr(s.d, 9, 4), substr(s.d, 13, 4),
                                    substr(s.d, 17, 4), lpad(to_hex(s.g), 12, '0')),
               (ARRAY['orders/create', 'orders/paid', 'orders/updated', 'orders/fulfilled'])
                   [s.k % 4 + 1]
         WHERE s.g % 3 = 2
     ) AS r
), bodies AS (
    SELECT shaped.*,
           CASE source WHEN 'stripe' THEN {{stripe}}
                       WHEN 'github' THEN CASE WHEN event_type = 'push' THEN {{push}}
                                               ELSE {{pull_request}} END
                       ELSE {{shopify}} END AS body_text,
           CASE source WHEN 'stripe' THEN {{stripe_headers}}
                       WHEN 'github' THEN {{github_headers}}
                       ELSE {{shopify_headers}} END AS raw_headers
      FROM shaped
), inserted AS (
    INSERT INTO inbox_messages (source, message_id, event_type, status, attempts, received_at,
                                last_received_at, next_attempt_at, processed_at, last_error,
                                headers, body, content_type)
    SELECT source, message_id, event_type, CASE WHEN dead THEN 'dead' ELSE 'processed' END,
           CASE WHEN dead THEN 5 ELSE 1 END, at, at,
           CASE WHEN dead THEN at + interval '31 minutes' ELSE at END,
           CASE WHEN dead THEN NULL ELSE at + (20 + g % 480) * interval '1 millisecond' END,
           CASE WHEN dead THEN error_type || ': ' || error END,
           raw_headers || jsonb_build_object('content-length', octet_length(body_text)::text),
           convert_to(body_text, 'UTF8'), 'application/json'
      FROM bodies
    RETURNING id, source, status, next_attempt_at, processed_at, last_error
)
-- One attempt a message: a processed one's first, or a dead one's fifth and last.
INSERT INTO inbox_attempts (message_id, attempt, started_at, finished_at, outcome, error_type,
                            error, traceback, duration_ms, actor, fingerprint)
SELECT id, CASE WHEN status = 'dead' THEN 5 ELSE 1 END,
       coalesce(processed_at - interval '12 milliseconds', next_attempt_at),
       coalesce(processed_at, next_attempt_at + interval '40 milliseconds'),
       CASE WHEN status = 'dead' THEN 'dead' ELSE 'processed' END,
       split_part(last_error, ': ', 1), substr(last_error, strpos(last_error, ': ') + 2),
       CASE WHEN status = 'dead' THEN
           'Traceback (most recent call last):' || chr(10) ||
           '  File "handlers/' || source || '.py", line 42, in handle' || chr(10) ||
           '    record(payload)' || chr(10) || last_error END,
       CASE WHEN status = 'dead' THEN 40 ELSE 12 END,
       '{ACTOR}', $4::jsonb ->> (source || '/' || split_part(last_error, ': ', 1))
  FROM inserted
"""

STRIPE = """format(
    '{"id": "evt_%1$s", "object": "event", "api_version": "2024-06-20", "created": %2$s, '
    '"data": {"object": {"id": "%3$s_%1$s", "object": "%4$s", "amount": %5$s, '
    '"amount_captured": %5$s, "amount_refunded": 0, "balance_transaction": "txn_%1$s", '
    '"billing_details": {"address": {"city": "Springfield", "country": "US", '
    '"line1": "%6$s Main Street", "line2": null, "postal_code": "%7$s", "state": "IL"}, '
    '"email": "cust%8$s@example.com", "name": "Customer %8$s", "phone": null}, '
    '"captured": true, "created": %2$s, "currency": "usd", "customer": "cus_%8$s", '
    '"description": "Order ord_%1$s", "invoice": "in_%1$s", "livemode": false, '
    '"metadata": {"order_id": "ord_%1$s", "cart_id": "cart_%9$s"}, "paid": true, '
    '"payment_intent": "pi_%1$s", "payment_method": "pm_%1$s", '
    '"payment_method_details": {"card": {"brand": "visa", "country": "US", '
    '"exp_month": %10$s, "exp_year": %11$s, "fingerprint": "%12$s", "funding": "credit", '
    '"last4": "%13$s", "network": "visa"}, "type": "card"}, '
    '"receipt_email": "cust%8$s@example.com", '
    '"receipt_url": "https://pay.stripe.com/receipts/acct_1AcmeStore/%3$s_%1$s", '
    '"statement_descriptor": "ACME STORE", "status": "succeeded"}}, "livemode": false, '
    '"pending_webhooks": 1, "request": {"id": "req_%1$s", "idempotency_key": "%14$s"}, '
    '"type": "%15$s"}',
    g, extract(epoch FROM at)::bigint, (ARRAY['ch', 'in', 'sub', 'pi'])[k / 2 + 1],
    (ARRAY['charge', 'invoice', 'subscription', 'payment_intent'])[k / 2 + 1],
    500 + g * 7919 % 100000, 100 + c % 900, lpad((60000 + c)::text, 5, '0'), c,
    left(d, 12), 1 + c % 12, 2027 + c % 5, left(md5('card' || c), 16),
    lpad((c * 37 % 10000)::text, 4, '0'), right(d, 16), event_type)"""

PUSH = """format(
    '{"ref": "refs/heads/%1$s", "before": "%2$s", "after": "%3$s", '
    '"repository": {"id": %4$s, "name": "repo-%5$s", "full_name": "acme/repo-%5$s", '
    '"private": true, "owner": {"login": "acme", "id": 1000, "type": "Organization"}, '
    '"html_url": "https://github.com/acme/repo-%5$s", "default_branch": "main", '
    '"visibility": "private"}, '
    '"pusher": {"name": "user-%6$s", "email": "user-%6$s@users.noreply.github.com"}, '
    '"organization": {"login": "acme", "id": 1000}, '
    '"sender": {"login": "user-%6$s", "id": %7$s, "type": "User", "site_admin": false}, '
    '"created": false, "deleted": false, "forced": false, "base_ref": null, '
    '"compare": "https://github.com/acme/repo-%5$s/compare/%8$s...%9$s", '
    '"head_commit": {"id": "%3$s", "tree_id": "%10$s", "distinct": true, '
    '"message": "Fix #%11$s: retry the export of module_%12$s", "timestamp": "%13$s", '
    '"url": "https://github.com/acme/repo-%5$s/commit/%3$s", '
    '"author": {"name": "User %6$s", "email": "user-%6$s@example.com", '
    '"username": "user-%6$s"}, "added": [], "removed": [], '
    '"modified": ["src/module_%12$s.py", "tests/test_module_%12$s.py"]}}',
    CASE WHEN g % 5 = 0 THEN 'main' ELSE 'feature/' || g % 500 END, md5('commit' || (g - 3)),
    sha, 700000 + g % 200, g % 200, c, 5000000 + c, left(md5('commit' || (g - 3)), 12),
    left(sha, 12), md5('tree' || g), g % 5000, g % 300, iso)"""

PULL_REQUEST = """format(
    '{"action": "%1$s", "number": %2$s, "pull_request": {"id": %3$s, "number": %2$s, '
    '"state": "%4$s", "locked": false, "title": "Retry the export of module_%5$s", '
    '"user": {"login": "user-%6$s", "id": %7$s, "type": "User"}, '
    '"body": "Retries the export when the warehouse answers 503; closes #%8$s.", '
    '"created_at": "%9$s", "updated_at": "%9$s", "merged": %10$s, "draft": false, '
    '"head": {"ref": "feature/%11$s", "sha": "%12$s"}, "base": {"ref": "main", "sha": "%13$s"}, '
    '"html_url": "https://github.com/acme/repo-%14$s/pull/%2$s", "comments": %15$s, '
    '"commits": %16$s, "additions": %17$s, "deletions": %18$s, "changed_files": %16$s}, '
    '"repository": {"id": %19$s, "name": "repo-%14$s", "full_name": "acme/repo-%14$s", '
    '"private": true, "owner": {"login": "acme", "id": 1000, "type": "Organization"}, '
    '"html_url": "https://github.com/acme/repo-%14$s", "default_branch": "main"}, '
    '"organization": {"login": "acme", "id": 1000}, '
    '"sender": {"login": "user-%6$s", "id": %7$s, "type": "User", "site_admin": false}}',
    split_part(event_type, '.', 2), g % 5000, 90000000 + g,
    CASE WHEN event_type = 'pull_request.closed' THEN 'closed' ELSE 'open' END, g % 300, c,
    5000000 + c, g % 4000, iso,
    CASE WHEN event_type = 'pull_request.closed' THEN 'true' ELSE 'false' END, g % 500, sha,
    md5('base' || g), g % 200, g % 7, 1 + g % 9, g % 400, g % 90, 700000 + g % 200)"""

SHOPIFY = """format(
    '{"id": %1$s, "admin_graphql_api_id": "gid://shopify/Order/%1$s", "name": "#%2$s", '
    '"order_number": %2$s, "email": "cust%3$s@example.com", "created_at": "%4$s", '
    '"updated_at": "%4$s", "currency": "USD", "financial_status": "paid", '
    '"fulfillment_status": null, "subtotal_price": "%5$s", "total_tax": "%6$s", '
    '"total_price": "%7$s", "total_discounts": "0.00", "tags": "", "test": false, '
    '"customer": {"id": %3$s, "email": "cust%3$s@example.com", "first_name": "Customer", '
    '"last_name": "%3$s", "orders_count": %8$s, "state": "enabled", "verified_email": true}, '
    '"line_items": [{"id": %9$s, "product_id": %10$s, "sku": "SKU-%10$s", '
    '"title": "Product %10$s", "quantity": %11$s, "price": "%12$s", '
    '"requires_shipping": true, "taxable": true}, {"id": %13$s, "product_id": %14$s, '
    '"sku": "SKU-%14$s", "title": "Product %14$s", "quantity": 1, "price": "%15$s", '
    '"requires_shipping": true, "taxable": true}], '
    '"shipping_address": {"first_name": "Customer", "last_name": "%3$s", '
    '"address1": "%16$s Market Street", "city": "San Francisco", "province": "California", '
    '"country": "United States", "zip": "94103", "country_code": "US", '
    '"province_code": "CA"}, "shipping_lines": [{"code": "standard", "price": "5.00", '
    '"title": "Standard"}], "source_name": "web"}',
    g, 1000 + g, c, iso, ((20000 + g % 5000) / 100.0)::numeric(10, 2),
    ((1600 + g % 400) / 100.0)::numeric(10, 2),
    ((22100 + g % 5000 + g % 400) / 100.0)::numeric(10, 2), 1 + g % 40, 2 * g,
    1000 + g % 700, 1 + g % 3, ((10000 + g % 2500) / 100.0)::numeric(10, 2), 2 * g + 1,
    2000 + g % 900, ((10000 + g % 2500) / 100.0)::numeric(10, 2),
    100 + c % 900)"""

STRIPE_HEADERS = """jsonb_build_object(
    'host', 'inbox.example.com', 'accept', '*/*; q=0.5, application/xml',
    'user-agent', 'Stripe/1.0 (+https://stripe.com/docs/webhooks)',
    'content-type', 'application/json; charset=utf-8', 'cache-control', 'no-cache',
    'stripe-signature', '[redacted]', 'x-forwarded-for', '54.187.174.' || g % 256,
    'x-forwarded-proto', 'https', 'x-request-id', md5('request' || g),
    'traceparent', '00-' || d || '-' || left(sha, 16) || '-01')"""

GITHUB_HEADERS = """jsonb_build_object(
    'host', 'inbox.example.com', 'accept', '*/*', 'user-agent', 'GitHub-Hookshot/a1b2c3d',
    'content-type', 'application/json', 'x-github-event', split_part(event_type, '.', 1),
    'x-github-delivery', message_id, 'x-github-hook-id', (400000000 + g % 200)::text,
    'x-github-hook-installation-target-id', (700000 + g % 200)::text,
    'x-github-hook-installation-target-type', 'repository',
    'x-hub-signature', '[redacted]', 'x-hub-signature-256', '[redacted]',
    'x-forwarded-for', '140.82.115.' || g % 256)"""

SHOPIFY_HEADERS = """jsonb_build_object(
    'host', 'inbox.example.com', 'accept', '*/*', 'user-agent', 'Shopify-Captain-Hook',
    'content-type', 'application/json', 'x-shopify-topic', event_type,
    'x-shopify-shop-domain', 'shop-' || g % 50 || '.myshopify.com',
    'x-shopify-webhook-id', message_id, 'x-shopify-api-version', '2024-07',
    'x-shopify-triggered-at', iso, 'x-shopify-event-id', md5('event' || g),
    'x-shopify-hmac-sha256', '[redacted]', 'x-forwarded-for', '23.227.38.' || g % 256)"""

INSERT = INSERT_MESSAGES.format(
    stripe=STRIPE,
    push=PUSH,
    pull_request=PULL_REQUEST,
    shopify=SHOPIFY,
    stripe_headers=STRIPE_HEADERS,
    github_headers=GITHUB_HEADERS,
    shopify_headers=SHOPIFY_HEADERS,
)
