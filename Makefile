# gpumeter: `make demo` runs the main job, `make test` runs the tests; both set everything up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint unit integration bench testbin up down status clean

install: $(STAMP)

# Reinstall only when the dependency list changes; the project itself is installed editable.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: install
	$(BIN)/gpumeter demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

testbin:
	bash tests/kube/build.sh

test: install testbin lint
	$(BIN)/python -m pytest

unit: install
	$(BIN)/python -m pytest tests/unit

integration: install
	$(BIN)/python -m pytest tests/integration tests/chaos

bench: install
	$(BIN)/python benchmarks/pipeline.py

up: install
	$(BIN)/gpumeter up

down: install
	$(BIN)/gpumeter down

status: install
	$(BIN)/gpumeter status

clean:
	rm -rf gpumeter-out .pytest_cache .mypy_cache .ruff_cache
