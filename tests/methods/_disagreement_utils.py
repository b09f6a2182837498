"""In-process helpers for the disagreement tests: tiny models, a task and collated batches."""

import numpy as np
import torch
from fairseq import options
from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.tasks.translation import TranslationConfig, TranslationTask

import diverse_fairseq  # noqa: F401  (registrations)

TINY = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--share-all-embeddings", "--dropout", "0.0",
]


def tiny_task(vocab=50):
    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"w{i}")
    return TranslationTask(TranslationConfig(), d, d)


def model_args(arch, extra=()):
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, input_args=["unused", "--arch", arch, *TINY, *extra])


def build(model_cls, arch, task, seed=0, extra=()):
    torch.manual_seed(seed)
    return model_cls.build_model(model_args(arch, extra), task)


def batch(task, bsz=4, seed=0):
    """A collated batch with left-padded sources and right-padded targets of different lengths."""
    d = task.source_dictionary
    g = torch.Generator().manual_seed(seed)
    src, tgt = [], []
    for i in range(bsz):
        n, m = 3 + 2 * i, 7 - i
        src.append(torch.cat([torch.randint(d.nspecial, len(d), (n,), generator=g), torch.tensor([d.eos()])]))
        tgt.append(torch.cat([torch.randint(d.nspecial, len(d), (m,), generator=g), torch.tensor([d.eos()])]))
    ds = LanguagePairDataset(src, np.array([len(s) for s in src]), d, tgt, np.array([len(t) for t in tgt]), d)
    return ds.collater([ds[i] for i in range(bsz)])
