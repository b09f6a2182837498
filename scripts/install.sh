#!/usr/bin/env bash
# Idempotent install of diverse-fairseq into .venv at the repository root.
#
#  * keeps a torch that is already importable by $PYTHON (e.g. a user's CUDA build): the venv is then
#    created with --system-site-packages so that torch stays visible and is never replaced;
#  * otherwise installs torch==2.13.0 (the CPU wheel on these machines);
#  * installs fairseq-fixed==0.12.3.1 without build isolation and without its torchaudio pin
#    (see docs/fairseq-notes.md), then this package with `pip install -e .[dev]`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
FAIRSEQ_VERSION=0.12.3.1
STAMP=$VENV/.diverse-fairseq-installed

if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && "$VENV/bin/python" -c "import fairseq, torch, diverse_fairseq" 2>/dev/null; then
    echo "[install] $VENV is up to date"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    if "$PYTHON" -c "import torch" 2>/dev/null; then
        echo "[install] $PYTHON already has torch $("$PYTHON" -c 'import torch; print(torch.__version__)'); keeping it (venv with system site packages)"
        "$PYTHON" -m venv --system-site-packages "$VENV"
    else
        "$PYTHON" -m venv "$VENV"
    fi
fi
PY="$VENV/bin/python"
PIP="$PY -m pip install --disable-pip-version-check"

if "$PY" -c "import torch" 2>/dev/null; then
    echo "[install] torch $("$PY" -c 'import torch; print(torch.__version__)') is importable; not touching it"
else
    echo "[install] installing torch==$TORCH_VERSION"
    $PIP "torch==$TORCH_VERSION"
fi

# fairseq's build needs these in the environment because build isolation is off.
$PIP "setuptools>=68,<81" wheel "cython>=3" "numpy<2.3" packaging
if ! "$PY" -c "import fairseq" 2>/dev/null; then
    echo "[install] building fairseq-fixed==$FAIRSEQ_VERSION (compiles extensions, ~3 minutes)"
    $PIP --no-build-isolation --no-deps "fairseq-fixed==$FAIRSEQ_VERSION"
fi
echo "[install] installing diverse-fairseq (editable, with dev extra)"
$PIP --no-build-isolation -e ".[dev]"
"$PY" -c "import fairseq, torch, diverse_fairseq; print('[install] ok: torch', torch.__version__, 'fairseq', fairseq.__version__)"
touch "$STAMP"
