#!/usr/bin/env bash
# Train on a prepared dataset with the papers' hyper-parameters, on every visible GPU (fp16), then
# average the last checkpoints.
#
#   scripts/train.sh DATASET [SETTING_OR_ARCH] [extra fairseq-train options]
#     SETTING: small (IWSLT) | base | big | big_300k | fairseq_base | fairseq_big | tiny (demo on a CPU), or an
#     architecture name; left out: the
#     dataset's default (the papers' for their datasets, by the number of training pairs for your own corpus)
#   e.g. scripts/train.sh wmt14_en_de base
#        scripts/train.sh wmt14_en_de diverse_transformer_wmt_en_de --criterion ... (project models)
#
# Settings: DATA_BIN CHECKPOINTS SAVE_DIR MAX_TOKENS UPDATE_FREQ MAX_UPDATE PRECISION AVERAGE SEED DRY_RUN=1
#   RESUME_ANYWAY=1 GPUS=N (the first N visible GPUs: CUDA_VISIBLE_DEVICES of the training processes; 0 = CPU);
#   all checked before anything runs.
# Each variant trains in CHECKPOINTS/DATASET_SETTING-<hash of the effective options> (SAVE_DIR overrides); the
# options are stored in train_args.json there, and resuming a directory trained with other options is refused.
# Rerunning a finished run (checkpoint_last.pt at MAX_UPDATE) changes nothing: raise MAX_UPDATE to train further.
# A misspelled setting, and --routing-* flags without a routing architecture, are refused before anything
# runs; a failed fairseq-train offers to resume only where a checkpoint exists (docs/training.md).
# Ctrl-C ends with one line: the update reached, the last checkpoint's update and the command that resumes
# (exit 130). A truncated checkpoint_last.pt is refused before training, naming the checkpoint to resume from.
# Multi-node: NNODES NODE_RANK MASTER_ADDR MASTER_PORT on each node (torchrun), or under SLURM:
#   sbatch --nodes 2 --ntasks-per-node 1 --gres gpu:8 --wrap "srun scripts/train.sh wmt14_en_de big"
#   (docs/usage.md, "GPUs and several machines")
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
export DATA_BIN=${DATA_BIN:-$REPO/data-bin} CHECKPOINTS=${CHECKPOINTS:-$REPO/checkpoints}
PY=${PYTHON:-python}
[ -z "${PYTHON:-}" ] && [ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
exec "$PY" -m diverse_fairseq.training "$@"
