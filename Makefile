# gpumeter: `make demo` runs the main job, `make test` runs the tests; both set everything up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NATIVE_STAMP := $(VENV)/.native-built
NATIVE_SOURCES := native/Cargo.toml native/Cargo.lock native/pyproject.toml native/rust-toolchain.toml \
  native/gpumeter_native.pyi $(shell find native/src -name '*.rs')
# cargo in native/ (rustup's ~/.cargo/bin when not on PATH), against the venv's Python (pyo3).
CARGO := cd native && PATH="$$PATH:$$HOME/.cargo/bin" PYO3_PYTHON="$(abspath $(BIN)/python)" cargo

.PHONY: install proto demo test lint unit native-test integration kube bench testbin helm chart-lint manifests dist image browser up down status clean dashboards

install: $(STAMP) $(NATIVE_STAMP)

# Reinstall only when the dependency list changes; the project itself is installed editable.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# The worker's native rating path (native/, Rust through pyo3, built by maturin from crates.io):
# rebuilt when its sources change. Rust comes from rustup (~/.cargo/bin when not on PATH).
$(NATIVE_STAMP): $(STAMP) $(NATIVE_SOURCES)
	@PATH="$$PATH:$$HOME/.cargo/bin" command -v cargo >/dev/null || \
	  { echo "cargo not found: install Rust (rustup) to build native/" >&2; exit 1; }
	PATH="$$PATH:$$HOME/.cargo/bin" $(BIN)/pip install --quiet ./native
	@touch $(NATIVE_STAMP)

# The kubelet PodResources gRPC stubs, generated from collectors/agent/proto/podresources_v1.proto.
proto: install
	$(BIN)/python -m collectors.agent.proto.generate

demo: install
	$(BIN)/gpumeter demo

lint: install proto
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings

testbin:
	bash tests/kube/build.sh
	bash tests/kube/build_helm.sh

# helm (helm.sh/helm/v4 from the Go module proxy), cached beside the control-plane binaries.
HELM = $$(bash tests/kube/build_helm.sh 2>/dev/null | tail -n 1)
CHART := deploy/helm/gpumeter

helm:
	bash tests/kube/build_helm.sh

chart-lint: helm
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) -f deploy/helm/examples/production-values.yaml

# The chart rendered with its default values, release `gpumeter` in gpumeter-system: what the
# tests that read manifests read (tests/support/rendered.py). A test fails while it is stale.
manifests: helm
	$(HELM) template gpumeter $(CHART) --namespace gpumeter-system > deploy/rendered/gpumeter.yaml

# The wheels the image installs: gpumeter and the native rating extension (built by maturin).
dist: install
	rm -rf dist && mkdir -p dist
	PATH="$$PATH:$$HOME/.cargo/bin" $(BIN)/pip wheel --quiet --no-deps --wheel-dir dist . ./native
	@ls dist

# The one image of every component (Dockerfile): needs a Docker daemon and the base image.
IMAGE ?= gpumeter:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n 1)
image:
	@docker info >/dev/null 2>&1 || { echo "make image: no Docker daemon answers (docker info failed);" \
	  "build where one runs and python:3.11-slim-bookworm can be pulled (make dist builds the wheels here)" >&2; exit 1; }
	docker build -t $(IMAGE) .

# Headless Chromium for the report's browser test (tests/e2e/test_report_browser.py): Debian's
# package, installed where missing (CI machines run as root; elsewhere sudo is tried).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { if [ "$$(id -u)" = 0 ]; then apt-get install -y -q chromium; else sudo apt-get install -y -q chromium; fi; }

test: install testbin browser lint chart-lint native-test dist
	$(BIN)/python -m pytest --durations=40

# The native crate's own tests (its validators, scanner, cache and row layout).
native-test: install
	$(CARGO) test

unit: install
	$(BIN)/python -m pytest tests/unit

integration: install
	$(BIN)/python -m pytest tests/integration tests/chaos

# The Kubernetes control plane tests (real kube-apiserver, scheduler, KWOK).
kube: install testbin
	$(BIN)/python -m pytest tests/kube

# Grafana dashboards as code: regenerate dashboards/grafana/*.json from dashboards/panels.py
# (tests/unit/dashboards/test_boards.py fails while the committed JSON is stale).
dashboards: install
	$(BIN)/python -m dashboards.boards

bench: install proto
	$(BIN)/python -m benchmarks.pipeline
	$(BIN)/python -m benchmarks.sink_store
	$(BIN)/python -m benchmarks.worker_ceiling
	$(BIN)/python -m benchmarks.agent

up: install
	$(BIN)/gpumeter up

down: install
	$(BIN)/gpumeter down

status: install
	$(BIN)/gpumeter status

clean:
	rm -rf gpumeter-out .pytest_cache .mypy_cache .ruff_cache dist build
