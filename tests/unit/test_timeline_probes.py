"""The console timeline shows each probe run of a call: its answer, note and evidence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from turnlog.interface.console.render import templates

TIMELINE = Path(__file__).parents[2] / "interface/console/templates/fragments/timeline.html"


def render_calls(calls: list[dict[str, Any]]) -> str:
    source = TIMELINE.read_text()
    macro = source[: source.index("{% endmacro %}") + len("{% endmacro %}")]
    return (
        templates().env.from_string(macro + '{{ calls_table(calls, "calls") }}').render(calls=calls)
    )


def test_each_probe_run_is_shown_with_its_answer_note_and_evidence_escaped() -> None:
    call = {
        "call_id": "c1",
        "name": "append_file",
        "state": "resolved",
        "effect": "side_effecting",
        "arguments": {"path": "out.txt", "text": "hi"},
        "attempt": 1,
        "worker_id": "w1",
        "result": {"bytes": 2},
        "outcome": "succeeded",
        "actor": "probe:append_file",
        "approval": "",
        "proposed_arguments": None,
        "note": "",
        "error": "",
        "running_seconds": None,
        "duration_seconds": 0.1,
        "step": 1,
        "probes": [
            {
                "attempt": 1,
                "answer": "unknown",
                "evidence": {},
                "note": "<b>timed out</b>",
                "duration_seconds": 5.0,
            },
            {
                "attempt": 1,
                "answer": "applied",
                "evidence": {"size": 4, "inode": 7},
                "note": "",
                "duration_seconds": 0.012,
            },
        ],
    }
    html = render_calls([call])
    assert html.count('class="probe probe-') == 2
    assert "<strong>unknown</strong>" in html and "&lt;b&gt;timed out&lt;/b&gt;" in html
    assert "<b>timed out</b>" not in html
    assert "<strong>applied</strong>" in html and "&#34;inode&#34;: 7" in html
    assert 'class="probe' not in render_calls([{**call, "probes": []}])
