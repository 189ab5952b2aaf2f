"""`/docs` works without internet, and every role's `/metrics` has the process defaults."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from turnlog.application.settings import Settings
from turnlog.interface.http import create_app


def test_docs_page_loads_its_scripts_and_styles_from_the_server_itself(api: TestClient) -> None:
    page = api.get("/docs")
    assert page.status_code == 200
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources, page.text
    assert all(s.startswith("/") for s in sources), sources  # no CDN, no other host
    for asset in sources:
        fetched = api.get(asset)
        assert fetched.status_code == 200, asset
        assert len(fetched.content) > 1000, asset
    assert api.get("/openapi.json").status_code == 200


def test_metrics_of_every_role_include_process_and_python_defaults(settings: Settings) -> None:
    for role in ("api", "worker", "projections"):
        app = create_app(settings, role=role)
        with TestClient(app) as client:
            text = client.get("/metrics").text
        assert "process_resident_memory_bytes" in text, role
        assert "process_cpu_seconds_total" in text, role
        assert "python_info{" in text, role
        assert "python_gc_collections_total" in text, role
