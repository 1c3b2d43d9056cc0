# The two commands of the README: `make run` and `make test`. Both set everything up
# on a fresh machine (virtual environment, dependencies, database schema).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: run test lint format sweep

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

# Local mode: SQLite under var/, background work in-process, no other server.
run: $(STAMP)
	DEBUG=1 $(PY) manage.py migrate --noinput
	DEBUG=1 $(PY) manage.py bootstrap_local
	DEBUG=1 $(PY) manage.py seed_demo
	@echo "Console: http://127.0.0.1:8000/   API docs: http://127.0.0.1:8000/api/docs/"
	DEBUG=1 $(PY) manage.py runlocal 127.0.0.1:8000

# Lint, format check, then the whole suite (PostgreSQL when DATABASE_URL points at it).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

sweep: $(STAMP)
	$(PY) manage.py sweep

# The proof (docs/benchmarks.md). chaos: N refunds (default 2000) through a naive runner
# and through Effectgate under the same seeded faults; PostgreSQL when DATABASE_URL is
# set (a database of its own, effectgate_chaos), else SQLite. bench: the API against
# raw SQL, claim contention, intent hashing, pages and sweeps at SIZES (PostgreSQL).
.PHONY: chaos bench
chaos: $(STAMP)
	$(PY) -m bench.chaos --n $(or $(N),2000) $(CHAOS_ARGS)

bench: $(STAMP)
	$(PY) -m bench.bench $(if $(SIZES),--sizes $(SIZES)) $(BENCH_ARGS)
