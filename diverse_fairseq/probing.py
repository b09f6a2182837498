"""``python -m diverse_fairseq.probing``: linguistic probing of a translation encoder (its ``--help`` describes the
method of :mod:`diverse_fairseq.analysis.probing`)."""

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from diverse_fairseq.analysis import probing
from diverse_fairseq.data import senteval
from diverse_fairseq.data.download import DownloadError, mirror_option
from diverse_fairseq.runs.cli_logging import setup_cli_logging
from diverse_fairseq.runs.options import add_options, resolve, warn_misspelled


@dataclass(frozen=True)
class ProbingFiles:
    """Where the probing command reads SentEval's task files, and where ``--download`` gets them."""

    data_dir: Optional[Path] = senteval.probing_data_option()
    mirror: Optional[str] = mirror_option("a folder or URL with the task files by name, for --download")


def main(argv=None) -> int:
    d = probing.ProbeSettings()
    p = argparse.ArgumentParser(prog="python -m diverse_fairseq.probing", description=probing.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a fairseq translation checkpoint (English source)")
    p.add_argument("--tasks", default="all", help="comma-separated: " + ",".join(t.name for t in senteval.TASKS)
                   + " (default: all)")
    add_options(p, ProbingFiles)
    p.add_argument("--download", action="store_true", help="fetch missing task files from SentEval (or the "
                   "mirror) into --data-dir")
    p.add_argument("--data", help="the model's binarized data directory (default: the one stored in the checkpoint)")
    p.add_argument("--seed", type=int, default=d.seed, help=f"classifier seed (default {d.seed})")
    p.add_argument("--hidden", type=int, default=d.hidden, help=f"MLP hidden units, 0 = logistic regression "
                   f"(default {d.hidden})")
    p.add_argument("--max-epochs", type=int, default=d.max_epochs, help=f"default {d.max_epochs}")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per encoder batch (default 4096)")
    p.add_argument("--threads", type=int, help="CPU threads of torch (default: torch's choice, one per core)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is available")
    args = p.parse_args(argv)
    warn_misspelled(os.environ, "probing")
    files = resolve(ProbingFiles, os.environ, args)
    setup_cli_logging()
    if args.threads:
        torch.set_num_threads(args.threads)
    tasks = senteval.parse_tasks(args.tasks)
    if not Path(args.checkpoint).is_file():
        raise SystemExit(f"error: checkpoint {args.checkpoint} not found")
    data_dir = files.data_dir or senteval.default_dir()
    if args.download:
        try:
            senteval.download(tasks, data_dir, mirror=files.mirror)
        except DownloadError as e:
            raise SystemExit(f"error: {e}") from None
    if data_dir.resolve() == senteval.real_dir().resolve():  # the real cache holds SentEval's own files only
        problems = [senteval.check_sizes(data_dir / t.filename) for t in tasks if (data_dir / t.filename).is_file()]
        if any(problems):
            raise SystemExit(f"error: {'; '.join(p for p in problems if p)}. These are stand-ins, not SentEval's "
                             f"files: delete them from {data_dir} and run again with --download")
    settings = probing.ProbeSettings(hidden=args.hidden, max_epochs=args.max_epochs, seed=args.seed)
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    payload = probing.probe_checkpoint(args.checkpoint, tasks, data_dir, settings, data=args.data, device=device,
                                       max_tokens=args.max_tokens)
    print(probing.to_markdown(payload))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(payload, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
