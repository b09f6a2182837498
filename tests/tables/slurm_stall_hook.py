"""fairseq-train that stalls once: the ``TRAIN_HOOK`` of test_slurm.py's time-limit and scancel tests.

In a save directory without ``checkpoint_last.pt`` (the job's first attempt) it trains to update 2 (fairseq saves
``checkpoint_last.pt`` when it stops there), then sleeps, so that the SLURM job reaches its one-minute time limit
with a checkpoint to resume from and without spending a core on waiting. With ``checkpoint_last.pt`` (the job
submitted again) it is fairseq-train with the arguments it was given: it resumes to the run's ``--max-update``.
"""

import sys
import time
from pathlib import Path

import diverse_fairseq  # noqa: F401  (registers the plugin before fairseq imports the user dir)

args = sys.argv[1:]
first = not (Path(args[args.index("--save-dir") + 1]) / "checkpoint_last.pt").exists()
sys.argv = ["fairseq-train", *args, *(["--max-update", "2"] if first else [])]  # argparse: the last one wins
from fairseq_cli.train import cli_main  # noqa: E402

cli_main()
if first:
    print("[slurm_stall_hook] trained to update 2; waiting for the time limit", flush=True)
    time.sleep(3600)
