"""Average the parameters of several fairseq checkpoints (e.g. the last N), loadable under torch >= 2.6.

    python -m diverse_fairseq.average_checkpoints --inputs DIR --num-update-checkpoints 5 --output avg.pt
    python -m diverse_fairseq.average_checkpoints --inputs a.pt b.pt c.pt --output avg.pt

The logic and command line are those of fairseq's ``scripts/average_checkpoints.py`` (MIT licence, Copyright (c)
Facebook, Inc. and its affiliates), which the fairseq package does not install. Differences: checkpoints are read
with ``torch.load(weights_only=True)``, which works because this package's ``__init__`` (imported before this
module) allowlists the classes fairseq pickles; parameters are accumulated in float64 (and written as float32 for
half-precision checkpoints, as fairseq does); integer buffers are floor-divided.
"""

import argparse
import os
from typing import Dict, List, Optional

import torch
from fairseq.checkpoint_utils import checkpoint_paths


def average_checkpoints(inputs: List[str]) -> Dict:
    """Load ``inputs`` and return the first checkpoint's state with the averaged ``model`` parameters."""
    first, sums = None, {}
    for path in inputs:
        state = torch.load(path, map_location="cpu", weights_only=True)
        first = first or state
        if list(state["model"]) != list(first["model"]):
            raise KeyError(f"checkpoint {path} has parameters {list(state['model'])}, expected {list(first['model'])}")
        for k, p in state["model"].items():  # out of place: p may be a shared parameter
            acc = p.double() if p.is_floating_point() else p
            sums[k] = sums[k] + acc if k in sums else acc
    for k, total in sums.items():  # half precision is averaged into float32, as fairseq does
        dtype = first["model"][k].dtype
        dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        first["model"][k] = (total / len(inputs)).to(dtype) if total.is_floating_point() else total // len(inputs)
    return first


def last_n_checkpoints(path: str, n: int, update_based: bool, upper_bound: Optional[int] = None) -> List[str]:
    """The ``n`` newest ``checkpoint_E_U.pt`` (update-based) or ``checkpointE.pt`` files in ``path``."""
    pattern = r"checkpoint_\d+_(\d+)\.pt" if update_based else r"checkpoint(\d+)\.pt"
    found = [file for file, key in checkpoint_paths(path, pattern, keep_match=True)
             if upper_bound is None or key <= upper_bound]  # newest first
    if len(found) < n:
        kind = "update (checkpoint_E_U.pt, --save-interval-updates)" if update_based else "epoch (checkpointE.pt)"
        raise SystemExit(f"error: found {len(found)} {kind} checkpoints in {path} but need {n}")
    return found[:n]


def average_files(inputs: List[str], output: str):
    """Average the checkpoint files ``inputs`` into ``output`` (written atomically)."""
    print("averaging checkpoints:\n  " + "\n  ".join(inputs), flush=True)
    state = average_checkpoints(inputs)
    tmp = output + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, output)
    print(f"wrote the average of {len(inputs)} checkpoints to {output}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description="Average the parameters of fairseq checkpoints.")
    p.add_argument("--inputs", required=True, nargs="+", help="checkpoint files, or one directory with "
                   "--num-epoch-checkpoints / --num-update-checkpoints")
    p.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--num-epoch-checkpoints", type=int, help="average the last N checkpointE.pt files")
    group.add_argument("--num-update-checkpoints", type=int, help="average the last N checkpoint_E_U.pt files")
    p.add_argument("--checkpoint-upper-bound", type=int, help="ignore checkpoints after this epoch/update")
    args = p.parse_args(argv)
    inputs = args.inputs
    n = args.num_update_checkpoints or args.num_epoch_checkpoints
    if args.checkpoint_upper_bound is not None and n is None:
        p.error("--checkpoint-upper-bound requires --num-epoch-checkpoints or --num-update-checkpoints")
    if n is not None:
        if len(inputs) != 1 or not os.path.isdir(inputs[0]):
            p.error("with --num-*-checkpoints, --inputs must be one directory")
        inputs = last_n_checkpoints(inputs[0], n, args.num_update_checkpoints is not None, args.checkpoint_upper_bound)
    average_files(inputs, args.output)
    return args.output


if __name__ == "__main__":
    main()
