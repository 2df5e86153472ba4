# Two commands set everything up: `make run` and `make test`.
# `make test-fast` skips the slow tests (pip installs, the EP kit, conformance suites, real
# models); `make lint` is ruff check and ruff format --check over the repository.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PLUGINS := $(wildcard plugins/*/pyproject.toml)
STAMP := $(VENV)/.nxrt-installed

.PHONY: run test test-fast lint bench clean

run: $(STAMP)
	$(VENV)/bin/nxrt run

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) benchmarks/bench_light.py --models light_resnet50

$(PY):
	$(PYTHON) -m venv $(VENV)

# Core and every plugin, editable; reinstalled when a pyproject changes.
$(STAMP): pyproject.toml $(PLUGINS) | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]" $(foreach p,$(PLUGINS),-e $(dir $(p)))
	-command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && (apt-get install -y -q libopenblas0-pthread || (apt-get update -q && apt-get install -y -q libopenblas0-pthread)) || true
	touch $(STAMP)

clean:
	rm -rf $(VENV) build dist core/*.egg-info plugins/*/*.egg-info
