"""The log handler: INFO lines of one event-loop turn leave in one write, in order."""

from __future__ import annotations

import asyncio
import io
import logging

from service.core.logging import JsonFormatter, LoopBatchedStreamHandler


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def logger_with(stream: CountingStream) -> logging.Logger:
    handler = LoopBatchedStreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"test-batched-{id(stream)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def events(stream: CountingStream) -> list[str]:
    import json

    return [json.loads(line)["event"] for line in stream.getvalue().splitlines()]


def test_info_lines_of_one_loop_turn_are_written_together_after_it() -> None:
    stream = CountingStream()
    log = logger_with(stream)

    async def main() -> tuple[int, int]:
        for n in range(30):
            log.info(f"delivery {n}")
        during = stream.writes
        await asyncio.sleep(0)  # the turn ends: the held lines go out
        await asyncio.sleep(0)
        return during, stream.writes

    during, after = asyncio.run(main())
    assert (during, after) == (0, 1)
    assert events(stream) == [f"delivery {n}" for n in range(30)]


def test_a_warning_goes_out_at_once_after_the_lines_held_before_it() -> None:
    stream = CountingStream()
    log = logger_with(stream)

    async def main() -> list[str]:
        log.info("first")
        log.warning("second")
        return events(stream)

    assert asyncio.run(main()) == ["first", "second"]


def test_off_the_loop_a_line_is_written_at_once() -> None:
    stream = CountingStream()
    log = logger_with(stream)
    log.info("no loop here")
    assert events(stream) == ["no loop here"]


def test_lines_held_when_the_process_shuts_down_are_flushed() -> None:
    stream = CountingStream()
    log = logger_with(stream)

    async def main() -> None:
        log.info("last words")
        log.handlers[0].flush()  # what logging.shutdown() does at exit

    asyncio.run(main())
    assert events(stream) == ["last words"]
