# The commands of the README: `make run`, `make test` and `make check`. Each sets up what
# it needs on a fresh machine (virtual environment, dependencies, database schema; for
# `make test` also axe-core from npm and Debian's chromium for the browser tests).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml client/pyproject.toml | cksum | cut -d' ' -f1)
AXE_STAMP := node_modules/.installed-$(shell cksum package-lock.json | cut -d' ' -f1)
CHROMIUM := /usr/bin/chromium
PORT ?= 8000

.PHONY: run test check lint format sweep

$(STAMP): pyproject.toml client/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e './client[mcp,openai-agents,langgraph]' -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

# Local mode: SQLite under var/, background work in-process, no other server.
run: $(STAMP)
	DEBUG=1 $(PY) manage.py migrate --noinput
	DEBUG=1 $(PY) manage.py bootstrap_local
	DEBUG=1 $(PY) manage.py seed_demo
	@echo "Console: http://127.0.0.1:$(PORT)/   API docs: http://127.0.0.1:$(PORT)/api/docs/"
	DEBUG=1 $(PY) manage.py runlocal 127.0.0.1:$(PORT)

# axe-core, which the browser tests inject into pages (package.json). Debian's npm is
# installed first when it is missing and we are root with apt-get.
$(AXE_STAMP): package.json package-lock.json
	@if ! command -v npm >/dev/null 2>&1; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	        echo "npm is missing: installing Debian's nodejs and npm"; \
	        DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
	    else \
	        echo "npm is missing and cannot be installed here (needs root and apt-get):" \
	            "the browser tests will fail without node_modules/axe-core."; \
	        exit 0; \
	    fi; \
	fi; \
	npm ci --no-audit --no-fund && touch $@

# The browser tests drive Debian's chromium. Installed when missing if we are root with
# apt-get; otherwise the browser tests fail and say so, as they should.
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "$@ is missing: installing Debian's chromium"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
	    echo "$@ is missing and cannot be installed here (needs root and apt-get):" \
	        "the browser tests will fail. Install it with: apt-get install chromium"; \
	fi

# The README's curl example (a doc test) needs curl and jq.
.PHONY: doc-tools
doc-tools:
	@if ! command -v jq >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	        echo "jq or curl is missing: installing Debian's jq and curl"; \
	        DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq curl >/dev/null; \
	    else \
	        echo "jq or curl is missing and cannot be installed here (needs root and" \
	            "apt-get): the README example's doc test will fail. apt-get install jq curl"; \
	    fi; \
	fi

# Everything CI runs: lint, format check, migrations in step with the models, types,
# import contracts, then the whole suite (PostgreSQL when DATABASE_URL points at it).
test: $(STAMP) $(AXE_STAMP) $(CHROMIUM) doc-tools
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The fast loop while working: the same static checks and the suite without the slow
# and browser tests.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest -m "not slow and not browser" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

sweep: $(STAMP)
	$(PY) manage.py sweep

# The proof (docs/benchmarks.md). chaos: N refunds (default 2000) through a naive runner
# and through Effectgate under the same seeded faults; PostgreSQL when DATABASE_URL is
# set (a database of its own, effectgate_chaos), else SQLite. bench: the lifecycle
# through the API against its essential statements, claim contention, intent hashing,
# pages and sweeps at SIZES (PostgreSQL); BENCH_ARGS='--only lifecycle' for the first
# alone (about a minute). soak: processes killed at random (docs/operations.md).
# bench-decide: keystrokes and seconds of one and ten approvals
# from the keyboard, before and after the console's keys (chromium, a fresh database).
.PHONY: chaos bench bench-decide soak
chaos: $(STAMP)
	$(PY) -m bench.chaos --n $(or $(N),2000) $(CHAOS_ARGS)

bench: $(STAMP)
	$(PY) -m bench.bench $(if $(SIZES),--sizes $(SIZES)) $(BENCH_ARGS)

bench-decide: $(STAMP) $(CHROMIUM)
	$(PY) -m bench.decide_speed

# soak: three gunicorn, two Celery workers and two beats on PostgreSQL and Redis, one of
# each killed at random and restarted, under the chaos workload for MINUTES (default 2).
soak: $(STAMP)
	$(PY) -m bench.soak --minutes $(or $(MINUTES),2)
