"""The unit ring runs without any database: `make unit` passes with no PostgreSQL at all."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def database() -> None:
    pytest.fail(
        "a unit test asked for the database: tests/unit runs with no PostgreSQL at all;"
        " move the test to tests/integration (or a ring after it)"
    )
