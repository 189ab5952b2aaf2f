# The two commands a newcomer needs: `make demo` and `make test`.
# Each creates (or refreshes) .venv with the project installed, then runs.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test docs lint format clean-data bench bench-quick profile browser-deps chaos failover \
	unit integration api client e2e fault browser browser-deps-if-root

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

# The tests come in rings, one folder each under tests/: unit (no database at all),
# integration, api, e2e, fault and browser. `make test` is lint and every ring in one
# pytest run, its files spread over TEST_WORKERS processes (pytest-xdist, one file per
# worker at a time, the longest files first) sharing one embedded PostgreSQL, a namespace
# per test; lint runs beside the tests (niced) and its output follows theirs. It installs
# Chromium for the browser ring when it can (root and apt-get); where it cannot, the
# summary says loudly that the browser ring did not run. Each run ends with the ten
# slowest tests and the total time. PYTEST_ARGS adds options (e.g. -x, -k NAME).
# Two test processes per CPU, at most four: the tests spend much of their time waiting on the
# processes they start, and four on 2 cores keep both busy (the embedded server is given
# room for their connections: tests/conftest.py). One per CPU (2 to 4) on a server named by
# TURNLOG_TEST_DATABASE_URL, whose connection limit (100 by default) the tests leave alone.
TEST_WORKERS ?= $(shell c=$$(nproc 2>/dev/null || echo 1); n=$$(( c * $(if $(TURNLOG_TEST_DATABASE_URL),1,2) )); \
	[ $$n -gt 4 ] && n=4; [ $$n -lt 2 ] && n=2; echo $$n)
PYTEST := $(BIN)/pytest --durations=10
PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The test runs write bytecode caches even where PYTHONDONTWRITEBYTECODE is set: they start
# hundreds of turnlog processes, and each would compile the project's modules again.
test unit integration api client e2e fault browser: export PYTHONDONTWRITEBYTECODE :=

test: $(STAMP)
	@start=$$(date +%s); lint_log=$$(mktemp); \
	$(MAKE) --no-print-directory browser-deps-if-root; \
	{ nice -n 10 $(MAKE) --no-print-directory lint >"$$lint_log" 2>&1; } & lint=$$!; \
	tests=0; $(PYTEST) $(PARALLEL) tests $(PYTEST_ARGS) || tests=$$?; \
	linted=0; wait $$lint || linted=$$?; cat "$$lint_log"; rm -f "$$lint_log"; \
	echo "make test: lint $$([ $$linted -eq 0 ] && echo passed || echo FAILED)," \
		"every ring $$([ $$tests -eq 0 ] && echo passed || echo FAILED)," \
		"in $$(( $$(date +%s) - start )) s on $$(nproc) CPUs ($(TEST_WORKERS) test workers)"; \
	[ $$tests -eq 0 ] && [ $$linted -eq 0 ]

unit: $(STAMP)
	$(PYTEST) tests/unit $(PYTEST_ARGS)

integration api client e2e fault: $(STAMP)
	$(PYTEST) $(PARALLEL) tests/$@ $(PYTEST_ARGS)

browser: $(STAMP) browser-deps-if-root
	$(PYTEST) tests/browser $(PYTEST_ARGS)

# Benchmarks (BENCHMARKS.md) are not part of `make test`: the full run takes about 15 minutes and
# rewrites BENCHMARKS.md and benchmarks.json; bench-quick is a smoke run (.turnlog/bench-quick).
bench: $(STAMP)
	$(BIN)/python tests/benchmarks/run.py $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(BIN)/python tests/benchmarks/run.py --quick $(BENCH_ARGS)

# `make profile FIG=1`: where turnlog's time goes in one figure (py-spy; see the script).
profile: $(STAMP)
	$(BIN)/python tests/benchmarks/profiling.py $(FIG)

# The fault campaign (RELIABILITY.md), not part of `make test`; about 35 minutes:
# CHAOS_PG_CRASHES crashes of a private PostgreSQL server under load (every process of it
# SIGKILLed at once: tests/fault/pg_crash.py, docs/durability.md), then 200 SIGKILLs of
# random processes under load (tests/fault/chaos.py), then the same campaign
# with outcome probes on in every process (--probes, CHAOS_PROBE_KILLS kills, one worker kill
# in three aimed after an append_file wrote its line), then the tests that restart PostgreSQL
# itself (run only against the machine's own server at 127.0.0.1:5432, found with pg_isready;
# skipped, saying why, without it) and schemathesis with more than 2,000 generated requests.
# The server is left running.
CHAOS_KILLS ?= 200
CHAOS_PG_CRASHES ?= 30
CHAOS_PROBE_KILLS ?= 100
CHAOS_DATABASE_URL ?= $(shell pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null && echo postgresql://postgres@127.0.0.1:5432/test)

chaos: $(STAMP)
	$(BIN)/python tests/fault/pg_crash.py --rounds $(CHAOS_PG_CRASHES)
	TURNLOG_TEST_DATABASE_URL=$(CHAOS_DATABASE_URL) $(BIN)/python tests/fault/chaos.py --kills $(CHAOS_KILLS)
	TURNLOG_TEST_DATABASE_URL=$(CHAOS_DATABASE_URL) \
		$(BIN)/python tests/fault/chaos.py --probes --kills $(CHAOS_PROBE_KILLS)
	TURNLOG_CHAOS=1 TURNLOG_TEST_DATABASE_URL=$(CHAOS_DATABASE_URL) \
	TURNLOG_FUZZ_EXAMPLES=60 TURNLOG_FUZZ_MIN_REQUESTS=2000 \
		$(BIN)/pytest -p no:cacheprovider -rs -s \
		tests/fault/test_database_faults.py tests/fault/test_log_order.py tests/api/test_openapi_fuzz.py

# The failover run (RELIABILITY.md), not part of `make test`; about 3 minutes, at most 10: a
# primary and a synchronous standby built in temporary directories from the machine's PostgreSQL
# (tests/fault/pg_pair.py), `serve --split` on their multi-host URL under load, and per round the
# primary SIGKILLed while a commit waits for the standby, the standby promoted, a new standby
# built. Prints one JSON line (also in .turnlog/failover.json); exits 1 on a lost or duplicated
# turn or a recovery slower than 30 s. Everything it started is stopped and removed.
FAILOVER_ROUNDS ?= 3

failover: $(STAMP)
	$(BIN)/python tests/fault/failover.py --rounds $(FAILOVER_ROUNDS)

# The docs' pictures (Mermaid blocks in README.md and docs/), generated from the code;
# tests/unit/test_pictures.py fails while a committed one is stale.
docs: $(STAMP)
	$(BIN)/python -m tests.docgen

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean-data:
	rm -rf .turnlog

# Chromium for the browser ring and bubblewrap for the tool sandbox (docs/containment.md),
# installed when missing and this is root with apt-get; otherwise a warning (the browser ring
# is then skipped, the test summary says so loudly; without bwrap the sandbox tests fail).
browser-deps-if-root:
	@if { [ -n "$$TURNLOG_CHROMIUM" ] || command -v chromium >/dev/null 2>&1; } \
		&& command -v bwrap >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory browser-deps \
		|| echo "*** could not install Chromium or bubblewrap: the browser ring will be skipped ***"; \
	else echo "*** no Chromium or no bubblewrap, and no root with apt-get to install them: the" \
		"browser ring will be skipped and tools cannot be sandboxed; install them with" \
		"\`sudo make browser-deps\` ***"; fi

# Debian's Chromium for the browser tests (tests/browser skips them, saying why, without it)
# and Debian's bubblewrap, the tool sandbox. Quick when both are installed; needs root and
# apt-get. Two runs at once (two clones) take turns (flock) rather than fail on apt's lock.
browser-deps:
	@{ command -v chromium >/dev/null 2>&1 && command -v bwrap >/dev/null 2>&1; } || { \
		export DEBIAN_FRONTEND=noninteractive; \
		$$(command -v flock >/dev/null && echo flock /tmp/turnlog-browser-deps.lock) sh -c \
		'{ command -v chromium >/dev/null && command -v bwrap >/dev/null; } || { apt-get update -qq \
		&& apt-get install -y -qq chromium bubblewrap >/dev/null; }'; }
	@chromium --version 2>/dev/null | head -n1
	@bwrap --version 2>/dev/null | head -n1
