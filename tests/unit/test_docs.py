"""The README's configuration table is generated from Settings and must not drift."""

from __future__ import annotations

from pathlib import Path

from turnlog.application.settings import settings_reference

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_configuration_table_matches_the_settings() -> None:
    text = README.read_text()
    begin, end = "<!-- settings:begin -->\n", "\n<!-- settings:end -->"
    assert begin in text and end in text, "README lost its settings markers"
    table = text.split(begin, 1)[1].split(end, 1)[0].strip()
    assert table == settings_reference(), (
        "README configuration table is stale; regenerate it from application.settings"
    )


def test_the_docs_name_the_idempotency_key_by_its_variable() -> None:
    """``TURNLOG_CALL_ID`` is the model's id, unique only within a session; the key is
    ``TURNLOG_IDEMPOTENCY_KEY``. No doc may call the call id the idempotency key."""
    docs = [README, *sorted((README.parent / "docs").rglob("*.md"))]
    wrong = []
    for path in docs:
        text = " ".join(path.read_text().split())
        for piece in text.split("`TURNLOG_CALL_ID`")[1:]:
            if piece.lstrip(" (").startswith("the idempotency key"):
                wrong.append(f"{path.name}: `TURNLOG_CALL_ID`{piece[:40]}")
    assert wrong == []
