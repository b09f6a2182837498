"""``python -m diverse_fairseq.analyze CHECKPOINT [CHECKPOINT ...] [options]``: head-diversity analysis.

For each fairseq translation checkpoint (stock ``transformer`` or ``diverse_transformer``) and a binarized
split: the disagreement scores of EMNLP 2018 Tables 4–5 (markdown + JSON), head importance by ablation
(Michel et al. 2019; EMNLP 2020 Figure 2) and PNG pictures (attention heatmaps, t-SNE of the heads as in the
journal version's Figure 3, per-layer scores, the distribution of ablation effects). With several
checkpoints, each gets its own subdirectory of ``--out`` and ``--out`` receives a side-by-side comparison.
The code is in :mod:`diverse_fairseq.analysis`.
"""

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import torch

from diverse_fairseq.runs.cli_logging import setup_cli_logging


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m diverse_fairseq.analyze", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help="fairseq checkpoint file(s)")
    p.add_argument("--data", help="binarized data directory (default: the one stored in the checkpoint, "
                   "resolved against the current directory and the checkpoint's parent directories)")
    p.add_argument("--subset", default="valid", help="split to analyse (default: valid)")
    p.add_argument("--max-sentences", type=int, default=500,
                   help="analyse the first N sentences of the split (default 500; 0 = all)")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch (default 4096)")
    p.add_argument("--out", help="output directory (default: analysis/ next to the checkpoint; for several "
                   "checkpoints, analysis/ in their common parent directory)")
    p.add_argument("--labels", help="comma-separated names of the checkpoints in reports and plots "
                   "(default: their directory names)")
    p.add_argument("--sentence-id", type=int, help="index in the split of the sentence for the attention "
                   "heatmaps (default: the first with 5-20 tokens on both sides)")
    p.add_argument("--seed", type=int, default=1, help="seed for t-SNE and everything random (default 1)")
    p.add_argument("--no-ablation", dest="ablation", action="store_false", help="skip head importance by ablation")
    p.add_argument("--ablation-bleu", action="store_true",
                   help="also measure the BLEU drop per masked head (beam search; slow)")
    p.add_argument("--bleu-sentences", type=int, default=100, help="sentences for --ablation-bleu (default 100)")
    p.add_argument("--beam", type=int, default=4, help="beam size for --ablation-bleu (default 4)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is available")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars (there are none where stderr is not a terminal)")
    args = p.parse_args(argv)
    setup_cli_logging()
    from diverse_fairseq.analysis.pipeline import Options, analyze_checkpoint, compare, unique_labels  # after logging

    args.max_sentences = args.max_sentences or None  # 0: all
    opts = Options(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Options) if f.name != "device"},
                   device="cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    checkpoints = args.checkpoints
    labels = args.labels.split(",") if args.labels else unique_labels(checkpoints)
    if len(labels) != len(checkpoints) or len(set(labels)) != len(labels):
        raise SystemExit(f"error: --labels needs {len(checkpoints)} distinct names, got {labels}")
    parents = [str(Path(c).resolve().parent) for c in checkpoints]
    out = Path(args.out) if args.out else Path(os.path.commonpath(parents)) / "analysis"
    if len(checkpoints) == 1:
        analyze_checkpoint(checkpoints[0], out, opts, labels[0])
        report = out / "scores.md"
    else:
        compare([analyze_checkpoint(c, out / label.replace("/", "_"), opts, label)
                 for c, label in zip(checkpoints, labels)], out, args.seed)
        report = out / "compare.md"
    print(report.read_text())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
