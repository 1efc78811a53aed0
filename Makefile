# One-command entry points; each does its own set-up into ./.venv.
#   make demo   train a small RealFormer on an embedded corpus, translate, print sacreBLEU
#   make test   the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Builds (fairseq's sdist) must never pull a CUDA torch from the registry.
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt

.PHONY: setup demo test clean

setup: $(VENV)/.installed

$(VENV)/.installed: setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install torch==2.13.0
	$(VENV)/bin/pip install -e '.[test]'
	@touch $@

demo: setup
	$(PY) scripts/run_demo.py $(DEMO_ARGS)

test: setup
	$(PY) -m pytest tests -q $(TEST_ARGS)

clean:
	rm -rf runs data-bin/demo_en_de
