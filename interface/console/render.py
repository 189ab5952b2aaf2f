"""The console's Jinja2 environment: autoescaped templates and the filters they use.

Everything a template shows comes through Jinja2's autoescaping; the filters
only format (times, durations, JSON) and never mark text as safe, so a
session title or a tool result can never become markup.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
from fastapi.templating import Jinja2Templates

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"


def parse_time(value: datetime | str | None) -> datetime | None:
    """A timezone-aware datetime from a datetime or an ISO string (None stays None)."""
    if value is None or value == "":
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def clock(value: datetime | str | None) -> str:
    """``2026-11-30 03:58:12 UTC``; an em dash for no time."""
    moment = parse_time(value)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "—"


def iso(value: datetime | str | None) -> str:
    moment = parse_time(value)
    return moment.astimezone(UTC).isoformat() if moment else ""


def ago(value: datetime | str | None, now: datetime | None = None) -> str:
    """How long ago, in words an operator reads at a glance: ``12 s ago``, ``3 min ago``."""
    moment = parse_time(value)
    if moment is None:
        return "never"
    return span((now or datetime.now(UTC)) - moment) + " ago"


def span(delta: Any) -> str:
    seconds = max(0.0, delta.total_seconds() if hasattr(delta, "total_seconds") else delta)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"
    return f"{seconds // 86400:.0f} d {seconds % 86400 // 3600:.0f} h"


def duration(seconds: float | None) -> str:
    """A tool call's duration: ``0.42 s``, ``12.3 s``, ``2 min 5 s``; an em dash if unknown."""
    if seconds is None:
        return "—"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"


def compact_json(value: Any, limit: int = 160) -> str:
    """One line of JSON, cut at ``limit`` characters with an ellipsis."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pretty_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)


def _asset_versions() -> dict[str, str]:
    # A content hash in the asset URL: a new release is never served stale CSS or JS.
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        for path in STATIC.iterdir()
        if path.is_file()
    }


def templates() -> Jinja2Templates:
    """The console's templates, with autoescaping and the filters above."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=jinja2.select_autoescape(["html"], default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        clock=clock,
        iso=iso,
        ago=ago,
        duration=duration,
        compact_json=compact_json,
        pretty_json=pretty_json,
    )
    versions = _asset_versions()
    env.globals["asset"] = lambda name: f"/console/static/{name}?v={versions.get(name, '0')}"
    return Jinja2Templates(env=env)
