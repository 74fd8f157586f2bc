# Two commands on a fresh machine (a clone, Python 3.11, the data beside the checkout or downloadable):
#
#   make test    every test: the fast ones (python -m pytest), then the slow ones (-m slow), counts for each
#   make run     the main job, demos/run_all.py (about an hour on 2 cores); make run ARGS=--quick for a smoke run
#
# Both first create .venv with $(PYTHON) if there is none and install into it (once: a stamp keyed on
# pyproject.toml's hash), then find the data; tools/bootstrap.py does both and says what it did.
# Also: make lint (ruff), make tour (the notebook, headless), make notebook (JupyterLab on it), make setup,
# make data.

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
BOOT := $(if $(wildcard $(PY)),$(PY),$(PYTHON))
SCRATCH := build/tests
PYTEST_ARGS ?=
ARGS ?=

.PHONY: help setup data test lint run tour notebook

help:
	@sed -n '1,9p' Makefile

setup:
	@command -v $(BOOT) >/dev/null 2>&1 || { echo "[setup] $(BOOT) not found: install Python 3.11 or run make PYTHON=/path/to/python3.11" >&2; exit 1; }
	@$(BOOT) tools/bootstrap.py venv $(VENV)

data: setup
	@$(PY) tools/bootstrap.py data

# Both sets run even when the first fails (each prints its counts); the counts of both are recorded and
# rendered in the README; the exit status is non-zero if either set failed.
test: data
	@mkdir -p $(SCRATCH); rm -f $(SCRATCH)/tests_*.json; rc=0; \
	echo "== make test 1/2: the fast tests (python -m pytest)"; \
	CHEMDATA_OFFLINE=1 $(PY) -m pytest --record-tests=$(SCRATCH)/tests_fast.json $(PYTEST_ARGS) || rc=1; \
	echo "== make test 2/2: the slow tests (python -m pytest -m slow)"; \
	CHEMDATA_OFFLINE=1 $(PY) -m pytest -m slow --record-tests=$(SCRATCH)/tests_slow.json $(PYTEST_ARGS) || rc=1; \
	$(PY) tools/bootstrap.py record $(SCRATCH) || rc=1; \
	if [ $$rc -ne 0 ]; then echo "== make test: FAILED (see the summaries above)"; else echo "== make test: all passed"; fi; \
	exit $$rc

lint: setup
	$(VENV)/bin/ruff check .

run: data
	$(PY) demos/run_all.py $(ARGS)

tour: data
	$(VENV)/bin/jupyter execute demos/tour.ipynb

notebook: data
	@$(PY) tools/bootstrap.py extra notebook
	$(VENV)/bin/jupyter lab demos/tour.ipynb
