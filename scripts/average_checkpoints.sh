#!/usr/bin/env bash
# Average fairseq checkpoints (fairseq's scripts/average_checkpoints.py, loadable under torch >= 2.6):
#   scripts/average_checkpoints.sh --inputs CHECKPOINT_DIR --num-update-checkpoints 5 --output avg.pt
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
[ -z "${PYTHON:-}" ] && [ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
exec "$PY" -m diverse_fairseq.average_checkpoints "$@"
