# Two commands set everything up: `make run` and `make test`.
# `make test-fast` skips the slow tests (pip installs, the EP kit, conformance suites, real
# models); `make lint` is ruff check and ruff format --check over the repository, then mypy
# over core, the four plugin packages and the fuzzer.
# `make test-avx2` runs the kernel, conformance and determinism tests again with numba and
# OpenBLAS forced to AVX2 code (what an AVX2-only CPU runs, built on any x86-64 that has
# AVX2); `make test-no-omp` runs them without numba's OpenMP layer and without a system
# OpenBLAS under MLX. .ci/run runs test-avx2.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PLUGINS := $(wildcard plugins/*/pyproject.toml)
TOOLS := $(wildcard tools/*/pyproject.toml)
STAMP := $(VENV)/.nxrt-installed

.PHONY: run test test-fast test-avx2 test-no-omp lint bench clean

run: $(STAMP)
	$(VENV)/bin/nxrt run

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

KERNEL_TESTS := tests/test_cpu_kernels.py $(wildcard tests/test_jit_*.py) \
	tests/test_conformance.py tests/test_determinism.py tests/test_jit_target.py \
	tests/test_quantized.py

# OPENBLAS_CORETYPE is left as it is where the machine sets it (older OpenBLAS builds need it).
test-avx2: $(STAMP)
	NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES= OPENBLAS_CORETYPE=$${OPENBLAS_CORETYPE:-Haswell} \
		$(PY) -m pytest -q $(KERNEL_TESTS)

test-no-omp: $(STAMP)
	NUMBA_THREADING_LAYER=workqueue NXRT_MLX_BLAS=reference \
		$(PY) -m pytest -q tests/test_cpu_kernels.py tests/test_determinism.py tests/test_mlx_ep.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy core/nxrt plugins/cpu/nxrt_ep_cpu plugins/mlx/nxrt_ep_mlx \
		plugins/legacy_abi/nxrt_ep_legacy_abi plugins/openvino/nxrt_ep_openvino \
		tools/nxrt-fuzz/nxrt_fuzz

bench: $(STAMP)
	$(PY) benchmarks/bench_light.py --models light_resnet50

$(PY):
	$(PYTHON) -m venv $(VENV)

# Core, every plugin and the fuzzer, editable; reinstalled when a pyproject changes.
$(STAMP): pyproject.toml $(PLUGINS) $(TOOLS) | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]" $(foreach p,$(PLUGINS) $(TOOLS),-e $(dir $(p)))
	-command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && (apt-get install -y -q libopenblas0-pthread || (apt-get update -q && apt-get install -y -q libopenblas0-pthread)) || true
	touch $(STAMP)

clean:
	rm -rf $(VENV) build dist core/*.egg-info plugins/*/*.egg-info tools/*/*.egg-info
