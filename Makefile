# Two commands on a fresh machine (a clone, Python 3.11, the data beside the checkout or downloadable):
#
#   make test    every test: the fast ones (python -m pytest), then the slow ones (-m slow, two processes),
#                counts for each
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
# The slow set runs as two pytest processes at once (each QUICK run is shared within one process only, so the
# files that share the studies' QUICK runs stay together): these files, and every other slow test.
SLOW_STUDIES := tests/tests_studies.py tests/tests_pages.py tests/tests_commands.py
ARGS ?=

.PHONY: help setup data test lint run tour notebook

help:
	@sed -n '1,10p' Makefile

setup:
	@command -v $(BOOT) >/dev/null 2>&1 || { echo "[setup] $(BOOT) not found: install Python 3.11 or run make PYTHON=/path/to/python3.11" >&2; exit 1; }
	@$(BOOT) tools/bootstrap.py venv $(VENV)

data: setup
	@$(PY) tools/bootstrap.py data

# Both sets run even when the first fails (each prints its counts); the counts of both are recorded and
# rendered in the README; the exit status is non-zero if either set failed.
test: data
	@mkdir -p $(SCRATCH); rm -f $(SCRATCH)/tests_*.json $(SCRATCH)/slow_rest.*; rc=0; \
	echo "== make test 1/2: the fast tests (python -m pytest)"; \
	CHEMDATA_OFFLINE=1 $(PY) -m pytest --record-tests=$(SCRATCH)/tests_fast.json $(PYTEST_ARGS) || rc=1; \
	echo "== make test 2/2: the slow tests (python -m pytest -m slow), in two processes, one a core: the studies and" \
	     "pages ($(SLOW_STUDIES)) shown here, the rest in $(SCRATCH)/slow_rest.log, shown when both end"; \
	( CHEMDATA_OFFLINE=1 $(PY) -m pytest -m slow $(foreach f,$(SLOW_STUDIES),--ignore=$(f)) \
	    --record-tests=$(SCRATCH)/tests_slow_rest.json $(PYTEST_ARGS) > $(SCRATCH)/slow_rest.log 2>&1; \
	  echo $$? > $(SCRATCH)/slow_rest.rc ) & \
	CHEMDATA_OFFLINE=1 $(PY) -m pytest -m slow $(SLOW_STUDIES) --record-tests=$(SCRATCH)/tests_slow_studies.json \
	    $(PYTEST_ARGS) || rc=1; \
	wait; echo "== make test 2/2, the rest of the slow tests:"; cat $(SCRATCH)/slow_rest.log; \
	[ "$$(cat $(SCRATCH)/slow_rest.rc 2>/dev/null)" = 0 ] || rc=1; \
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
