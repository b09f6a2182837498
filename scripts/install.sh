#!/usr/bin/env bash
# Idempotent install of diverse-fairseq into a virtual environment (.venv at the repository root, or $VENV).
#
#   bash scripts/install.sh                         # what `make install` runs
#   PYTHON=/path/to/python3 bash scripts/install.sh # create the venv from that Python (and keep its torch)
#   DRY_RUN=1 bash scripts/install.sh               # print what it would do, change nothing
#   DRY_RUN=venv bash scripts/install.sh            # only create the venv (keeping torch), install nothing
#
#  * Python: 3.11 or 3.12, the versions fairseq-fixed 0.12.3.1 declares (its classifiers; it sets no
#    Requires-Python). Another version is refused before anything is created.
#  * torch: a torch that is already importable is kept, in every case:
#      - the venv exists and imports torch: nothing is done to torch;
#      - $PYTHON imports torch (a system Python, a conda env, or another venv's python): the venv is created
#        with --system-site-packages, and when that torch lives in a site-packages the new venv does not see
#        (PYTHON is itself a venv), a .pth file adds exactly that directory; torch is never reinstalled;
#    otherwise torch==$TORCH_VERSION is installed:
#      - no usable NVIDIA GPU (`nvidia-smi -L` missing or failing): the CPU build from $TORCH_CPU_INDEX
#        (the PyTorch CPU wheel index), falling back to the default index if that index cannot serve it;
#      - a GPU: from the default index (the CUDA build).
#  * fairseq-fixed==0.12.3.1 without build isolation and without its torchaudio pin (docs/fairseq-notes.md),
#    then this package with `pip install -e .[dev,tensorboard]`.
#  * pip compiles nothing (--no-compile); the venv's packages are compiled to bytecode at the end, on all cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
FAIRSEQ_VERSION=0.12.3.1
PYTHON_VERSIONS="3.11 3.12"  # keep in step with requires-python in pyproject.toml
STAMP=$VENV/.diverse-fairseq-installed
DRY_RUN=${DRY_RUN:-0}

say() { echo "[install] $*"; }
die() { echo "[install] error: $*" >&2; exit 2; }

# The X.Y version of a Python interpreter, or nothing if it does not run.
python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }

# Exit with a message naming the variable if interpreter $2 (given as $1=NAME) is missing or not supported.
check_python() {
    local name=$1 py=$2 version
    version=$(python_version "$py")
    [ -n "$version" ] || die "$name=$py does not run: set $name to a Python ${PYTHON_VERSIONS// / or } interpreter, e.g. make install PYTHON=/usr/bin/python3.11"
    case " $PYTHON_VERSIONS " in
        *" $version "*) ;;
        *) die "$name=$py is Python $version; diverse-fairseq installs on Python ${PYTHON_VERSIONS// / or } (the versions fairseq-fixed $FAIRSEQ_VERSION supports): set $name to such an interpreter, e.g. make install PYTHON=/usr/bin/python3.11" ;;
    esac
}

# "VERSION<TAB>SITE_DIR" of the torch that interpreter $1 imports, or nothing if it imports none.
torch_info() {
    "$1" -c 'import os, torch; print(torch.__version__ + "\t" + os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))))' 2>/dev/null || true
}

# True when nvidia-smi exists and lists at least one GPU.
has_nvidia_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU "; }

# Decide what to do about torch; sets TORCH_ACTION (keep-venv | keep-python | cpu-index | default-index),
# TORCH_FOUND (version), TORCH_SITE (where the kept torch lives) and TORCH_WHY (one line for the log).
plan_torch() {
    local info
    TORCH_FOUND="" TORCH_SITE=""
    if [ -x "$VENV/bin/python" ]; then
        info=$(torch_info "$VENV/bin/python")
        if [ -n "$info" ]; then
            TORCH_ACTION=keep-venv TORCH_FOUND=${info%%$'\t'*} TORCH_SITE=${info#*$'\t'}
            TORCH_WHY="keep torch $TORCH_FOUND that $VENV already imports (from $TORCH_SITE)"
            return
        fi
    else
        info=$(torch_info "$PYTHON")
        if [ -n "$info" ]; then
            TORCH_ACTION=keep-python TORCH_FOUND=${info%%$'\t'*} TORCH_SITE=${info#*$'\t'}
            TORCH_WHY="keep torch $TORCH_FOUND of PYTHON=$PYTHON (from $TORCH_SITE): venv with --system-site-packages, plus a .pth file for that directory if the venv does not see it"
            return
        fi
    fi
    if has_nvidia_gpu; then
        TORCH_ACTION=default-index
        TORCH_WHY="install torch==$TORCH_VERSION from the default index (nvidia-smi lists a GPU: the CUDA build)"
    else
        TORCH_ACTION=cpu-index
        TORCH_WHY="install torch==$TORCH_VERSION from $TORCH_CPU_INDEX (no GPU: nvidia-smi -L lists none), falling back to the default index"
    fi
}

case $DRY_RUN in
    0|1|venv) ;;
    *) die "DRY_RUN=$DRY_RUN is not valid: use DRY_RUN=1 (print the plan), DRY_RUN=venv (create the venv only) or leave it unset" ;;
esac

if [ -x "$VENV/bin/python" ]; then
    check_python "the existing venv's python ($VENV/bin/python); delete $VENV or set VENV" "$VENV/bin/python"
else
    check_python PYTHON "$PYTHON"
fi
plan_torch
case $TORCH_ACTION in
    keep-*)
        # pyproject.toml asks for torch>=2.0: an older one would be replaced by pip, so refuse it instead
        [ "${TORCH_FOUND%%.*}" -ge 2 ] 2>/dev/null || die "the torch to keep ($TORCH_FOUND, in $TORCH_SITE) is older than 2.0, which diverse-fairseq needs: upgrade it there (pytorch.org), or use a PYTHON without torch (or another VENV) to have torch==$TORCH_VERSION installed"
        ;;
esac

if [ "$DRY_RUN" = 1 ]; then
    if [ -x "$VENV/bin/python" ]; then
        say "plan: venv $VENV exists (Python $(python_version "$VENV/bin/python")); PYTHON is not used"
    else
        say "plan: create venv $VENV from PYTHON=$PYTHON (Python $(python_version "$PYTHON"))"
    fi
    say "plan: torch: $TORCH_ACTION: $TORCH_WHY"
    say "plan: fairseq-fixed==$FAIRSEQ_VERSION (--no-build-isolation --no-deps), then pip install -e .[dev,tensorboard]"
    exit 0
fi

if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt scripts/install.sh ] \
        && "$VENV/bin/python" -c "import fairseq, torch, diverse_fairseq" 2>/dev/null; then
    say "$VENV is up to date"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    if [ "$TORCH_ACTION" = keep-python ]; then
        "$PYTHON" -m venv --system-site-packages "$VENV"
        if [ -z "$(torch_info "$VENV/bin/python")" ]; then
            # PYTHON is itself a venv (or similar): its site-packages is not the base Python's, so point at it.
            site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
            echo "$TORCH_SITE" > "$site/_diverse_fairseq_user_torch.pth"
        fi
    else
        "$PYTHON" -m venv "$VENV"
    fi
fi
PY="$VENV/bin/python"
# --no-compile: pip would compile each package's files to bytecode one file after the other; they are compiled at
# the end, on every core, by compile_bytecode
PIP="$PY -m pip install --disable-pip-version-check --no-compile"

# The venv's packages compiled to bytecode on every core (what pip does one file at a time): Python would otherwise
# compile each module again in every process that imports it wherever PYTHONDONTWRITEBYTECODE is set. Files that do
# not compile on this Python (written for newer ones, such as torch's py312 test helpers) are counted, and left as pip
# leaves them.
compile_bytecode() {
    local site errors
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    say "compiling the packages in $site to bytecode (all cores)"
    errors=$("$PY" -m compileall -q -j 0 "$site" | grep -c '^\*\*\* Error compiling' || true)
    [ "$errors" = 0 ] || say "$errors file(s) in $site are not Python $(python_version "$PY") (left uncompiled, as pip leaves them)"
}

# fairseq-fixed is installed with --no-deps, leaving out its torchaudio pin on purpose (docs/fairseq-notes.md);
# pip's resolver then reports that pin as an ERROR after every later install. Explain it right where it appears.
pip_install() {
    local log rc=0
    log=$(mktemp)
    $PIP "$@" 2>&1 | tee "$log" || rc=$?
    if grep -q "requires torchaudio" "$log"; then
        say "note: the pip ERROR above, \"fairseq-fixed ... requires torchaudio ..., which is not installed\", is expected and harmless: only fairseq's speech tasks import torchaudio, and this install leaves it out on purpose (its pinned wheel would replace the torch chosen above; docs/fairseq-notes.md). Nothing failed."
    fi
    rm -f "$log"
    return $rc
}

say "torch: $TORCH_WHY"
case $TORCH_ACTION in
    *-index) [ "$DRY_RUN" = venv ] && TORCH_ACTION=skip ;;
esac
case $TORCH_ACTION in
    skip) ;;
    keep-*)
        found=$(torch_info "$PY")
        [ "${found%%$'\t'*}" = "$TORCH_FOUND" ] || die "the venv $VENV does not import torch $TORCH_FOUND from $TORCH_SITE (it imports: ${found:-nothing}); delete $VENV and run again"
        ;;
    cpu-index)
        if ! $PIP --retries 1 --timeout 30 --index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION"; then
            say "torch==$TORCH_VERSION is not available from $TORCH_CPU_INDEX; installing it from the default index"
            $PIP "torch==$TORCH_VERSION"
        fi
        ;;
    default-index)
        $PIP "torch==$TORCH_VERSION"
        ;;
esac
if [ "$DRY_RUN" = venv ]; then
    say "venv $VENV created; torch: $(torch_info "$PY" | cut -f1 || true); nothing installed (DRY_RUN=venv)"
    exit 0
fi

# fairseq's build needs these in the environment because build isolation is off.
pip_install "setuptools>=68,<81" wheel "cython>=3" "numpy<2.3" packaging
if ! "$PY" -c "import fairseq" 2>/dev/null; then
    say "building fairseq-fixed==$FAIRSEQ_VERSION (compiles extensions, ~3 minutes)"
    $PIP --no-build-isolation --no-deps "fairseq-fixed==$FAIRSEQ_VERSION"
fi
say "installing diverse-fairseq (editable, with the dev and tensorboard extras)"
pip_install --no-build-isolation -e ".[dev,tensorboard]"
compile_bytecode
"$PY" -c "import fairseq, torch, diverse_fairseq; print('[install] ok: torch', torch.__version__, 'fairseq', fairseq.__version__)"
touch "$STAMP"
