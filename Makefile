# diverse-fairseq: `make demo` and `make test` are all a fresh machine needs (both install if needed).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.diverse-fairseq-installed
PYTEST_ARGS ?=

DATASET ?= demo

.PHONY: install test demo bench clean-demo help tables figures check-tables data train evaluate average significance fixtures

help:
	@echo "make install   create .venv with torch, fairseq-fixed and this package (idempotent)"
	@echo "make demo [DATASET=demo_fr] [SEEDS=3]  train and evaluate on a shipped demo corpus (en→de; en→fr), print the results table"
	@echo "make tables    list the paper-table targets: make table-<id> [SCALE=demo|paper] [DATASET=..] [SEEDS=..] [GPUS=..] [LAUNCHER=slurm PARTITION=.. TIME_LIMIT=..]"
	@echo "make figures   list the paper-figure targets: make figure-<id> [SCALE=..] [SEEDS=..] (runs, then a PNG + JSON)"
	@echo "make check-tables [SCALE=demo|paper]  build every table row's model (demo: and train one step), no data"
	@echo "make test      lint (ruff, configured in pyproject.toml), then run the test suite"
	@echo "make bench     speed/memory ratios against stock fairseq, under 4 GB (the large cases: scripts/benchmark.py --large)"
	@echo "make data DATASET=iwslt14_de_en|wmt14_en_de|wmt14_en_de_joined|wmt17_zh_en|demo|demo_fr   download and binarize"
	@echo "make data DATASET=custom SRC=xx TGT=yy CORPUS_DIR=dir        your own corpus -> data-bin/custom_xx_yy"
	@echo "make train DATASET=... SETTING=small|base|big|big_300k|fairseq_base|fairseq_big|tiny [GPUS=N] [ARGS='...']  train"
	@echo "make evaluate CHECKPOINT=... DATASET=...                     BLEU (sacrebleu + tokenized), speed"
	@echo "make average INPUTS=save_dir N=5 OUTPUT=avg.pt               average the last N update checkpoints"
	@echo "make significance REF=... BASELINE=... SYSTEM=...            paired bootstrap and sign test"
	@echo "make clean-demo  delete the demos' prepared data and results (work/demo*, data-bin/demo*, results/demo)"
	@echo "make fixtures  rebuild the test fixtures under tests/fixtures"

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh
	VENV=$(VENV) bash scripts/install.sh

# pytest-xdist spreads the tests over the cores (at most 4 workers: most tests start fairseq processes of their own);
# --dist worksteal: each worker starts on one contiguous share of the tests (a module's fixtures built once per
# worker) and an idle worker takes over half of another's queue, so no long test waits at the end of a queue.
# PYTEST_ARGS='-n 0' runs them in one process; the 15 slowest tests are listed at the end (keeping make test short)
test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n auto --maxprocesses 4 --dist worksteal --durations 15 $(PYTEST_ARGS)

# DATASET=demo_fr: the same table on the English→French corpus (data/demo_fr)
demo: install
	$(PY) -m diverse_fairseq.tables demo --dataset $(DATASET)

# One target per paper table (configs/tables/<table>.yaml), e.g. `make table-emnlp18_t1 SCALE=demo`.
# Variables: DATASET, SCALE=demo|paper, SEEDS (a count or a list), GPUS (per run; 0 = CPU; unset: every visible GPU),
# TRAIN_ARGS, GENERATE_ARGS (every option: python -m diverse_fairseq.tables --help); LAUNCHER=slurm runs each row
# and seed as a SLURM job (PARTITION, TIME_LIMIT, NODES, WAIT, ...: docs/usage.md, "Paper tables on a cluster").
# make passes the variables given on its command line to the runner's environment.
# A figure (configs/tables/<paper>_f<N>.yaml, rows with a `figure:` point) is run by the same runner, then
# plotted: `make figure-emnlp20_f3 SCALE=demo SEEDS=3` writes results/<figure>/<dataset>-figure.png and .json.
FIGURES := $(basename $(notdir $(wildcard configs/tables/*_f[0-9]*.yaml)))
TABLES := $(filter-out demo $(FIGURES),$(basename $(notdir $(wildcard configs/tables/*.yaml))))

tables:
	@echo $(addprefix table-,$(TABLES))

figures:
	@echo $(addprefix figure-,$(FIGURES))

table-%: install
	$(PY) -m diverse_fairseq.tables $*

figure-%: install
	$(PY) -m diverse_fairseq.tables.figure $*

# Every row of every table, at SCALE=demo and SCALE=paper (or the one SCALE given): the exact fairseq-train
# arguments the runner would use, the model, criterion and optimizer built from them on a synthetic dictionary,
# and at demo scale one training step. One line per table/row/scale; fails naming every broken row.
check-tables: install
	$(PY) -m diverse_fairseq.tables.check

bench: install
	$(PY) scripts/benchmark.py

clean-demo:
	rm -rf work/demo work/demo_fr data-bin/demo data-bin/demo_fr results/demo

data: install
	bash scripts/prepare_data.sh $(DATASET)

train: install
	bash scripts/train.sh $(DATASET) $(SETTING) $(ARGS)

evaluate: install
	bash scripts/evaluate.sh $(CHECKPOINT) $(DATASET) $(ARGS)

average: install
	bash scripts/average_checkpoints.sh --inputs $(INPUTS) --num-update-checkpoints $(N) --output $(OUTPUT)

significance: install
	$(PY) -m diverse_fairseq.significance --ref $(REF) --baseline $(BASELINE) --system $(SYSTEM)

fixtures: install
	$(PY) tests/fixtures/make_fixtures.py
