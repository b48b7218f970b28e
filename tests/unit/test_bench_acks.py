"""bench/ingest's stored-ids check rests on `bench.load.read_acks`: wrk logs the body of every
2xx answer, and a log read wrongly would let the check pass on ids it never saw."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bench.load import LoadResult, read_acks


def load_result(acked: int) -> LoadResult:
    return LoadResult(
        requests=acked,
        duration_s=1.0,
        p50_ms=1.0,
        p90_ms=1.0,
        p99_ms=1.0,
        max_ms=1.0,
        non_2xx=0,
        socket_errors=0,
        wrapped=0,
        acked=acked,
        logged=0,
    )


def write_logs(tmp_path: Path, *threads: list[str]) -> list[Path]:
    logs = []
    for n, lines in enumerate(threads):
        log = tmp_path / f"ack{n}"
        log.write_text("".join(line + "\n" for line in lines))
        logs.append(log)
    return logs


def test_the_answers_are_read_into_outcomes_ids_and_ids_accepted_twice(tmp_path: Path) -> None:
    logs = write_logs(
        tmp_path,
        [
            '{"status":"accepted","id":1,"message_id":"a"}',
            '{"status":"duplicate","message_id":"a"}',
            '{"status":"accepted","id":2,"message_id":"b"}',
        ],
        ['{"status":"accepted","id":3,"message_id":"b"}'],
    )
    result = load_result(acked=4)
    read_acks(result, logs)
    assert result.outcomes == Counter({"accepted": 3, "duplicate": 1})
    assert result.acked_ids == {"a", "b"}
    assert result.accepted_twice == ["b"]
    assert (result.logged, result.log_complete) == (4, True)
    assert not any(log.exists() for log in logs)


def test_answers_naming_no_message_are_lines_but_not_logged(tmp_path: Path) -> None:
    # A baseline's fixed answer, and a body that is not JSON at all (a service answering so
    # fails the check: bench/ingest requires every 2xx to be logged).
    logs = write_logs(tmp_path, ['{"status":"accepted"}', "not json", "[1]"])
    result = load_result(acked=3)
    read_acks(result, logs)
    assert (result.logged, result.log_complete, result.acked_ids) == (0, True, set())


def test_a_log_missing_answers_wrk_counted_is_incomplete(tmp_path: Path) -> None:
    logs = write_logs(tmp_path, ['{"status":"accepted","id":1,"message_id":"a"}'])
    result = load_result(acked=2)
    read_acks(result, logs)
    assert (result.logged, result.log_complete) == (1, False)
