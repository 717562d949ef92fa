# longcall — the two commands a user needs: `make dev` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: dev check test test-typescript test-pg15 chaos bench fuzz install clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet -e clients/python
	@touch $(STAMP)

install: $(STAMP)

dev: $(STAMP)
	$(BIN)/longcall dev

# Lint, types and the walls between packages; zero findings, or CI is red.
# Formatting is by hand (no `ruff format`): see the README.
check: $(STAMP)
	$(BIN)/ruff check app outbox proof tests tools clients/python clients/testing
	$(BIN)/mypy app outbox
	$(BIN)/mypy --strict clients/python/src
	$(BIN)/lint-imports
	$(BIN)/python tools/check_vocabulary.py

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-typescript

# The TypeScript client's own suite (Node's test runner, against a real
# longcall it starts). Without node it is skipped, saying so in one line;
# REQUIRE_NODE=1 (.ci/run) makes that skip a failure.
test-typescript: $(STAMP)
	@if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then \
	  cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error \
	    && PYTHON=$(abspath $(BIN))/python npm test --silent; \
	elif [ -n "$(REQUIRE_NODE)" ]; then \
	  echo "the TypeScript client's tests need node and npm, which were not found" >&2; exit 1; \
	else echo "skipped: the TypeScript client's tests (node and npm not found)"; fi

# The same suite on a plain PostgreSQL 15 server (Debian's postgresql-15).
PG15_BIN ?= /usr/lib/postgresql/15/bin
test-pg15: $(STAMP)
	TEST_PG_BIN=$(PG15_BIN) $(BIN)/python -m pytest -q $(PYTEST_ARGS)

chaos: $(STAMP)
	$(BIN)/longcall chaos $(CHAOS_ARGS)

bench: $(STAMP)
	$(BIN)/longcall bench $(BENCH_ARGS)

# schemathesis over /openapi.json against a throwaway setup, three bounded
# runs (owner key, invalid key, admin token); not part of `make test`.
fuzz: $(STAMP)
	@test -x $(BIN)/schemathesis || $(BIN)/python -m pip install --quiet -e '.[dev,fuzz]'
	$(BIN)/python tools/fuzz.py $(FUZZ_ARGS)

clean:
	rm -rf $(VENV) .longcall .pytest_cache
