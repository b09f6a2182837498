#!/usr/bin/env bash
# Train on a prepared dataset with the papers' hyper-parameters, on every visible GPU (fp16):
#
#   scripts/train.sh DATASET [SETTING_OR_ARCH] [extra fairseq-train options]
#     SETTING: small (IWSLT) | base | big | big_300k | fairseq_base | fairseq_big | tiny (demo on a CPU), or an
#     architecture name; left out: the dataset's default
#   e.g. scripts/train.sh wmt14_en_de diverse_transformer_wmt_en_de --criterion ... (project models)
#
# Variables (SAVE_DIR, MAX_UPDATE, GPUS, DRY_RUN=1, ...), the save directory, resuming, Ctrl-C and failures:
# scripts/train.sh --help (diverse_fairseq/training.py), docs/training.md.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
[ -z "${PYTHON:-}" ] && [ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
exec "$PY" -m diverse_fairseq.training "$@"
