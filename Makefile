# One-command entry points; each does its own set-up into ./.venv.
#   make demo        train a small RealFormer on an embedded corpus, translate, print sacreBLEU
#   make test        the test suite, on two workers (pytest-xdist; PYTEST_WORKERS=0: in one process)
#   make test-fast   the tests that start no training process (-m "not slow"), for the edit-test loop
#   make lint        ruff (ruff.toml: pyflakes, pycodestyle, bugbear, isort); CI runs it before the tests
#   make gpu-check   everything a GPU must show, in priority order within one lease (docs/gpu.md;
#                    bash scripts/gpu_device_run.sh sets up first); GPU_CHECK_ARGS=--dry-run on CPU
#   make gpu-wheels  download into .whl/ the wheels a GPU machine without network needs
# On a machine whose Python already has torch (a GPU machine): make gpu-check PY=python3
# uses that interpreter and skips the venv set-up (scripts/gpu_machine_setup.sh installs the rest).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Builds (fairseq's sdist) must never pull a CUDA torch from the registry.
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
# PY given on the command line: that interpreter is already set up, no venv
ifeq ($(origin PY),command line)
PY_SETUP :=
else
PY_SETUP := setup
endif
WHEELS ?= .whl
# the suite runs its test files on this many processes (CI: 2 cores); a file's tests share one
# process, so its module fixtures (trained models) are built once
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadfile
# the GPU machine's Python (see docs/gpu.md); pip matches each manylinux tag exactly
GPU_PYTHON ?= 3.12
WHEEL_TARGET := --python-version $(GPU_PYTHON) --implementation cp --only-binary=:all: \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64 --platform manylinux1_x86_64
GPU_WHEELS := fairseq-fixed==0.12.3.1 hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3
# installed there only where missing (setuptools, wheel: pip's offline build of this project)
GPU_OPTIONAL_WHEELS := pytest pyyaml iniconfig pluggy pygments packaging setuptools wheel

.PHONY: setup demo test test-fast lint clean gpu-check gpu-wheels

setup: $(VENV)/.installed

$(VENV)/.installed: setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[test]'
	# fairseq-fixed pulls torchaudio 2.11, which cannot load beside torch 2.13 (and none matching
	# 2.13 is published); transformers imports any installed torchaudio, so it goes: fairseq
	# imports torchaudio only inside its speech tasks, which this project does not use.
	$(VENV)/bin/pip uninstall -q -y torchaudio
	@touch $@

demo: setup
	$(PY) scripts/run_demo.py $(DEMO_ARGS)

# every run ends with its 25 slowest steps (setup, call, teardown): where the suite's time goes
DURATIONS ?= --durations=25
test: setup
	$(PY) -m pytest tests -q $(XDIST) $(DURATIONS) $(TEST_ARGS)

test-fast: setup
	$(PY) -m pytest tests -q -m "not slow" $(XDIST) $(DURATIONS) $(TEST_ARGS)

lint: setup
	$(PY) -m ruff check .

gpu-check: $(PY_SETUP)
	$(PY) -m realformer_tools.experiments.gpu_check $(GPU_CHECK_ARGS)

gpu-wheels: $(PY_SETUP)
	rm -rf $(WHEELS) && mkdir -p $(WHEELS)/optional
	$(PY) -m pip download -q --no-deps $(WHEEL_TARGET) -d $(WHEELS) $(GPU_WHEELS)
	# antlr4-python3-runtime 4.9.3 (hydra-core and omegaconf pin 4.9.*) is published as an sdist only
	$(PY) -m pip wheel -q --no-deps -w $(WHEELS) antlr4-python3-runtime==4.9.3
	$(PY) -m pip download -q --no-deps $(WHEEL_TARGET) -d $(WHEELS)/optional $(GPU_OPTIONAL_WHEELS)
	@ls $(WHEELS) $(WHEELS)/optional

clean:
	rm -rf runs data-bin/demo_en_de
