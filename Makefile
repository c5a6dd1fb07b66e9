# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo tour test gpu-test gpu-prepare lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The quickstart job (search, verify, tune, store in ./tuner.db), then the answer read back
# from the database by two new processes: the CLI and the Python API.
demo: $(STAMP)
	$(BIN)/tuner launch examples/quickstart.yaml
	$(BIN)/tuner best rmsnorm_matmul --set X=16x256 --set W=256x256
	$(BIN)/python examples/use_best.py

# A tour of the verifier and the search on their own.
tour: $(STAMP)
	$(BIN)/python examples/demo.py

# The suite on TEST_JOBS processes (pytest-xdist, a test file per process), then the tests
# marked serial alone: they read the machine's load or time kernels against a quiet machine.
TEST_JOBS ?= 2
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile
	$(BIN)/python -m pytest -m serial

# What a short session on a lent GPU machine needs, made here (docs/devices.md, "Running on
# a lent GPU"); there: bash tools/gpu_session/run.sh
gpu-prepare: $(STAMP)
	PY=$(BIN)/python bash tools/gpu_session/prepare.sh

# The cuda device on this machine's GPU: every test marked gpu (they skip, saying why, where
# no GPU or no CuPy is usable), with each program's fused vs op-by-op CuPy times printed.
gpu-test: $(STAMP)
	$(BIN)/python -m pytest -m gpu -rs -s tests/kernels/test_gpu.py

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/verifier.py

clean:
	rm -rf $(VENV) build *.egg-info
