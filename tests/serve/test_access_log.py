"""The access log's queue is bounded: a log output that stalls drops lines and says how many."""

from __future__ import annotations

import io
import json
import logging
import threading

from plait.serve.middleware import MESSAGE_ONLY, AccessLog, BatchedStreamHandler, access_logger


class _StalledOutput(logging.Handler):
    """A log output that blocks on its first line until released, as a stuck pipe does."""

    def __init__(self) -> None:
        super().__init__()
        self.unstick = threading.Event()
        self.blocked = threading.Event()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.blocked.set()
        self.unstick.wait(timeout=30)
        self.lines.append(record.getMessage())


def test_a_stalled_output_drops_lines_beyond_the_queue_and_says_how_many() -> None:
    output = _StalledOutput()
    access_logger.addHandler(output)
    level = access_logger.level
    access_logger.setLevel(logging.INFO)
    try:
        log = AccessLog(max_queued=5)
        log.add(("first", "POST", "/p", 200, 0.001, None))
        assert output.blocked.wait(timeout=30)  # the writer holds "first", stuck in the output
        for n in range(12):
            log.add((f"r{n}", "POST", "/p", 200, 0.001, ("127.0.0.1", 5000)))
        assert log.dropped == 7  # 5 queued behind the stuck line, the other 7 dropped
        output.unstick.set()
        log.close()
    finally:
        access_logger.removeHandler(output)
        access_logger.setLevel(level)
    written = [json.loads(line) for line in output.lines]
    ids = [line["request_id"] for line in written if "request_id" in line]
    assert ids == ["first", "r0", "r1", "r2", "r3", "r4"]
    assert {"dropped_lines": 7} in written


def test_closing_does_not_wait_for_good_on_an_output_that_stays_stuck() -> None:
    output = _StalledOutput()
    access_logger.addHandler(output)
    level = access_logger.level
    access_logger.setLevel(logging.INFO)
    try:
        log = AccessLog(max_queued=2)
        for n in range(4):
            log.add((f"r{n}", "POST", "/p", 200, 0.001, None))
        assert output.blocked.wait(timeout=30)
        log.close(wait=0.05)  # returns although the writer is still stuck
        assert output.lines == []
    finally:
        access_logger.removeHandler(output)  # the writer left behind must not reach later tests
        output.unstick.set()
        access_logger.setLevel(level)
        for writer in threading.enumerate():
            if writer.name == "plait-access-log":
                writer.join(timeout=30)


def test_nothing_is_dropped_while_the_output_keeps_up() -> None:
    output = _StalledOutput()
    output.unstick.set()
    access_logger.addHandler(output)
    level = access_logger.level
    access_logger.setLevel(logging.INFO)
    try:
        log = AccessLog(max_queued=5)
        for n in range(50):
            log.add((f"r{n}", "GET", "/healthz", 200, 0.0, None))
            if n % 4 == 3:
                log.close()  # drains: each batch of 4 fits the queue
    finally:
        log.close()
        access_logger.removeHandler(output)
        access_logger.setLevel(level)
    assert log.dropped == 0
    assert [json.loads(line)["request_id"] for line in output.lines] == [f"r{n}" for n in range(50)]


def _lines_written(
    handler: logging.Handler, stream: io.StringIO, filtered: bool = False
) -> list[str]:
    """The access log's lines of three requests, as ``handler`` writes them to ``stream``
    (``filtered``: through a filter on the logger that drops the one of ``/hidden``)."""
    access_logger.addHandler(handler)
    level = access_logger.level
    access_logger.setLevel(logging.INFO)
    dropping = logging.Filter()
    dropping.filter = lambda record: "/hidden" not in record.getMessage()  # type: ignore[method-assign]
    if filtered:
        access_logger.addFilter(dropping)
    try:
        log = AccessLog()
        log.add(("a1", "POST", "/programs/qa/run", 200, 0.01234, ("127.0.0.1", 5000)))
        log.add(("a2", "GET", "/hidden", 404, 0.0, None))
        log.add(("a3", "GET", "/healthz", 200, 0.5, ("::1", 6000)))
        log.close()
    finally:
        access_logger.removeHandler(handler)
        access_logger.removeFilter(dropping)
        access_logger.setLevel(level)
    return stream.getvalue().splitlines()


def test_plait_serves_own_stderr_handler_writes_what_logging_would() -> None:
    batched, plain = io.StringIO(), io.StringIO()
    handler = BatchedStreamHandler(batched)
    handler.setFormatter(MESSAGE_ONLY)  # as log_access_to_stderr sets it up: lines go straight
    through_logging = logging.StreamHandler(plain)
    through_logging.setFormatter(logging.Formatter("%(message)s"))
    lines = _lines_written(handler, batched)
    assert lines == _lines_written(through_logging, plain)
    assert json.loads(lines[0]) == {
        "request_id": "a1",
        "method": "POST",
        "path": "/programs/qa/run",
        "status": 200,
        "duration_ms": 12.34,
        "client": "127.0.0.1:5000",
    }
    assert [json.loads(line)["client"] for line in lines] == ["127.0.0.1:5000", None, "::1:6000"]


def test_a_filter_on_the_access_logger_still_sees_every_line() -> None:
    stream = io.StringIO()
    handler = BatchedStreamHandler(stream)
    handler.setFormatter(MESSAGE_ONLY)
    lines = _lines_written(handler, stream, filtered=True)
    assert [json.loads(line)["request_id"] for line in lines] == ["a1", "a3"]
