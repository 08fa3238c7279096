# The README's two commands: `make demo` and `make test`. Each creates .venv and installs into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-fast test-loaded test-min test-newest lint format setup system-packages bench docs clean

# _version.py too: the editable install's metadata holds the version (importlib.metadata, the doctor).
$(STAMP): pyproject.toml flask_gateway/_version.py
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11 or newer is required (set PYTHON=python3.11)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
# Before the rename to flask-bnpl-gateway the distribution was called flask-gateway (docs/packaging.md): an
# editable install under the old name (its dist-info in .venv, its egg-info in the checkout) would stay beside
# the new one, both providing flask_gateway.
	$(BIN)/python -m pip uninstall -qq --yes flask-gateway
	rm -rf flask_gateway.egg-info
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP)

## Start the demo: the emulator (5050) and the example shop (5000), SQLite in var/demo/shop-5000-emulator-5050
## (one folder per port pair: DEMO_SHOP_PORT, DEMO_EMULATOR_PORT). Ctrl-C stops both.
demo: setup
	$(BIN)/python -m example_shop.demo

## System programs the tests use (chromium, PostgreSQL, redis-server), installed with apt when missing.
system-packages:
	scripts/ensure-system-packages

## The whole test suite, in parallel worker processes (pytest-xdist; TEST_WORKERS=0 runs it in one), then its
## 25 slowest steps (setups and tests: where the wall time goes, docs/performance.md).
TEST_WORKERS ?= auto
test: setup system-packages
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --durations=25

## The contributors' fast loop: the in-process tests only (no browser, gunicorn stacks, Celery workers or wheel
## builds: noxfile.py's IN_PROCESS_TESTS), then how many ran and how long they took. TEST_ARGS adds pytest's
## options (TEST_ARGS=--database=sqlite: SQLite only, no PostgreSQL).
test-fast: setup system-packages
	$(BIN)/python scripts/test-fast.py $(TEST_ARGS)

## make test while busy-loop processes keep every core busy (scripts/test-loaded.py; BURNERS=N sets their number),
## then the load average it saw: a test that passes only on a quiet machine fails here first.
test-loaded: setup system-packages
	scripts/test-loaded.py $(MAKE) test

## The tested version ranges (noxfile.py): the in-process suite with every runtime dependency, extras included,
## at its declared minimum in pyproject.toml (test-min; CI runs it), or at its newest (test-newest). Each keeps
## a virtualenv in .nox/ and reuses it. NOX_ARGS adds nox's options, e.g. NOX_ARGS=-R (no reinstall).
test-min: setup system-packages
	$(BIN)/nox -s min $(NOX_ARGS)

test-newest: setup system-packages
	$(BIN)/nox -s newest $(NOX_ARGS)

## Static checks: ruff (lint and format) and mypy (strict on flask_gateway).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## Performance figures (not a test; CI does not run it): ratios against baselines run in the same session.
## Needs wrk and PostgreSQL (installed with apt when missing); results in benchmarks/results/latest.json.
bench: setup
	BENCH_PACKAGES=1 scripts/ensure-system-packages
	$(BIN)/python benchmarks/bench.py $(BENCH_ARGS)

## The documentation site (docs/conf.py): Sphinx with MyST over docs/*.md, into docs/_build/html. Warnings are
## errors and every cross-reference is checked (-n), page links and their #anchors included; -E reads every
## page again, so a warning is never hidden by an earlier build. The docs extra goes into .venv first.
DOCS_STAMP := $(VENV)/.docs-stamp
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/sphinx-build -E -W --keep-going -n -b html docs docs/_build/html

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .nox .pytest_cache .mypy_cache .ruff_cache docs/_build
