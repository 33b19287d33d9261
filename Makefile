# InfraRSI — every install step lives here. `make demo` and `make test` create the virtual
# environment on first use (Python 3.11, exact pins from pyproject.toml, torch 2.13.0 CPU build).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
# LitGPT in a virtual environment of its own (tests/support/litgpt-requirements.txt says why)
LITGPT_VENV  := .venv-litgpt
LITGPT_STAMP := $(LITGPT_VENV)/.installed-$(shell cat tests/support/litgpt-requirements.txt | cksum | cut -d' ' -f1)

.PHONY: venv demo test test-slow test-all schemas lint bench clean slurm-deps slurm-up slurm-down bench-scheduling prometheus-deps browser-deps sandbox-deps litgpt-venv

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (set PYTHON=/path/to/python3.11)"; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

## `litgpt pretrain` for the LitGPT job's tests (tests/e2e/test_litgpt_job.py; its fixture runs this when missing).
$(LITGPT_STAMP): tests/support/litgpt-requirements.txt
	test -x $(LITGPT_VENV)/bin/python || $(PYTHON) -m venv $(LITGPT_VENV)
	$(LITGPT_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r tests/support/litgpt-requirements.txt
	rm -f $(LITGPT_VENV)/.installed-*
	touch $@

litgpt-venv: $(LITGPT_STAMP)

## The main job end to end on the embedded default: init → doctor → run → verify → report (dense-1node).
demo: $(STAMP)
	$(BIN)/infrarsi demo

## The test suite CI runs (real nats-server, real PyTorch jobs; long tests excluded — see test-slow).
test: $(STAMP) $(LITGPT_STAMP)
	$(BIN)/python -m pytest -m "not slow" -q $(PYTEST_ARGS)

## Long tests (minutes each): the full demo and every reward hack end to end.
test-slow: $(STAMP) $(LITGPT_STAMP)
	$(BIN)/python -m pytest -m "slow" -q $(PYTEST_ARGS)

test-all: $(STAMP) $(LITGPT_STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

## Regenerate JSON Schema (events, contract) into schemas/; tests fail when schemas/ is stale.
schemas: $(STAMP)
	$(BIN)/python scripts/gen_schemas.py

lint: $(STAMP)
	$(BIN)/ruff check libs services tests bench workloads scripts examples
	$(BIN)/python -m mypy

bench: $(STAMP)
	mkdir -p out
	$(BIN)/python bench/eventlog.py --events 100000 --json out/eventlog.json
	$(BIN)/python bench/probe_overhead.py --json out/probe_overhead.json
	$(BIN)/python bench/search_vs_peers.py --json out/search_vs_peers.json
	$(BIN)/python bench/memory_model.py --json out/memory_model.json
	$(BIN)/python bench/modeler_refit.py --json out/modeler_refit.json
	$(BIN)/python bench/transfer.py --json out/transfer.json

## bubblewrap from Debian (root): the local backend's trial sandbox (docs/security.md). The sandbox tests'
## fixture does the same when it is missing.
sandbox-deps:
	command -v bwrap >/dev/null || \
	  { apt-get -o DPkg::Lock::Timeout=600 update -q && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends bubblewrap; }

## Slurm and munge from Debian (root). The slurm tests' fixture does the same when they are missing.
slurm-deps:
	command -v sbatch >/dev/null && command -v slurmd >/dev/null || \
	  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm slurm-client munge; }

## Prometheus from Debian (root), for the metrics test; its fixture does the same when it is missing.
prometheus-deps:
	command -v prometheus >/dev/null || \
	  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; }

## Chromium and its driver from Debian (root), for the dashboard's browser tests (tests/e2e/test_dashboard_browser.py);
## their fixture does the same when they are missing.
browser-deps:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver; }

## A Slurm cluster of this machine's own (slurmctld + two slurmd in network namespaces) for
## `infrarsi demo --backend slurm`; then `export SLURM_CONF=/run/infrarsi-slurm/slurm.conf`.
slurm-up: $(STAMP) slurm-deps
	PYTHONPATH=tests $(BIN)/python -m support.slurm_cluster up

## Scheduling overhead per trial, local vs Slurm, side by side (needs the cluster: starts it).
bench-scheduling: slurm-up
	mkdir -p out
	SLURM_CONF=/run/infrarsi-slurm/slurm.conf $(BIN)/python bench/scheduling.py --trials 5 --json out/scheduling.json

slurm-down: $(STAMP)
	PYTHONPATH=tests $(BIN)/python -m support.slurm_cluster down

clean:
	rm -rf .infrarsi out .pytest_cache $(LITGPT_VENV)
