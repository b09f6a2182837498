"""The training settings (:data:`SETTINGS`, the single source of the recipes' hyper-parameters: the papers' values
where they give them, else Vaswani et al. 2017's or fairseq's examples', docs/paper-settings.md says which), a
dataset's default setting, the names a user may give (a setting or a registered architecture) and the checkpoint
a setting evaluates (:func:`checkpoint_name`). The table specs are validated against :data:`SETTINGS`, and the
hydra configs in ``configs/`` must give the same fairseq options (``tests/test_hydra_configs.py``).
"""

import math
from dataclasses import dataclass, field, replace
from difflib import get_close_matches
from pathlib import Path
from typing import Dict, List, Optional

from fairseq.models import ARCH_MODEL_REGISTRY

from ..methods.length_penalty import BEAM_SEARCHES, LENGTH_PENALTIES
from .dataset_meta import load_dataset_meta
from .hints import prepare_hint

#: the metrics a setting may name, with its evaluated checkpoint in words for the report: None the last
#: checkpoint (the demo scale); "bleu" checkpoint_best.pt by validation BLEU (fairseq's --eval-bleu), as the THUMT
#: trainer of the EMNLP 2018 / NAACL 2019 / journal papers keeps its best checkpoints; "loss" checkpoint_best.pt by
#: validation loss (fairseq's default best metric), as the EMNLP 2020 authors' README tests checkpoint_best.pt
#: (bangann/Repulsive-Attention, commit f480b5c, RepulsiveTransformer/README.md lines 31 and 37)
METRICS = {None: "the last", "bleu": "the best by validation BLEU", "loss": "the best by validation loss"}


@dataclass(frozen=True)
class Setting:
    """One model scale. ``batch_tokens`` is the papers' number of tokens per update over all GPUs."""

    arch: str
    lr: float
    dropout: float
    max_tokens: int
    batch_tokens: int
    max_update: int
    weight_decay: float = 0.0
    warmup: int = 4000
    layers: int = 6  # encoder layers = decoder layers of the model (the architecture's, or set in ``extra``)
    save_interval_updates: int = 0  # 0: one checkpoint per epoch
    keep_checkpoints: int = 10
    average: int = 0  # average the last N checkpoints after training (0: no averaging, the papers' choice)
    log_interval: int = 100
    extra: List[str] = field(default_factory=list)
    # "shared" (fairseq's sharing, see plan.plan) or "untied" (source, target and output embeddings all separate,
    # as the THUMT Transformer of the EMNLP 2018 / NAACL 2019 / journal papers); EMBEDDINGS=shared|untied overrides
    embeddings: str = "shared"
    normalize_before: bool = False  # pre-norm (layer norm before each sub-layer) in encoder and decoder
    attention_dropout: Optional[float] = None  # None: the architecture's default (0 in fairseq)
    activation_dropout: Optional[float] = None  # ReLU dropout; None: the architecture's default (0)
    adam_eps: float = 1e-9
    best_checkpoint_metric: Optional[str] = None  # the checkpoint evaluated, one of METRICS (checkpoint_name)
    keep_best: int = 0  # how many of the best checkpoints fairseq keeps (--keep-best-checkpoints)
    # the decoding protocol of the setting's paper (validation BLEU and test): how a finished hypothesis' score is
    # normalised by its length, "fairseq" (--lenpen: / |y|^a) or "gnmt" (/ ((5 + |y|)/6)^a, THUMT's), with a the
    # dataset recipe's length penalty; the beam search, "fairseq" (fairseq's) or "thumt" (THUMT's,
    # diverse_fairseq.methods.thumt_search); and the output length limit max_len_a * |x| + max_len_b (fairseq's
    # --max-len-a/-b; None: the dataset recipe's)
    length_penalty: str = "fairseq"
    beam_search: str = "fairseq"
    max_len_a: Optional[float] = None
    max_len_b: Optional[int] = None

    def __post_init__(self):
        checkpoint_name(self.best_checkpoint_metric)  # an unknown metric: ValueError
        if self.length_penalty not in LENGTH_PENALTIES or self.beam_search not in BEAM_SEARCHES:
            raise ValueError(f"length_penalty={self.length_penalty!r}, beam_search={self.beam_search!r}: use one of "
                             f"{', '.join(LENGTH_PENALTIES)} and one of {', '.join(BEAM_SEARCHES)}")


def checkpoint_name(metric: Optional[str], average: int = 0) -> str:
    """The file evaluated for a setting whose best metric is ``metric`` (:data:`METRICS`), after averaging the last
    ``average`` checkpoints (0: none); :meth:`diverse_fairseq.runs.plan.Plan.checkpoint` applies it to a run."""
    if metric not in METRICS:
        raise ValueError(f"best_checkpoint_metric={metric!r} is not known: use None (evaluate checkpoint_last.pt), "
                         "'bleu' or 'loss' (evaluate checkpoint_best.pt chosen by that validation metric)")
    if average:
        return f"checkpoint_avg_last{int(average)}.pt"
    return "checkpoint_best.pt" if metric else "checkpoint_last.pt"


def describe(metric: Optional[str], averaged: int = 0) -> str:
    """What was evaluated, in words: "the average of the last 5 checkpoints (checkpoint_avg_last5.pt)", "a single
    checkpoint (the best by validation loss, checkpoint_best.pt)", ..."""
    name = checkpoint_name(metric, averaged)
    if averaged:
        return f"the average of the last {int(averaged)} checkpoints ({name})"
    return f"a single checkpoint ({METRICS[metric]}, {name})"


EMBEDDINGS = ("shared", "untied")
# Where each value comes from: docs/paper-settings.md ("Our training settings", "Paper scale", "Decoding").
# THUMT decodes at most |x| + 50 tokens before the EOS (Diversify-MHA decode_length=50, utils/inference.py, its
# source length counting the EOS); fairseq allows max_len_a * src_len + max_len_b, src_len with its EOS: 1, 49.
THUMT_MAX_LEN = dict(max_len_a=1.0, max_len_b=50 - 1)
TINY_LAYERS = 2
# The THUMT Transformer of the EMNLP 2018, NAACL 2019 and journal papers (the authors' Diversify-MHA fork): untied
# embeddings, pre-norm, Adam eps 1e-9, the best 5 checkpoints by validation BLEU; "all types of dropout rate is set
# to 0.1" (journal §4.1.1; the released code has attention/ReLU dropout 0: we follow the text); THUMT's beam search
# with GNMT's length penalty (decode_alpha=0.6, utils/inference.py); train_steps=100000 (bin/trainer.py) for every
# model, Big too: the papers say none.
THUMT = dict(embeddings="untied", normalize_before=True, attention_dropout=0.1, activation_dropout=0.1,
             adam_eps=1e-9, best_checkpoint_metric="bleu", keep_best=5, length_penalty="gnmt", beam_search="thumt",
             **THUMT_MAX_LEN)
THUMT_TRAIN_STEPS = 100000
WMT_BATCH = dict(max_tokens=4096, batch_tokens=8 * 4096, save_interval_updates=1000)  # 8 GPUs x 4096 tokens
# Vaswani et al.'s schedule with "learning rate initially 1.0" (journal §4.1.1) peaks at d^-0.5 · 4000^-0.5:
# 7e-4 for base (d = 512), 4.9e-4 for big (d = 1024, 16 heads, dropout 0.1 as base, not Vaswani et al.'s 0.3)
BIG = Setting("transformer_vaswani_wmt_en_de_big", lr=5e-4, dropout=0.1, max_update=THUMT_TRAIN_STEPS, **WMT_BATCH,
              **THUMT)
SETTINGS: Dict[str, Setting] = {
    # fairseq's IWSLT14 recipe, on one GPU as EMNLP 2020 (one TITAN Xp); 50k updates as fairseq's IWSLT recipes
    # (the papers give none); the authors' scripts: joined dictionary, Adam eps 1e-8; checkpoint_best.pt by
    # validation loss, as their README tests (test-iwslt14.sh $DATA_DIR/checkpoint_best.pt)
    "small": Setting("transformer_iwslt_de_en", lr=5e-4, dropout=0.3, weight_decay=1e-4, max_tokens=4096,
                     batch_tokens=4096, max_update=50000, adam_eps=1e-8, best_checkpoint_metric="loss"),
    "base": Setting("transformer_wmt_en_de", lr=7e-4, dropout=0.1, max_update=THUMT_TRAIN_STEPS, **WMT_BATCH,
                    **THUMT),
    "big": BIG,
    # Vaswani et al.'s 300k updates instead of the authors' 100k: an option, not the papers' setting
    "big_300k": replace(BIG, max_update=300000),
    # fairseq's Transformer-base as the EMNLP 2020 authors' WMT14 scripts: joined dictionary, post-norm, warm-up
    # 8000, Adam eps 1e-8; one batch for every row as the paper says (their scripts give RMA twice MA's);
    # checkpoint_best.pt by validation loss, as their README tests (test-wmt14-base.sh)
    "fairseq_base": Setting("transformer_wmt_en_de", lr=7e-4, dropout=0.1, max_update=100000, warmup=8000,
                            adam_eps=1e-8, best_checkpoint_metric="loss", **WMT_BATCH),
    # EMNLP 2020's reference row ("big-MA"): fairseq's WMT14 en-de big recipe (Ott et al. 2018: lr 5e-4, dropout 0.3)
    "fairseq_big": Setting("transformer_vaswani_wmt_en_de_big", lr=5e-4, dropout=0.3, max_update=300000,
                           adam_eps=1e-8, best_checkpoint_metric="loss", **WMT_BATCH),
    # the laptop-CPU demo: 2+2 pre-norm layers of width 128, 4 heads, 800 updates (about 1.3 epochs); lr, warm-up
    # and dropout chosen on the baseline's validation BLEU over seeds 1-3 (docs/demo-findings.md, section 1)
    "tiny": Setting("transformer", lr=2e-3, dropout=0.1, max_tokens=1024, batch_tokens=1024, max_update=800,
                    warmup=400, layers=TINY_LAYERS, save_interval_updates=400, keep_checkpoints=2, log_interval=50,
                    extra=["--encoder-layers", str(TINY_LAYERS), "--decoder-layers", str(TINY_LAYERS),
                           "--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
                           "--encoder-ffn-embed-dim", "512", "--decoder-ffn-embed-dim", "512",
                           "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
                           "--encoder-normalize-before", "--decoder-normalize-before"]),
}
DEMO_SETTING = "tiny"  # the laptop-CPU scale: every row of a table at scale demo
DEFAULT_SETTING = {"demo": "tiny", "demo_fr": "tiny", "iwslt14_de_en": "small", "wmt14_en_de": "base",
                   "wmt14_en_de_joined": "fairseq_base", "wmt17_zh_en": "base"}
# Any other dataset (your own corpus, scripts/prepare_data.sh custom) by its number of training pairs: below 20k
# the demo's tiny model (about one epoch in its 800 updates), below 1M Transformer-small (IWSLT14: 160k), else base.
SIZE_SETTINGS = ((20_000, "tiny"), (1_000_000, "small"), (math.inf, "base"))


def default_setting(dataset: str, data_bin) -> str:
    """The setting a dataset trains with when none is given: the papers' for their datasets, else by the
    number of training pairs in ``DATA_BIN/dataset/prepare.json`` (:data:`SIZE_SETTINGS`)."""
    if dataset in DEFAULT_SETTING:
        return DEFAULT_SETTING[dataset]
    data = Path(data_bin) / dataset
    if not (data / "prepare.json").exists():
        raise SystemExit(f"error: {data / 'prepare.json'} not found; prepare the data first: {prepare_hint(data)}; "
                         f"or name the setting: {', '.join(SETTINGS)}")
    pairs = load_dataset_meta(data).sentences.get("train")
    if not isinstance(pairs, int):
        raise SystemExit(f"error: {data / 'prepare.json'} does not record the number of training pairs, so no "
                         f"setting can be chosen for {dataset}: name one ({', '.join(SETTINGS)})")
    return next(name for limit, name in SIZE_SETTINGS if pairs < limit)


def resolve_setting(name: str):
    """(setting name, Setting, architecture) for a setting name or a registered architecture name.

    Any other name is refused (SystemExit) with the nearest setting: ``tinny`` must not train ``--arch tinny``
    with the base setting's hyper-parameters."""
    if name in SETTINGS:
        return name, SETTINGS[name], SETTINGS[name].arch
    if name not in ARCH_MODEL_REGISTRY:
        near = get_close_matches(name.lower(), list(SETTINGS), n=1, cutoff=0.0)  # always the nearest one
        archs = get_close_matches(name, [a for a in ARCH_MODEL_REGISTRY if a.startswith("diverse_")], n=1)
        hint = f"did you mean the setting {near[0]!r}?" + (f" (or the architecture {archs[0]!r})" if archs else "")
        raise SystemExit(f"error: {name!r} is neither a setting ({', '.join(SETTINGS)}) nor a registered "
                         f"architecture (--arch): {hint}")
    low = name.lower()
    key = "big" if "big" in low else "small" if "iwslt" in low else "tiny" if "tiny" in low else "base"
    return key, SETTINGS[key], name
