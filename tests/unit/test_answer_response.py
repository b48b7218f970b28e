"""A recorded delivery's answer sets its fields itself: they must stay what Starlette's own
JSONResponse constructor makes of the same content, status and encoding."""

import pytest
from starlette.responses import JSONResponse

from service.api.ingest import AnswerResponse


class StarlettesWay(AnswerResponse):
    """AnswerResponse's encoding, through Starlette's constructor."""

    __init__ = JSONResponse.__init__  # type: ignore[assignment]


@pytest.mark.parametrize(
    "content",
    [
        {"status": "accepted", "id": 12345, "message_id": "evt_1"},
        {"status": "duplicate", "message_id": "caf\u00e9 \u2603"},
        {"results": [{"message_id": "a", "status": "accepted"}]},
        {"status": "accepted", "id": 1, "message_id": "lone \ud800 surrogate"},  # escaped JSON
    ],
)
@pytest.mark.parametrize("status", [200, 201, 204, 304, 103])
def test_the_answer_is_what_jsonresponses_constructor_makes(content: object, status: int) -> None:
    ours = AnswerResponse(content, status_code=status)
    theirs = StarlettesWay(content, status_code=status)
    assert ours.status_code == theirs.status_code
    assert ours.body == theirs.body
    assert ours.raw_headers == theirs.raw_headers
    assert ours.background is None
    assert ours.media_type == "application/json"
    assert dict(ours.headers) == dict(theirs.headers)
