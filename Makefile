# Parley — developer entry points.  GNU make; recipes are tab-indented.
#
# `make run` (and `migrate`) need only what running needs: the virtualenv gets
# requirements.lock (exact versions + hashes). `make test`, `lint` and the other
# developer targets need the test and lint tools too: the same virtualenv gets
# requirements-dev.lock, a superset of the runtime lock with the same pins, so
# one venv serves both and `make run` after `make test` installs nothing.
# Each install is refreshed only when its lock file changes.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
MAKEFLAGS += --no-builtin-rules

HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

VENV     := .venv
BIN      := $(VENV)/bin
LOCK     := requirements.lock
DEV_LOCK := requirements-dev.lock

# python3.11 if it is on PATH, else python3 (scripts/ensure-venv.sh checks it is 3.11).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3 2>/dev/null || echo python3)

# The stamp file changes name when the lock's content changes, so the install
# re-runs exactly when requirements-dev.lock differs from what was installed.
LOCK_SHA := $(shell sha256sum $(DEV_LOCK) 2>/dev/null | cut -c1-16)
STAMP    := $(VENV)/.installed-$(LOCK_SHA)
# The runtime install's stamp. ensure-venv.sh keeps one stamp at a time (it prunes what its lock does not
# list), so the venv holds either the runtime lock or the dev lock; the dev lock's stamp serves `run` too.
RUN_LOCK_SHA := $(shell sha256sum $(LOCK) 2>/dev/null | cut -c1-16)
RUN_STAMP    := $(VENV)/.installed-run-$(RUN_LOCK_SHA)
RUN_DEPS     := $(if $(wildcard $(STAMP)),$(STAMP),$(RUN_STAMP))

# --no-reuse-hashes: recollect hashes from every index pip sees (PyPI plus the
# local extra-index/find-links mirrors), rather than trusting the old lock's.
# --no-emit-*: keep this machine's local index paths out of the lock files.
PIP_COMPILE_FLAGS := --quiet --generate-hashes --strip-extras --allow-unsafe --no-reuse-hashes \
	--no-emit-index-url --no-emit-find-links --no-emit-trusted-host
PIP_COMPILE := CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile

.PHONY: help setup run test test-fast lint fmt migrate lock lock-upgrade clean

help: ## List the targets
	@echo "Parley make targets:"
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-14s %s\n", $$1, $$2}'
	@echo "Variables: HOST=$(HOST) PORT=$(PORT) PYTEST_ARGS='$(PYTEST_ARGS)' PYTHON=$(PYTHON)"

setup: $(STAMP) ## Create/refresh .venv from requirements-dev.lock (hash-checked; test and lint tools included)

$(STAMP): $(DEV_LOCK)
	@PYTHON="$(PYTHON)" VENV="$(VENV)" LOCK="$(DEV_LOCK)" STAMP="$(STAMP)" \
		bash scripts/ensure-venv.sh

$(RUN_STAMP): $(LOCK)
	@PYTHON="$(PYTHON)" VENV="$(VENV)" LOCK="$(LOCK)" STAMP="$(RUN_STAMP)" \
		bash scripts/ensure-venv.sh

run: $(RUN_DEPS) ## Serve on HOST:PORT; the server migrates the DB first (runtime lock only; refuses a keyless non-loopback bind)
	mkdir -p data
	$(BIN)/python -m compileall -q app
	$(BIN)/python -m app --host $(HOST) --port $(PORT)

# pytest's workers (pytest-xdist): `auto` is one per core. Each test file runs whole on one worker, so a
# module's fixtures (a browser, a replica cluster) start once. PYTEST_WORKERS=0 runs in this process.
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile
FAST_TESTS := not browser and not container and not processes
# pytest exits 5 when PYTEST_ARGS leave a step no test: that step has nothing to do, it did not fail.
NO_TESTS_OK := || { rc=$$?; [ $$rc -eq 5 ] || exit $$rc; }

test: $(STAMP) ## Lint + types + the TypeScript client + chromium + all of pytest: parallel workers, then the `serial` tests alone (PYTEST_ARGS=..., PYTEST_WORKERS=auto)
	$(BIN)/ruff check app tests migrations bench clients
	$(BIN)/ruff format --check app tests migrations bench clients
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(MAKE) --no-print-directory client-test browser-deps kits-deps examples
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not serial" $(PYTEST_ARGS) $(NO_TESTS_OK)
	$(BIN)/python -m pytest -m serial $(PYTEST_ARGS) $(NO_TESTS_OK)

test-fast: $(STAMP) ## pytest without browser, container and multi-process tests, on parallel workers: the inner loop (PYTEST_ARGS=...)
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "$(FAST_TESTS)" $(PYTEST_ARGS) $(NO_TESTS_OK)

.PHONY: sizes
sizes: ## List app/ modules past ~400 lines and functions past ~60 (a signal to look at, not a limit)
	@$(PYTHON) scripts/sizes.py

# The benchmark harness (bench/README.md): 8-9 minutes on a 2-core machine; its figures go to
# bench/results/. BENCH_ARGS passes options, e.g. BENCH_ARGS="--levels 1,10,50,100" or "--smoke".
BENCH_ARGS ?=
.PHONY: bench
bench: $(STAMP) ## Benchmark the server against a fake upstream and raw litellm/openai (BENCH_ARGS=...)
	@# Bytecode first, as the image does: with PYTHONDONTWRITEBYTECODE set, every cold start would compile.
	$(BIN)/python -m compileall -q app
	$(BIN)/python -m bench.run $(BENCH_ARGS)

lint: $(STAMP) ## ruff check + ruff format --check + import contracts + mypy + hadolint (runs all, fails if any does)
	@rc=0; \
	echo "$(BIN)/ruff check app tests migrations bench clients"; $(BIN)/ruff check app tests migrations bench clients || rc=1; \
	echo "$(BIN)/lint-imports"; $(BIN)/lint-imports || rc=1; \
	echo "$(BIN)/ruff format --check app tests migrations bench clients"; $(BIN)/ruff format --check app tests migrations bench clients || rc=1; \
	echo "$(BIN)/mypy"; $(BIN)/mypy || rc=1; \
	echo "$(BIN)/hadolint Dockerfile"; $(BIN)/hadolint Dockerfile || rc=1; \
	exit $$rc

fmt: $(STAMP) ## Apply ruff format and ruff's safe fixes
	$(BIN)/ruff format app tests migrations bench clients
	$(BIN)/ruff check --fix app tests migrations bench clients

migrate: $(RUN_DEPS) ## alembic upgrade head
	mkdir -p data
	$(BIN)/alembic upgrade head

# Regenerate both locks from pyproject.toml, keeping current pins where possible.
# The dev lock is resolved first; the runtime lock is then seeded from it so both
# agree on every shared version.  `make lock-upgrade` moves everything to latest.
lock: $(STAMP) ## Regenerate requirements.lock and requirements-dev.lock (pip-compile)
	$(PIP_COMPILE) $(PIP_COMPILE_FLAGS) $(UPGRADE) --extra dev \
		--output-file $(DEV_LOCK) pyproject.toml
	cp $(DEV_LOCK) $(LOCK).tmp
	$(PIP_COMPILE) $(PIP_COMPILE_FLAGS) \
		--output-file $(LOCK).tmp pyproject.toml || { rm -f $(LOCK).tmp; exit 1; }
	mv $(LOCK).tmp $(LOCK)
	@echo "Locks written; 'make setup' installs the new dev lock."

lock-upgrade: ## Like lock, but upgrade every pin to the newest allowed release
	$(MAKE) lock UPGRADE=--upgrade

clean: ## Remove .venv and tool caches (keeps data/)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
	find . -path ./data -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

$(DEV_LOCK):
	@echo "$(DEV_LOCK) is missing: restore it from git (it is generated by 'make lock')" >&2; exit 1

# --- The published contract (openapi/) and the image --------------------------------------------------
# openapi/openapi.json comes from the app, openapi/parley.d.ts from it through openapi-typescript, pinned
# in openapi/package-lock.json. npm ci runs when node_modules is missing or that lock changed.
NODE_LOCK  := openapi/package-lock.json
NODE_STAMP := openapi/node_modules/.installed-$(shell sha256sum $(NODE_LOCK) 2>/dev/null | cut -c1-16)

.PHONY: openapi openapi-check openapi-deps container-test

openapi-deps: $(NODE_STAMP) ## Install openapi/'s pinned Node tools (npm ci) if missing or stale

$(NODE_STAMP): $(NODE_LOCK)
	@command -v npm >/dev/null || { echo "npm not found: openapi/ needs Node.js 20 with npm" >&2; exit 1; }
	cd openapi && npm ci --no-audit --no-fund --loglevel=error
	touch $@

openapi: $(STAMP) $(NODE_STAMP) ## Write openapi/openapi.json and openapi/parley.d.ts from the app
	$(BIN)/python -m scripts.export_openapi

openapi-check: $(STAMP) $(NODE_STAMP) ## Fail if openapi/openapi.json or openapi/parley.d.ts is stale
	$(BIN)/python -m scripts.export_openapi --check

container-test: $(STAMP) ## Build and run the image with podman and drive a turn in it (slow; root)
	PARLEY_CONTAINER_TEST=1 $(BIN)/python -m pytest tests/container $(PYTEST_ARGS)

# --- The TypeScript client, the page at /ui and the browser tests ---------------------------------------------
# clients/typescript/ is an npm package (its lock pins every package with an integrity hash); npm ci runs when
# node_modules is missing or the lock changed. The page's built files are committed in app/ui/ (the service
# and its image need no Node); `make ui` rebuilds them and client-test fails when they are stale.
CLIENT       := clients/typescript
CLIENT_LOCK  := $(CLIENT)/package-lock.json
CLIENT_STAMP := $(CLIENT)/node_modules/.installed-$(shell sha256sum $(CLIENT_LOCK) 2>/dev/null | cut -c1-16)

.PHONY: client-deps client-test ui client-fixtures browser-deps

client-deps: $(CLIENT_STAMP) ## Install clients/typescript's pinned packages (npm ci) if missing or stale

$(CLIENT_STAMP): $(CLIENT_LOCK)
	@command -v npm >/dev/null || { echo "npm not found: clients/typescript needs Node.js 20 with npm" >&2; exit 1; }
	cd $(CLIENT) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

client-test: $(STAMP) $(CLIENT_STAMP) ## Type-check the client, run its vitest suites (recorded + live server), check app/ui is built
	cd $(CLIENT) && npx tsc --noEmit
	cd $(CLIENT) && npx vitest run
	cd $(CLIENT) && node scripts/build-ui.mjs --check

ui: $(CLIENT_STAMP) ## Rebuild the page at /ui and the /docs assets into app/ui/ from clients/typescript
	cd $(CLIENT) && node scripts/build-ui.mjs

client-fixtures: $(STAMP) ## Record the client's test fixtures from the real service (clients/typescript/fixtures/)
	$(BIN)/python $(CLIENT)/scripts/capture_fixtures.py

# clients/kits/ holds the frontend kits' own packages (the AI SDK's `ai`, AG-UI's client), pinned in its lock,
# that tests/kits drives against a live server.
KITS       := clients/kits
KITS_LOCK  := $(KITS)/package-lock.json
KITS_STAMP := $(KITS)/node_modules/.installed-$(shell sha256sum $(KITS_LOCK) 2>/dev/null | cut -c1-16)

.PHONY: kits-deps

kits-deps: $(KITS_STAMP) ## Install clients/kits' pinned kit packages (npm ci) for tests/kits, if missing or stale

$(KITS_STAMP): $(KITS_LOCK)
	@command -v npm >/dev/null || { echo "npm not found: clients/kits needs Node.js 20 with npm" >&2; exit 1; }
	cd $(KITS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# examples/ai-sdk-react/ is a minimal React page with the AI SDK's useChat on Parley (docs/adapters.md), its
# packages pinned in its own lock; tests/browser/test_use_chat.py serves its build (dist/). npm ci runs when
# the lock changed, the build when a source or the install is newer than dist/.
EXAMPLE       := examples/ai-sdk-react
EXAMPLE_LOCK  := $(EXAMPLE)/package-lock.json
EXAMPLE_STAMP := $(EXAMPLE)/node_modules/.installed-$(shell sha256sum $(EXAMPLE_LOCK) 2>/dev/null | cut -c1-16)
EXAMPLE_SRC   := $(wildcard $(EXAMPLE)/src/*) $(EXAMPLE)/index.html $(EXAMPLE)/vite.config.js $(EXAMPLE)/tsconfig.json
EXAMPLE_DIST  := $(EXAMPLE)/dist/index.html

# examples/ag-ui/ is a React page on Parley's AG-UI endpoint with AG-UI's HttpAgent (its README); tests/kits
# drives its code and builds its page into a temporary folder, so `make test` needs only its packages.
AG_UI         := examples/ag-ui
AG_UI_LOCK    := $(AG_UI)/package-lock.json
AG_UI_STAMP   := $(AG_UI)/node_modules/.installed-$(shell sha256sum $(AG_UI_LOCK) 2>/dev/null | cut -c1-16)

# examples/copilotkit/ is CopilotKit's own runtime and <CopilotChat> on Parley (its README): ~870 packages,
# ~800 MB, so neither `make test` nor `make examples` installs it; its test is opt-in
# (PARLEY_COPILOTKIT_TEST=1, tests/kits/test_copilotkit_example.py).
COPILOTKIT       := examples/copilotkit
COPILOTKIT_LOCK  := $(COPILOTKIT)/package-lock.json
COPILOTKIT_STAMP := $(COPILOTKIT)/node_modules/.installed-$(shell sha256sum $(COPILOTKIT_LOCK) 2>/dev/null | cut -c1-16)

.PHONY: examples ag-ui-example copilotkit-example

examples: $(EXAMPLE_DIST) $(AG_UI_STAMP) ## Install examples/ai-sdk-react's and examples/ag-ui's pinned packages and build examples/ai-sdk-react into its dist/, if stale

$(EXAMPLE_STAMP): $(EXAMPLE_LOCK)
	@command -v npm >/dev/null || { echo "npm not found: $(EXAMPLE) needs Node.js 20 with npm" >&2; exit 1; }
	cd $(EXAMPLE) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(EXAMPLE_DIST): $(EXAMPLE_STAMP) $(EXAMPLE_SRC)
	cd $(EXAMPLE) && npm run --silent build

ag-ui-example: $(AG_UI_STAMP) ## Install examples/ag-ui (npm ci, if missing or stale) and build its page into its dist/
	cd $(AG_UI) && npm run --silent build -- --logLevel warn

$(AG_UI_STAMP): $(AG_UI_LOCK)
	@command -v npm >/dev/null || { echo "npm not found: $(AG_UI) needs Node.js 20.19+ with npm" >&2; exit 1; }
	cd $(AG_UI) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

copilotkit-example: $(COPILOTKIT_STAMP) ## Install examples/copilotkit, CopilotKit's packages (npm ci, if missing or stale; ~800 MB), and build its page into its dist/
	cd $(COPILOTKIT) && npm run --silent build -- --logLevel error

$(COPILOTKIT_STAMP): $(COPILOTKIT_LOCK)
	@command -v npm >/dev/null || { echo "npm not found: $(COPILOTKIT) needs Node.js 20.19+ with npm" >&2; exit 1; }
	cd $(COPILOTKIT) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

browser-deps: ## Install Debian's chromium for tests/browser when missing (root + apt-get; else a one-line skip)
	@bash scripts/ensure-chromium.sh
