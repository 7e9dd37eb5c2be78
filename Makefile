# Everything runs in a virtualenv at .venv, made on first use.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
JUNIT_DIR ?= build/junit

.PHONY: demo test lint unit e2e bench control-plane node vendor-plugin promtool image install protos fmt clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,remote,ucx]'
	touch $(STAMP)

install: $(STAMP)

## control-plane: build or reuse etcd and the Kubernetes control plane; prints their directory last
control-plane:
	@bash hack/control-plane/build.sh

## node: build or reuse the kubelet, containerd, its runc shim, ctr and the CNI loopback plugin
## (and install runc where missing); prints their directory last
node:
	@bash hack/node/build.sh

## promtool: build or reuse promtool (the dashboard and alert tests); prints its path last
promtool:
	@bash hack/promtool.sh

## vendor-plugin: build or reuse the vendor-like DRA kubelet plugin (Go) that the
## vendor-driver mode's end-to-end test runs; prints its directory last
vendor-plugin:
	@bash hack/vendor-plugin/build.sh

## image: build or reuse the product's OCI image from the Dockerfile with buildah, no Docker
## engine (and install buildah, mmdebstrap, umoci and runc where missing); prints the
## path of its oci-archive last
image:
	@bash hack/image/build.sh

## demo: the local demo on a real control plane (see README)
demo: install
	@dir=$$(bash hack/control-plane/build.sh | tail -n1); \
	KUBE_BIN_DIR=$$dir $(PY) -m hack.demo $(DEMO_ARGS)

## test: every test: lint and types, unit tests, end-to-end tests on a real control plane,
## then each older Kubernetes release's subset, then the support matrix against the results
# promtool is built (or found cached) before the tests: a cold build takes longer than
# one test may (the dashboard and alert tests would build it themselves otherwise).
# Each run writes JUnit XML to $(JUNIT_DIR)/<release>.xml (a gated run <release>+gates.xml:
# hack/versions-test.sh); hack/support_matrix.py checks
# docs/operations.md's support matrix against them (docs/operations.md, Support matrix).
test: lint
	@dir=$$(bash hack/control-plane/build.sh | tail -n1); \
	bash hack/promtool.sh >/dev/null; \
	rm -rf $(JUNIT_DIR); \
	release=$$($(PY) -c 'from testbed.versions import run_release; print(run_release())'); \
	KUBE_BIN_DIR=$$dir $(PY) -m pytest --durations=25 $(PYTEST_ARGS) --junitxml=$(JUNIT_DIR)/$$release.xml; \
	PY=$(PY) JUNIT_DIR=$(JUNIT_DIR) bash hack/versions-test.sh; \
	$(PY) -m hack.support_matrix $(JUNIT_DIR) docs/operations.md

unit: install
	@bash hack/promtool.sh >/dev/null
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

e2e: install
	@dir=$$(bash hack/control-plane/build.sh | tail -n1); \
	bash hack/promtool.sh >/dev/null; \
	KUBE_BIN_DIR=$$dir $(PY) -m pytest tests/e2e $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

fmt: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## bench: every benchmark under hack/bench/, each printing JSON as its last line
bench: install
	@dir=$$(bash hack/control-plane/build.sh | tail -n1); \
	failed=(); \
	for b in hack/bench/*.py; do \
	  [[ $$b == */goals.py ]] && continue; \
	  echo "== $$b"; PYTHONPATH=. KUBE_BIN_DIR=$$dir $(PY) "$$b" || failed+=("$$b"); \
	done; \
	if (( $${#failed[@]} )); then echo "goals not met: $${failed[*]}" >&2; exit 1; fi

protos: install
	PYTHON=$(PY) bash hack/gen-protos.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
