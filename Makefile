# gpupool developer commands. `make run` and `make test` work on a fresh Debian machine with Python 3.11.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
JOBS ?= 2
# pytest workers: one per core plus two by default (many tests wait on a live server or a pod, so
# workers beyond the cores overlap those waits: on 2 cores 8.1 min of pytest with 4, 8.6 with 3);
# tests/conftest.py keeps each file (and everything that starts Ray) on one worker.
PYTEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(len(os.sched_getaffinity(0)) + 2)')

.PHONY: help run test test-durations lint typecheck pytest test-pytest test-collect test-deps system-deps venv-deps bench bench-openb clean

help:  ## List the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# The packages go in with uv (installed into .venv by pip first): on 2 cores it installs them from its
# cache in about 3 s where pip takes 37. They are not byte-compiled here (12 s of wall, 18 of CPU, for
# every module of every package): `test-collect` compiles what the tests import, and a module first
# imported later is compiled once by its first importer. Where uv cannot be installed or cannot reach
# the package index, pip installs them.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing gpupool with every extra and its dev tools into $(VENV)"
	@{ $(BIN)/python -m pip install --quiet 'uv>=0.5' \
		&& $(BIN)/uv pip install --python $(BIN)/python --quiet -e '.[all,dev]'; } \
	|| { echo "uv could not install them; installing with pip"; \
		$(BIN)/python -m pip install --quiet --upgrade pip && $(BIN)/python -m pip install --quiet -e '.[all,dev]'; }
	@touch $(STAMP)

venv: $(STAMP)  ## Create .venv and install gpupool with every extra and its dev tools

run: $(STAMP)  ## Start the pool on the embedded defaults (SQLite, local provider)
	$(BIN)/gpupool up

test-deps: system-deps venv-deps  ## Install the Debian packages the tests use (only as root) and a local CPU torch wheel (never downloaded); elsewhere those tests skip

system-deps:  ## The Debian packages alone (needs no virtualenv: `make test` installs them while .venv installs)
	@bash scripts/install-test-deps.sh --system

venv-deps: $(STAMP)  ## The local CPU torch wheel alone, into .venv
	@bash scripts/install-test-deps.sh --venv

# `make test` runs these at a lower CPU priority (CHECKS_NICE): they then use the cores the tests
# leave idle (a worker waiting on a live server or a pod) instead of slowing the tests down.
CHECKS_NICE ?=

lint: $(STAMP)  ## ruff
	$(CHECKS_NICE) $(BIN)/ruff check src tests bench

typecheck: $(STAMP)  ## mypy
	$(CHECKS_NICE) $(BIN)/mypy

# Bytecode is written (and so reused) even where the environment says not to: without it every
# worker compiles the sources and rewrites every test module's asserts again (11 s of CPU each, 4 s
# cached), and every `gpupool up` a test starts recompiles the package.
pytest test-pytest test-collect: export PYTHONDONTWRITEBYTECODE =

test-collect: $(STAMP)  ## Compile the package and the tests once (a share in each core), so the pytest workers all read the same bytecode
	@$(BIN)/python scripts/collect-tests.py

# A worker that dies (a segfault, the OOM killer) ends the run, reported as the test it was running.
# In one run where xdist replaced such a worker, the run never ended: every worker idle, the
# controller still waiting for tests.
PYTEST_RUN = $(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --max-worker-restart=0 --durations=25

pytest: $(STAMP)  ## The test suite in parallel, with the 25 slowest tests listed at the end
	$(PYTEST_RUN)

# `make test`'s pytest: it waits only for what the tests use (the packages, the wheel, the bytecode),
# not for ruff and mypy, which run beside it; a failure of either still fails `make test`.
test-pytest: system-deps venv-deps test-collect
	$(PYTEST_RUN)

test:  ## Everything CI runs: the Debian packages while .venv installs; ruff, mypy and pytest side by side
	@$(MAKE) --no-print-directory -j4 -Oline system-deps lint typecheck test-pytest CHECKS_NICE='nice -n 15'

test-durations: $(STAMP)  ## Run the suite and record each file's seconds in tests/durations.json (the order workers take files in)
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --junitxml=.pytest-junit.xml; \
		status=$$?; $(BIN)/python scripts/test-durations.py .pytest-junit.xml && rm -f .pytest-junit.xml; exit $$status

bench: $(STAMP)  ## The quick benchmarks (each prints a table and writes JSON under bench/results/)
	$(BIN)/python bench/fill_speed.py

bench-openb: $(STAMP)  ## The full OpenB grid: 17 workloads x all policies x 10 seeds; updates docs/benchmarks.md
	$(BIN)/python bench/openb_grid.py --jobs $(JOBS) --write-docs

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache bench/results
