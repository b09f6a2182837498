#!/usr/bin/env bash
# Evaluate a checkpoint on a prepared dataset: detokenized output, sacrebleu BLEU with signature,
# tokenized (compound-split for German) BLEU, decoding speed.
#
#   scripts/evaluate.sh CHECKPOINT DATASET [extra fairseq-generate options]
#
# Settings: SUBSET=test|valid BEAM=N LENPEN=X BATCH_SIZE=N OUT=dir DATA_BIN=data-bin CPU=1 PRECISION=fp16
# Writes <checkpoint dir>/eval-<dataset>-<subset>-<checkpoint name>/{results.json,hyp.detok.*,...}.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
[ -z "${PYTHON:-}" ] && [ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
exec "$PY" -m diverse_fairseq.evaluate "$@"
