"""Every design document the code and the docs cite is a file of the repository."""

from __future__ import annotations

import importlib
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


def test_every_relative_link_of_every_page_points_at_a_file_and_heading_that_exist() -> None:
    pages = [ROOT / "README.md", ROOT / "RELIABILITY.md", ROOT / "BENCHMARKS.md"]
    for path in [*pages, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\((?!https?:)([^)\s]+)\)", path.read_text()):
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if "screenshots" in file:
                continue  # pictures the browser tests take
            assert linked.exists(), f"{path.name}: {target}"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.M)
                slugs = {
                    re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings
                }
                assert anchor in slugs, f"{path.name}: {target}"


PAGES = ("README.md", "RELIABILITY.md", "BENCHMARKS.md")
NOT_FILES = {"application/problem", "docker/.env"}  # a media type; the file a user creates


def pages() -> list[Path]:
    return [*(ROOT / name for name in PAGES), *sorted((ROOT / "docs").glob("*.md"))]


def test_every_source_path_a_page_names_exists() -> None:
    folders = "domain|application|projections|interface|tests|docker"
    for page in pages():
        for path in re.findall(rf"(?<![\w/.-])((?:{folders})/[\w/.-]*\w)", page.read_text()):
            if path not in NOT_FILES:
                assert (ROOT / path).exists(), f"{page.name} names {path}"


def test_every_module_and_name_a_page_cites_can_be_imported() -> None:
    for page in pages():
        pattern = r"\b((?:turnlog\.)?(?:domain|application|projections|interface)(?:\.\w+)+)"
        for cited in re.findall(pattern, page.read_text()):
            name = cited if cited.startswith("turnlog.") else f"turnlog.{cited}"
            assert resolves(name), f"{page.name} cites {cited}"


def resolves(name: str) -> bool:
    """Whether ``name`` is a module, or a module's attribute (nested attributes too)."""
    parts = name.split(".")
    for split in range(len(parts), 1, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False
