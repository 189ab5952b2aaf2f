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
