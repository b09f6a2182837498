#!/usr/bin/env bash
# Prepare a dataset from its public download to a binarized fairseq dataset (resumable):
#   scripts/prepare_data.sh DATASET [options]      (DATASET: demo, iwslt14_de_en, wmt14_en_de, wmt17_zh_en, ...)
#   SRC=xx TGT=yy CORPUS_DIR=dir scripts/prepare_data.sh custom   your own corpus: dir/{train,valid,test}.{xx,yy}
# wmt14_en_de has one dictionary per language; wmt14_en_de_joined is macaron-net's recipe for EMNLP 2020, joined.
# The datasets, settings (environment variables or options) and steps: `scripts/prepare_data.sh demo --help`.
# WORK_DIR and DATA_BIN default to work/ and data-bin/ in the repository. Uses the repository's .venv when present.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
[ -z "${PYTHON:-}" ] && [ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
exec "$PY" -m diverse_fairseq.data.prepare "$@"
