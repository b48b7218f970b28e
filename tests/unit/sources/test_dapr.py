"""The dapr kind on its own: the envelope read as JSON too, and the app API token checked."""

from __future__ import annotations

from tests.senders.dapr import CONFIG, HEADERS, envelope
from tests.verdicts import assert_refused, messages_of, refusal_of, source_of

SOURCE = source_of(CONFIG, "orders")


async def test_plain_json_content_type_is_read_as_the_envelope() -> None:
    headers = {**HEADERS, "content-type": "application/json"}
    (message,) = (await messages_of(SOURCE, envelope("j1"), headers)).items
    assert message.message_id == '["checkout","j1"]'


async def test_wrong_or_missing_app_token_is_401_so_dapr_retries() -> None:
    wrong = await refusal_of(SOURCE, envelope(), {**HEADERS, "dapr-api-token": "not-the-token-000"})
    missing = await refusal_of(SOURCE, envelope(), {"content-type": "application/cloudevents+json"})
    assert_refused(wrong, 401, "dapr-api-token does not match")
    assert_refused(missing, 401, "missing dapr-api-token")
    # Answered as the 401 problem, not a DROP: Dapr retries it (a rotated token heals).
    assert SOURCE.answer_rejection(wrong) is None
    assert SOURCE.answer_rejection(missing) is None
