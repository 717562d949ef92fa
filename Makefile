# longcall — the two commands a user needs: `make dev` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: dev check test test-pg15 chaos bench fuzz install clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

dev: $(STAMP)
	$(BIN)/longcall dev

# Lint, types and the walls between packages; zero findings, or CI is red.
# Formatting is by hand (no `ruff format`): see the README.
check: $(STAMP)
	$(BIN)/ruff check app outbox proof tests tools
	$(BIN)/mypy app outbox
	$(BIN)/lint-imports
	$(BIN)/python tools/check_vocabulary.py

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

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
