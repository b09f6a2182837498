# diverse-fairseq: `make demo` and `make test` are all a fresh machine needs (both install if needed).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.diverse-fairseq-installed
PYTEST_ARGS ?=

.PHONY: install test demo bench clean-demo help

help:
	@echo "make install   create .venv with torch, fairseq-fixed and this package (idempotent)"
	@echo "make demo      train and evaluate on the shipped demo corpus, print the results table"
	@echo "make test      run the test suite"
	@echo "make bench     speed/memory ratios against stock fairseq (JSON on the last line)"

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh
	VENV=$(VENV) bash scripts/install.sh

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

demo: install
	$(PY) scripts/demo.py

bench: install
	$(PY) scripts/benchmark.py

clean-demo:
	rm -rf work/demo data-bin/demo checkpoints/demo results/demo
