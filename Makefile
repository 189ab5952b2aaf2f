# The two commands a newcomer needs: `make demo` and `make test`.
# Each creates (or refreshes) .venv with the project installed, then runs.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint format clean-data bench bench-quick profile browser-deps chaos

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "turnlog needs Python 3.11 or newer (set PYTHON=...)")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/turnlog demo restart --receipt .turnlog/demo-receipt.json

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict -p turnlog

test: lint
	$(BIN)/pytest

# Benchmarks (issue 7) are not part of `make test`: the full run takes about 15 minutes and
# rewrites BENCHMARKS.md and benchmarks.json; bench-quick is a smoke run (.turnlog/bench-quick).
bench: $(STAMP)
	$(BIN)/python tests/benchmarks/run.py $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(BIN)/python tests/benchmarks/run.py --quick $(BENCH_ARGS)

# `make profile FIG=1`: where turnlog's time goes in one figure (py-spy; see the script).
profile: $(STAMP)
	$(BIN)/python tests/benchmarks/profiling.py $(FIG)

# The fault campaign (issue 8, RELIABILITY.md), not part of `make test`; about 20 minutes:
# 200 SIGKILLs of random processes under load (tests/fault/chaos.py), then the tests that
# restart PostgreSQL itself (run only against the machine's own server at 127.0.0.1:5432,
# found with pg_isready; skipped, saying why, without it) and schemathesis with more than
# 2,000 generated requests. The server is left running.
CHAOS_KILLS ?= 200
CHAOS_DATABASE_URL ?= $(shell pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null && echo postgresql://postgres@127.0.0.1:5432/test)

chaos: $(STAMP)
	TURNLOG_TEST_DATABASE_URL=$(CHAOS_DATABASE_URL) $(BIN)/python tests/fault/chaos.py --kills $(CHAOS_KILLS)
	TURNLOG_CHAOS=1 TURNLOG_TEST_DATABASE_URL=$(CHAOS_DATABASE_URL) \
	TURNLOG_FUZZ_EXAMPLES=60 TURNLOG_FUZZ_MIN_REQUESTS=2000 \
		$(BIN)/pytest -p no:cacheprovider -rs -s \
		tests/fault/test_database_faults.py tests/api/test_openapi_fuzz.py

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean-data:
	rm -rf .turnlog

# Debian's Chromium for the browser tests (tests/browser skips them, saying why, without it).
# Quick when it is already installed; needs root and apt-get.
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
	@chromium --version 2>/dev/null | head -n1
