"""The overview's status board: what is open, what ran lately, who works, how far behind.

Numbers come from the same queries as the /v1 endpoints; this module adds
what the page draws: the geometry of small inline SVG bars (no script, no
library) and a plain-words state for each worker and projection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turnlog.application.runtime import Runtime
from turnlog.application.store.workers_registry import list_workers
from turnlog.projections import ReadModels
from turnlog.projections.activity import open_turn_summary, tool_call_activity

WINDOW_SECONDS = 3600
BUCKETS = 12
# Workers beat every 2 s; one silent for this long has most likely died.
SILENT_AFTER_SECONDS = 10.0
# Silent this long, it is gone: its leases went with its connections long ago, and
# its turns were taken over (a worker that stops cleanly says so: "stopped").
GONE_AFTER_SECONDS = 60.0
MAX_WORKERS_SHOWN = 50
# Bottom to top in each bar: settled outcomes first, the ones to look at on top.
STACK = ("succeeded", "resolved", "pending", "started", "failed", "abandoned", "unknown")

CHART_WIDTH = 480
CHART_HEIGHT = 110
LABEL_ROOM = 16  # above the tallest bar, for its count
BAR_GAP = 6


@dataclass(frozen=True)
class Rect:
    """One segment of an SVG bar."""

    x: float
    y: float
    width: float
    height: float
    state: str
    label: str


def build_board(runtime: Runtime, read_models: ReadModels) -> dict[str, Any]:
    """Everything the overview shows, in one dict for the template."""
    activity = tool_call_activity(read_models, WINDOW_SECONDS, BUCKETS)
    open_turns = open_turn_summary(read_models)
    return {
        "open_turns": open_turns,
        "open_turn_bars": hbars([(t["state"], t["count"]) for t in open_turns]),
        "activity": activity,
        "window_minutes": WINDOW_SECONDS // 60,
        "activity_bars": stacked_bars(activity["buckets"]),
        "activity_summary": ", ".join(str(b["total"]) for b in activity["buckets"]),
        "workers": workers(runtime),
        "projections": projections(read_models),
    }


def hbars(values: list[tuple[str, int]], width: float = 120, height: float = 12) -> list[Rect]:
    """Horizontal bars, one per value, scaled to the largest (an empty bar for zero)."""
    top = max((v for _, v in values), default=0) or 1
    return [
        Rect(0, 0, round(width * v / top, 1), height, name, f"{name}: {v}") for name, v in values
    ]


def stacked_bars(buckets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One stacked bar per bucket, segments by state, scaled to the busiest bucket.

    Each bar: ``x``, ``width``, ``total``, ``segments`` (``Rect``) and ``label_y``,
    where its count is written above it.
    """
    top = max((b["total"] for b in buckets), default=0) or 1
    count = max(len(buckets), 1)
    width = (CHART_WIDTH - BAR_GAP * (count - 1)) / count
    bars = []
    for index, bucket in enumerate(buckets):
        x = round(index * (width + BAR_GAP), 1)
        y = float(CHART_HEIGHT)
        segments = []
        for state in STACK:
            n = bucket["by_state"].get(state, 0)
            if n:
                h = (CHART_HEIGHT - LABEL_ROOM) * n / top
                y -= h
                segments.append(Rect(x, round(y, 1), round(width, 1), round(h, 1), state, ""))
        bars.append(
            {
                "x": x,
                "width": round(width, 1),
                "middle": round(x + width / 2, 1),
                "total": bucket["total"],
                "segments": segments,
                "label_y": round(y - 4, 1),
            }
        )
    return bars


def workers(runtime: Runtime) -> dict[str, Any]:
    """Registered workers, live ones first, each with ``condition``: working, silent, gone
    or stopped; at most ``MAX_WORKERS_SHOWN`` of them (``hidden`` says how many more)."""
    rows = list_workers(runtime.db, runtime.settings.namespace)
    for row in rows:
        age = row["heartbeat_age_seconds"]
        if row["stopped_at"]:
            row["condition"] = "stopped"
        elif age > GONE_AFTER_SECONDS:
            row["condition"] = "gone"
        elif age > SILENT_AFTER_SECONDS:
            row["condition"] = "silent"
        else:
            row["condition"] = "working"
        # The bar fills up as the heartbeat ages, full at the silence threshold.
        row["age_bar"] = round(min(age, SILENT_AFTER_SECONDS) / SILENT_AFTER_SECONDS * 60, 1)
    order = {"working": 0, "silent": 1, "gone": 2, "stopped": 3}
    rows.sort(key=lambda r: (order[r["condition"]], r["heartbeat_age_seconds"]))
    return {
        "items": rows[:MAX_WORKERS_SHOWN],
        "hidden": max(0, len(rows) - MAX_WORKERS_SHOWN),
        "working": sum(r["condition"] == "working" for r in rows),
    }


def projections(read_models: ReadModels) -> list[dict[str, Any]]:
    """Each read model's position and lag, with a bar of the lag against the largest."""
    rows = read_models.status()
    top = max((r["lag_events"] for r in rows), default=0) or 1
    for row in rows:
        row["lag_bar"] = round(120 * row["lag_events"] / top, 1)
    return rows
