# foxhunt: two commands set everything up on a fresh machine.
#   make run    create .venv, install foxhunt, train the default run (DQN, synthetic ES) into mlruns/
#   make test   create .venv, install foxhunt with its test extras, run the default test suite
# TORCH is installed first so pip never swaps in another build; override it for CUDA machines,
# e.g. make run TORCH='torch>=2.4'.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
BIN     = $(VENV)/bin

.PHONY: install run test test-avx2 test-all ui clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/foxhunt-train $(ARGS)

# The default suite on TEST_WORKERS pytest-xdist workers, each test file's tests in one worker
# (its module fixtures built once); TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2

test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The default suite as on a CPU without AVX-512: oneDNN and ATen capped at AVX2 (no bf16 RNN
# kernels, no VNNI int8 products), whatever this machine's CPU has.
test-avx2: install
	ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 $(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-all: install
	$(BIN)/python -m pytest -q -m "" $(PYTEST_ARGS)

ui: install
	$(BIN)/foxhunt ui

clean:
	rm -rf $(VENV) .cache outputs multirun .pytest_cache .hypothesis
