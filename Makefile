# The two commands of the README: `make run` and `make test`.
# Everything they need is installed here, into .venv, from nothing but Python 3.11.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test install down bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[torch,test]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/aicluster up
	$(BIN)/aicluster submit examples/ddp-train/job.yaml --follow
	$(BIN)/aicluster jobs
	$(BIN)/aicluster info

test: install
	$(BIN)/python -m pytest -q

down:
	$(BIN)/aicluster down

bench: install
	$(BIN)/python bench/submit_latency.py

clean:
	rm -rf $(VENV) build *.egg-info
