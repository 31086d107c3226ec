# The two commands a user needs: `make demo` and `make test`. Each installs what it needs.
# `make check` is the fast lane while working: the unit and in-process server tests.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CHROMIUM ?= /usr/bin/chromium
HOST ?= 127.0.0.1
PORT ?= 8000
# Any pydantic-ai model name (anthropic:claude-sonnet-4-5, openai:gpt-4o, ...) or scripted.
MODEL ?= scripted
PYTEST_ARGS ?=
# `make test` runs the suite in this many pytest-xdist processes, each test file whole in
# one (each process starts its own Chromium and PostgreSQL): the cores, at most 4.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))

.PHONY: all bootstrap postgresql web test check demo bench soak lint clean

all: test

$(VENV)/.installed: requirements-dev.txt pyproject.toml server/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e . -e ./server
	@touch $@

node_modules/.installed: package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm is missing: install Node.js 20+ (apt-get install -y nodejs npm)"; exit 1; }
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

$(CHROMIUM):
	@echo "Chromium is missing at $(CHROMIUM); installing Debian's chromium package"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

# The tests start their own PostgreSQL from these binaries (tests/support/postgres.py);
# if they cannot be installed, the PostgreSQL tests skip and say why.
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || { \
		echo "PostgreSQL is missing; installing Debian's postgresql package"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null \
		|| echo "could not install postgresql: the PostgreSQL tests will be skipped"; }

bootstrap: $(VENV)/.installed node_modules/.installed $(CHROMIUM) postgresql

# build/web/: Pyodide, PyScript, the browser wheels and our own, served with no network.
web: $(VENV)/.installed node_modules/.installed
	$(PY) scripts/build_web.py

# Files in collection order (browser ones last, tests/conftest.py): pytest-xdist's
# default orders them by their number of tests, which left the benchmark's smoke
# test, one test of about 3 minutes, to start last and end the run alone.
test: bootstrap web
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# No browser, no Node, no server processes: the sans-I/O cores and the server in this
# process on real sockets (and the PostgreSQL the tests start, when it is installed).
check: $(VENV)/.installed postgresql
	$(PY) -m pytest tests/unit tests/server -m "not browser and not node and not soak and not process" $(PYTEST_ARGS)

demo: bootstrap web
	@echo "clienttools demo: open http://$(HOST):$(PORT)/ (Ctrl+C stops it)"
	$(PY) -m clienttools_server --host $(HOST) --port $(PORT) --model $(MODEL) --retention 3600 --static demo --static build/web

bench: bootstrap web
	$(PY) -m bench

soak: bootstrap web
	$(PY) -m pytest -m soak --soak $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check client server tests scripts demo
	$(VENV)/bin/ruff format --check client server tests scripts demo
	$(VENV)/bin/mypy

clean:
	rm -rf build
