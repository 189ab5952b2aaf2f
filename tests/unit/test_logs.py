"""Log lines: one JSON object per line, the ids of their context, and never a secret."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from turnlog.application.log_context import bound, current
from turnlog.application.settings import Settings
from turnlog.interface.logs import REDACTED, build_handler, secrets_of

TOKEN = "tok-3f9a-very-secret"
KEY = "sk-test-0123456789abcdef"
PASSWORD = "pg-pass-4242"


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger writing JSON lines through the real handler to a buffer."""
    settings = Settings(
        log_format="json",
        api_token=TOKEN,
        openai_api_key=KEY,
        database_url=f"postgresql://turnlog:{PASSWORD}@db:5432/turnlog",
    )
    buffer = io.StringIO()
    logger = logging.getLogger("tests.logs")
    logger.handlers[:] = [build_handler(settings, buffer)]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, buffer
    logger.handlers[:] = []


def lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_every_line_is_one_json_object_even_with_newlines_and_tracebacks(logged: Any) -> None:
    logger, buffer = logged
    logger.info("two\nlines")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")

    first, second = lines(buffer)
    assert first["message"] == "two\nlines" and first["level"] == "INFO"
    assert {"time", "level", "logger", "message"} <= set(first)
    assert "ValueError: boom" in second["exception"]


def test_lines_carry_the_ids_bound_in_their_context_and_extra_wins(logged: Any) -> None:
    logger, buffer = logged
    with bound(session_id="s-1", turn_id="t-1", worker_id="w-1"):
        logging.getLogger("tests.logs.library").info("a library line")  # not ours, same context
        with bound(call_id="c-1"):
            logger.info("calling", extra={"turn_id": "t-explicit"})
    logger.info("outside")

    inside, call, outside = lines(buffer)
    assert inside | {"session_id": "s-1", "turn_id": "t-1", "worker_id": "w-1"} == inside
    assert call["call_id"] == "c-1" and call["turn_id"] == "t-explicit"
    assert not {"session_id", "turn_id", "call_id", "worker_id"} & set(outside)
    assert current() == {}


def test_a_pool_thread_starts_unbound_and_binds_its_own_ids(logged: Any) -> None:
    logger, buffer = logged

    def work() -> None:
        logger.info("unbound")
        with bound(session_id="s-2", worker_id="w-2"):
            logger.info("bound")

    with bound(request_id="r-1"), ThreadPoolExecutor(1) as pool:
        pool.submit(work).result()
    unbound, inside = lines(buffer)
    assert "request_id" not in unbound
    assert inside["session_id"] == "s-2" and inside["worker_id"] == "w-2"


def test_secrets_are_redacted_from_messages_arguments_extras_and_tracebacks(
    logged: Any,
) -> None:
    logger, buffer = logged
    logger.info("token %s and key %r", TOKEN, KEY, extra={"detail": {"url": f"x:{PASSWORD}@h"}})
    try:
        raise RuntimeError(f"Authorization: Bearer {TOKEN}")
    except RuntimeError:
        logger.warning("request failed for %s", KEY, exc_info=True)
    with bound(request_id=TOKEN):  # even an id that happens to be a secret
        logger.info("bound")

    text = buffer.getvalue()
    for secret in (TOKEN, KEY, PASSWORD):
        assert secret not in text
    first, second, third = lines(buffer)
    assert first["message"] == f"token {REDACTED} and key '{REDACTED}'"
    assert first["detail"] == {"url": f"x:{REDACTED}@h"}
    assert f"Bearer {REDACTED}" in second["exception"]
    assert third["request_id"] == REDACTED


def test_the_secrets_come_from_the_settings_and_empty_ones_are_ignored() -> None:
    settings = Settings(api_token=TOKEN, openai_api_key=None, database_url="postgresql://u@h/db")
    assert secrets_of(settings) == [TOKEN]
    nothing = Settings(api_token=None, openai_api_key=None, database_url="not a url at all")
    assert secrets_of(nothing) == []


def test_text_lines_end_with_the_ids_of_their_context() -> None:
    buffer = io.StringIO()
    logger = logging.getLogger("tests.logs.text")
    logger.handlers[:] = [build_handler(Settings(log_format="text", api_token=TOKEN), buffer)]
    logger.propagate = False
    try:
        with bound(session_id="s-3", turn_id="t-3"):
            logger.warning("careful with %s", TOKEN)
        logger.warning("plain")
    finally:
        logger.handlers[:] = []
    first, second = buffer.getvalue().splitlines()
    assert first.endswith(
        f"WARNING tests.logs.text: careful with {REDACTED} [session_id=s-3 turn_id=t-3]"
    )
    assert second.endswith("WARNING tests.logs.text: plain")


def test_ids_bound_in_a_thread_do_not_leak_into_another() -> None:
    seen: list[dict[str, str]] = []
    ready = threading.Event()

    def other() -> None:
        ready.wait(5)
        seen.append(dict(current()))

    thread = threading.Thread(target=other)
    thread.start()
    with bound(session_id="mine"):
        ready.set()
        thread.join(5)
    assert seen == [{}]
