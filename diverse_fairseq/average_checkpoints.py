"""Average the parameters of several fairseq checkpoints (e.g. the last N), loadable under torch >= 2.6.

    python -m diverse_fairseq.average_checkpoints --inputs DIR --num-update-checkpoints 5 --output avg.pt
    python -m diverse_fairseq.average_checkpoints --inputs a.pt b.pt c.pt --output avg.pt

The logic and command line are those of fairseq's ``scripts/average_checkpoints.py`` (MIT licence,
Copyright (c) Facebook, Inc. and its affiliates), which the fairseq package does not install.
Differences: checkpoints are read with ``torch.load(weights_only=True)``, which works because importing
``diverse_fairseq`` allowlists the classes fairseq pickles; parameters are accumulated in float64 (and
written as float32 for half-precision checkpoints, as fairseq does); integer buffers are floor-divided.
"""

import argparse
import collections
import os
import re
from typing import Dict, List, Optional

import torch

import diverse_fairseq  # noqa: F401  (side effect: allowlists fairseq's checkpoint globals for weights_only loading)


def average_checkpoints(inputs: List[str]) -> Dict:
    """Load ``inputs`` and return the first checkpoint's state with the averaged ``model`` parameters."""
    params_dict = collections.OrderedDict()
    params_keys = None
    dtypes = {}
    new_state = None
    for fpath in inputs:
        with open(fpath, "rb") as f:
            state = torch.load(f, map_location="cpu", weights_only=True)
        if new_state is None:
            new_state = state
        model_params = state["model"]
        keys = list(model_params.keys())
        if params_keys is None:
            params_keys = keys
        elif params_keys != keys:
            raise KeyError(f"checkpoint {fpath} has parameters {keys}, expected {params_keys}")
        for k in params_keys:
            p = model_params[k]
            dtypes.setdefault(k, p.dtype)
            acc = p.double() if p.is_floating_point() else p.clone()
            if k not in params_dict:
                params_dict[k] = acc.clone()  # clone: p may be a shared parameter
            else:
                params_dict[k] += acc
    averaged = collections.OrderedDict()
    for k, v in params_dict.items():
        if v.is_floating_point():  # half precision is averaged into float32, as fairseq does
            dtype = torch.float32 if dtypes[k] in (torch.float16, torch.bfloat16) else dtypes[k]
            averaged[k] = (v / len(inputs)).to(dtype)
        else:
            averaged[k] = v // len(inputs)
    new_state["model"] = averaged
    return new_state


def last_n_checkpoints(path: str, n: int, update_based: bool, upper_bound: Optional[int] = None) -> List[str]:
    """The ``n`` newest ``checkpoint_E_U.pt`` (update-based) or ``checkpointE.pt`` files in ``path``."""
    regexp = re.compile(r"checkpoint_\d+_(\d+)\.pt" if update_based else r"checkpoint(\d+)\.pt")
    entries = []
    for name in os.listdir(path):
        m = regexp.fullmatch(name)
        if m is not None:
            key = int(m.group(1))
            if upper_bound is None or key <= upper_bound:
                entries.append((key, name))
    if len(entries) < n:
        kind = "update (checkpoint_E_U.pt, --save-interval-updates)" if update_based else "epoch (checkpointE.pt)"
        raise SystemExit(f"error: found {len(entries)} {kind} checkpoints in {path} but need {n}")
    return [os.path.join(path, name) for _, name in sorted(entries, reverse=True)[:n]]


def average_last(save_dir: str, n: int, update_based: bool, output: str,
                 upper_bound: Optional[int] = None) -> List[str]:
    """Average the last ``n`` checkpoints of ``save_dir`` (update-based ``checkpoint_E_U.pt`` or per-epoch
    ``checkpointE.pt``) into ``output``; return the averaged files. SystemExit when there are fewer than ``n``."""
    return average_files(last_n_checkpoints(save_dir, n, update_based, upper_bound), output)


def average_files(inputs: List[str], output: str) -> List[str]:
    """Average the checkpoint files ``inputs`` into ``output`` (written atomically); return ``inputs``."""
    print("averaging checkpoints:\n  " + "\n  ".join(inputs), flush=True)
    state = average_checkpoints(inputs)
    tmp = output + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, output)
    print(f"wrote the average of {len(inputs)} checkpoints to {output}", flush=True)
    return inputs


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
        average_last(inputs[0], n, args.num_update_checkpoints is not None, args.output, args.checkpoint_upper_bound)
    else:
        average_files(inputs, args.output)
    return args.output


if __name__ == "__main__":
    main()
