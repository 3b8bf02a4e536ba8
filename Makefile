# foldline — the two commands that must always work on a fresh machine: `make demo` and `make test`.
# (.venv is reinstalled when a record definition or the decoder's generator changes: the install compiles the
# archive decoder generated from them, hatch_build.py)
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test tools-prefetch lint typecheck unit bench servers-up servers-down clean

$(STAMP): pyproject.toml hatch_build.py services/foldline/adapters/avro/direct.py services/foldline/adapters/avro/layout.py \
	services/foldline/core/records.py services/foldline/core/events.py services/foldline/core/content.py \
	services/foldline/core/header.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	FOLDLINE_DEMO_MCP_SERVER="$${FOLDLINE_DEMO_MCP_SERVER:-$$(bash deploy/local/mcp.sh install || true)}" $(BIN)/foldline demo

lint: $(STAMP)
	$(BIN)/ruff check services tests benchmarks
	$(BIN)/ruff format --check services tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy services/foldline tests benchmarks

# The deploy tools' build (helm from source: ~2 min on 2 cores), the MCP test server, Chromium (the console's
# browser tests) and the trace backend (Arize Phoenix: ~1.5 min) start installing in the background first, so they
# run beside lint, types and the first tests; the tests' own install calls wait for them (locks).
LOCAL_STATE := $(or $(FOLDLINE_LOCAL_DIR),$(CURDIR)/.local)

tools-prefetch:
	@mkdir -p $(LOCAL_STATE)/logs
	@nohup bash deploy/local/helm.sh install > $(LOCAL_STATE)/logs/helm-prefetch.log 2>&1 &
	@nohup bash deploy/local/mcp.sh install > $(LOCAL_STATE)/logs/mcp-prefetch.log 2>&1 &
	@nohup bash deploy/local/chromium.sh install > $(LOCAL_STATE)/logs/chromium-prefetch.log 2>&1 &
	@nohup bash deploy/local/phoenix.sh install > $(LOCAL_STATE)/logs/phoenix-prefetch.log 2>&1 &

# Lint, types, then the whole suite with the local servers up; the servers stop even on failure.
# The suite runs on TEST_WORKERS processes (pytest-xdist): every test keeps to topics, key prefixes and buckets of
# its own. The chaos tests stop and flush the shared servers, and the kill -9 runs at scale assume the machine to
# themselves, so they run afterwards, one at a time (tests/run.sh).
TEST_WORKERS ?= 2

test: $(STAMP) tools-prefetch lint typecheck
	TEST_WORKERS=$(TEST_WORKERS) bash deploy/local/with-servers.sh bash tests/run.sh

# The fast subset for working: no servers, in parallel.
unit: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) -m "not kafka and not redis and not s3 and not slow"

bench: $(STAMP)
	bash deploy/local/with-servers.sh $(BIN)/python -m benchmarks.run

servers-up:
	bash deploy/local/up.sh

servers-down:
	bash deploy/local/down.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache foldline-data
