"""Every design document the code and the docs cite is a file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("domain", "application", "projections", "interface", "tests", "docs", "docker")


def texts() -> list[Path]:
    found = [ROOT / name for name in ("README.md", "RELIABILITY.md", "BENCHMARKS.md", "Makefile")]
    for folder in SOURCES:
        found += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".toml")]
    return [p for p in found if p.is_file() and "__pycache__" not in p.parts]


def test_every_cited_doc_page_exists() -> None:
    cited = 0
    for path in texts():
        for name in re.findall(r"(?<![\w/.])docs/([\w-]+\.md)", path.read_text()):
            cited += 1
            assert (ROOT / "docs" / name).exists(), f"{path.relative_to(ROOT)} cites docs/{name}"
    assert cited > 10


def test_no_text_cites_a_design_document_that_is_not_there() -> None:
    # The repository has no DESIGN document: what it held is in docs/ (recovery.md …).
    for path in texts():
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        assert not re.search(r"\bDESIGN\b", text), f"{path.relative_to(ROOT)} cites DESIGN"
