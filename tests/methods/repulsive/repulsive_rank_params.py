"""Test helper: run ``fairseq-train`` as one data-parallel rank and save that rank's parameters.

Usage: ``python repulsive_rank_params.py OUT.pt <fairseq-train arguments>``. Writes ``OUT.pt`` (the
parameters after training) and ``OUT.pt.init`` (when the trainer was built), so that a test can compare
what every rank holds (fairseq saves checkpoints on rank 0 only).
"""

import sys

import torch
from fairseq.trainer import Trainer
from fairseq_cli import train


def _snapshot(trainer):
    return {name: p.detach().clone() for name, p in trainer.get_model().named_parameters()}


def main():
    out = sys.argv[1]
    sys.argv = ["fairseq-train", *sys.argv[2:]]
    trainers = []
    build = Trainer.__init__

    def init(self, *args, **kwargs):
        build(self, *args, **kwargs)
        trainers.append(self)
        torch.save(_snapshot(self), out + ".init")

    Trainer.__init__ = init
    train.cli_main()
    torch.save(_snapshot(trainers[0]), out)


if __name__ == "__main__":
    main()
