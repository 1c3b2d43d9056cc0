# The commands of the README: `make run`, `make test` and `make check`. Each sets up what
# it needs on a fresh machine (virtual environment, dependencies, database schema; for
# `make test` also axe-core from npm and Debian's chromium for the browser tests, and the
# TypeScript client's npm dependencies).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml client/pyproject.toml | cksum | cut -d' ' -f1)
AXE_STAMP := node_modules/.installed-$(shell cksum package-lock.json | cut -d' ' -f1)
TS := clients/typescript
TS_STAMP := $(TS)/node_modules/.installed-$(shell cksum $(TS)/package-lock.json | cut -d' ' -f1)
CHROMIUM := /usr/bin/chromium
PORT ?= 8000
# The suite runs in parallel processes (pytest-xdist), one per core with `auto`, each on
# a test database of its own; PYTEST_WORKERS=0 runs it in one process. Every test can run
# beside any other: servers listen on free ports, Celery tests use queues of their own,
# the databases tests make have names of their own (tests/support/db.py).
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL = -n $(PYTEST_WORKERS)

.PHONY: run test check lint format sweep

$(STAMP): pyproject.toml client/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e './client[mcp,openai-agents,langgraph,verify]' -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

# Local mode: SQLite under var/, background work in-process, no other server.
run: $(STAMP)
	DEBUG=1 $(PY) manage.py migrate --noinput
	DEBUG=1 $(PY) manage.py bootstrap_local
	DEBUG=1 $(PY) manage.py seed_demo
	@echo "Console: http://127.0.0.1:$(PORT)/   API docs: http://127.0.0.1:$(PORT)/api/docs/"
	DEBUG=1 $(PY) manage.py runlocal 127.0.0.1:$(PORT)

# `apt_install PACKAGES WHAT-FAILS`, a shell function for the recipes below: installs
# Debian packages when we are root with apt-get; otherwise says what will fail without them.
APT_INSTALL = apt_install() { \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's $$1"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$1 >/dev/null; \
	else \
	    echo "$$1: missing, and not installable here (needs root and apt-get): $$2"; \
	fi; \
}

# axe-core, which the browser tests inject into pages (package.json), with Debian's npm
# when it is missing.
$(AXE_STAMP): package.json package-lock.json
	@$(APT_INSTALL); \
	command -v npm >/dev/null 2>&1 || \
	    apt_install "nodejs npm" "the browser tests will fail without node_modules/axe-core."; \
	command -v npm >/dev/null 2>&1 || exit 0; \
	npm ci --no-audit --no-fund && touch $@

# @effectgate/client (clients/typescript): its npm dependencies from its lockfile. Its
# tests (tests/client_ts) and the TypeScript doc examples run on them; nothing is
# fetched at run time.
$(TS_STAMP): $(TS)/package.json $(TS)/package-lock.json
	@$(APT_INSTALL); \
	command -v npm >/dev/null 2>&1 || \
	    apt_install "nodejs npm" "the TypeScript client's tests will fail without npm."; \
	command -v npm >/dev/null 2>&1 || exit 0; \
	cd $(TS) && npm ci --no-audit --no-fund && touch $(CURDIR)/$@

# The package built (dist/, with its types) from this checkout's sources, every time: a
# checkout whose src/ changed must not test an older dist/ (a few seconds of tsc).
.PHONY: ts-build
ts-build: $(TS_STAMP)
	@if [ -f $(TS_STAMP) ]; then cd $(TS) && npm run --silent build; fi

# Regenerate the TypeScript client's types from this checkout's OpenAPI document (a test
# fails while src/schema.d.ts differs from what /api/schema/ serves).
.PHONY: ts-schema
ts-schema: $(STAMP) $(TS_STAMP)
	mkdir -p var
	$(PY) manage.py spectacular --format openapi-json --file var/openapi.json
	cd $(TS) && npm run --silent schema -- $(CURDIR)/var/openapi.json -o src/schema.d.ts

# The browser tests drive Debian's chromium; without it they fail and say so.
$(CHROMIUM):
	@$(APT_INSTALL); apt_install chromium "the browser tests will fail."

# The README's curl example (a doc test) needs curl and jq.
.PHONY: doc-tools
doc-tools:
	@$(APT_INSTALL); \
	{ command -v jq && command -v curl; } >/dev/null 2>&1 || \
	    apt_install "jq curl" "the README example's doc test will fail."

# Everything CI runs: lint, format check, migrations in step with the models, types,
# import contracts, then the whole suite (PostgreSQL when DATABASE_URL points at it).
test: $(STAMP) $(AXE_STAMP) ts-build $(CHROMIUM) doc-tools
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# The fast loop while working: the same static checks and the suite without the slow
# and browser tests.
check: $(STAMP) ts-build
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) -m "not slow and not browser" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

sweep: $(STAMP)
	$(PY) manage.py sweep

# The proof (docs/benchmarks.md). chaos: N refunds (default 2000) through a naive runner
# and through Effectgate under the same seeded faults, then through a naive TypeScript
# loop and @effectgate/client's Runner where npm installed clients/typescript
# (CHAOS_ARGS=--no-ts: not); PostgreSQL when DATABASE_URL is
# set (a database of its own, effectgate_chaos), else SQLite. bench: the lifecycle
# through the API against its essential statements and the DBOS peer (single and in
# batches), claim contention, intent hashing, pages and sweeps at SIZES, the transparency
# log's sealer (PostgreSQL); BENCH_ARGS='--only lifecycle' for the first alone (two to
# three minutes), '--only review' for
# a person's time in the console (chromium), '--only seal' for the sealer's cost.
# soak: processes killed at random (docs/operations.md).
# bench-decide: keystrokes and seconds of one and ten approvals
# from the keyboard, before and after the console's keys (chromium, a fresh database).
# bench-review: keystrokes, clicks and seconds of a reviewer deciding 10 requests one by
# one and 10 in bulk and of support resolving 5 unknown outcomes (chromium, a fresh
# database: PostgreSQL when DATABASE_URL is set, else SQLite); REVIEW_ARGS for its options.
.PHONY: chaos bench bench-decide bench-review soak
chaos: $(STAMP) ts-build
	$(PY) -m bench.chaos --n $(or $(N),2000) $(CHAOS_ARGS)

bench: $(STAMP) $(CHROMIUM)
	$(PY) -m bench.bench $(if $(SIZES),--sizes $(SIZES)) $(BENCH_ARGS)

bench-decide: $(STAMP) $(CHROMIUM)
	$(PY) -m bench.decide_speed

bench-review: $(STAMP) $(CHROMIUM)
	$(PY) -m bench.review_speed $(REVIEW_ARGS)

# soak: three gunicorn, two Celery workers and two beats on PostgreSQL and Redis, one of
# each killed at random and restarted, under the chaos workload for MINUTES (default 2).
soak: $(STAMP)
	$(PY) -m bench.soak --minutes $(or $(MINUTES),2)
