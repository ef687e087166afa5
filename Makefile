# Atlas developer commands. `make run` serves a working Atlas; `make test` is what CI runs.
# With DATABASE_URL unset everything uses the embedded PostgreSQL in .atlas/pgdata.

VENV    := .venv
PY      := $(VENV)/bin/python
MANAGE  := $(PY) manage.py
STAMP   := $(VENV)/.installed
# Python 3.11 if it runs here, else whatever python3 is (checked to be >= 3.11 below).
PYTHON  ?= $(shell python3.11 -c 'import sys' >/dev/null 2>&1 && echo python3.11 || echo python3)
# Start the embedded PostgreSQL up front unless DATABASE_URL names a server. Settings would
# also start it lazily; doing it once here keeps parallel processes from racing to do so.
ENSURE_DB = @if [ -z "$$DATABASE_URL" ]; then \
	echo "==> embedded PostgreSQL in .atlas/pgdata"; $(PY) -m atlas.embedded start; fi

.DEFAULT_GOAL := help
.PHONY: help venv run test stress lint fmt migrate db-start db-stop worker clean browser pgbouncer

help:
	@echo "make run       virtualenv, database, migrate, demo user, then web (gunicorn) + worker"
	@echo "make test      make lint, then pytest on 2 workers (PYTEST_WORKERS=0: one; options in PYTEST_ARGS=...)"
	@echo "make stress    the reliability harnesses at full size (~30 min; docs/reliability.md)"
	@echo "make lint      ruff check, ruff format --check, lint-imports (.importlinter), mypy"
	@echo "make fmt       ruff format and ruff check --fix"
	@echo "make migrate   apply migrations"
	@echo "make db-start  start the embedded PostgreSQL (.atlas/pgdata); db-stop stops it"
	@echo "make worker    a Celery worker with embedded beat, alone"
	@echo "make venv      create $(VENV) and install requirements-dev.txt (runtime + tools)"
	@echo "make clean     remove caches and collected static files (keeps $(VENV) and data)"
	@echo "make browser   install Debian's chromium for the e2e admin tests (as root; never fails)"
	@echo "make pgbouncer install Debian's pgbouncer for the transaction-pooling tests (as root; never fails)"
	@echo "make bench     benchmarks vs the peers (installs bench/requirements.txt; ~40 min)"
	@echo "make bench-smoke  the same suite at CI size (a minute or two; scratch output)"

venv: $(STAMP)

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "Atlas needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

# Re-install only when either list is newer than the last install. requirements-dev.txt
# includes requirements.txt (the runtime list, all the Docker image installs).
$(STAMP): requirements.txt requirements-dev.txt | $(PY)
	$(PY) -m pip install --disable-pip-version-check -r requirements-dev.txt
	@touch $@

run: venv
	$(ENSURE_DB)
	$(MANAGE) migrate --noinput
	$(MANAGE) collectstatic --noinput --verbosity 0
	$(MANAGE) atlas_demo
	exec $(PY) -m atlas.devrun

# The e2e admin tests drive Debian's chromium with Playwright (no browser download). Installs
# it when missing and we are root; otherwise says loudly why the e2e tests will be skipped.
# Never fails: without a browser the e2e tests skip with that reason.
CHROMIUM ?= /usr/bin/chromium
browser:
	@if [ -x "$(CHROMIUM)" ]; then \
		echo "==> browser for e2e tests: $(CHROMIUM)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "==> installing Debian's chromium for the e2e admin tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
			|| echo "!!! could not install chromium: the e2e browser tests will be SKIPPED !!!"; \
	else \
		echo "!!! no $(CHROMIUM), and not root with apt-get: the e2e browser tests will be SKIPPED"; \
		echo "!!! (install Debian's chromium package to run them) !!!"; \
	fi

# tests/atlas/test_pooling.py starts its own PgBouncer (transaction mode) in front of the test
# database, from Debian's package: installed here when missing and we are root (never started
# as a service). Never fails: without the binary those tests skip with that reason.
PGBOUNCER ?= /usr/sbin/pgbouncer
pgbouncer:
	@if [ -x "$(PGBOUNCER)" ] || command -v pgbouncer >/dev/null 2>&1; then \
		echo "==> pgbouncer for the pooling tests: $$(command -v pgbouncer || echo $(PGBOUNCER))"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "==> installing Debian's pgbouncer for the transaction-pooling tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null) \
			|| echo "!!! could not install pgbouncer: the transaction-pooling tests will be SKIPPED !!!"; \
	else \
		echo "!!! no pgbouncer, and not root with apt-get: the transaction-pooling tests will be SKIPPED"; \
		echo "!!! (install Debian's pgbouncer package to run them) !!!"; \
	fi

# Two pytest-xdist workers by default (each with its own test database): much of the suite
# waits on real workers, servers and brokers, so two processes halve it even on two cores.
# PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 2
test: lint browser pgbouncer
	$(ENSURE_DB)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --durations=25 $(PYTEST_ARGS)

# The reliability harnesses (tests/reliability) at full size; `make test` runs them bounded.
# Figures go to .atlas/reliability/results.jsonl and into docs/reliability.md by hand.
stress: venv
	$(ENSURE_DB)
	ATLAS_STRESS=1 $(PY) -m pytest tests/reliability -m "not e2e" \
		-rA --durations=0 $(PYTEST_ARGS)

# mypy's Django plugin imports atlas.settings; a DATABASE_URL placeholder keeps that from
# starting the embedded PostgreSQL (nothing connects to it: the plugin reads settings only).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	DATABASE_URL=postgres://unused@localhost/unused $(VENV)/bin/mypy

fmt: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

migrate: venv
	$(ENSURE_DB)
	$(MANAGE) migrate --noinput

db-start: venv
	$(PY) -m atlas.embedded start

db-stop: venv
	$(PY) -m atlas.embedded stop

worker: venv
	$(ENSURE_DB)
	$(PY) -m celery -A atlas worker -B --loglevel=INFO --schedule .atlas/celerybeat-schedule

# Benchmarks against django-simple-history, django-reversion and django-pghistory
# (bench/run_all.py; docs/benchmarks.md). The peers go into .venv only for this.
BENCH_STAMP := $(VENV)/.bench-installed
.PHONY: bench bench-smoke

$(BENCH_STAMP): bench/requirements.txt $(STAMP)
	$(PY) -m pip install --disable-pip-version-check -r bench/requirements.txt
	@touch $@

# The full run: writes docs/benchmarks.md and docs/benchmarks/*.png.
bench: venv $(BENCH_STAMP)
	$(ENSURE_DB)
	$(PY) bench/run_all.py $(BENCH_ARGS)

# CI size, own database (atlas_bench_smoke), output to .atlas/bench-smoke (not the docs).
bench-smoke: venv $(BENCH_STAMP)
	$(ENSURE_DB)
	$(PY) bench/run_all.py --smoke --doc .atlas/bench-smoke/benchmarks.md \
		--plots .atlas/bench-smoke $(BENCH_ARGS)

clean:
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	rm -rf .pytest_cache .ruff_cache .mypy_cache .import_linter_cache .coverage htmlcov .atlas/static
