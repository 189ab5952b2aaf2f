# The two commands a newcomer needs: `make demo` and `make test`.
# Each creates (or refreshes) .venv with the project installed, then runs.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint format clean-data bench bench-quick profile browser-deps

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
	$(BIN)/mypy --strict domain application projections interface

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
