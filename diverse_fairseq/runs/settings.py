"""The training settings: each model scale's hyper-parameters (:data:`SETTINGS`), the default setting of a
dataset, the names a user may give (a setting or a registered architecture), and which checkpoint a setting
evaluates (:func:`checkpoint_name`).

The settings take the papers' values where the papers give them and fill the rest from Vaswani et al. 2017 or
fairseq's examples (the comments on :data:`SETTINGS` and docs/paper-settings.md say which is which). They are the
single source of the recipes' hyper-parameters: :func:`diverse_fairseq.runs.plan.plan` turns one into
fairseq-train's arguments, the table specs (``tables/spec.py``) are validated against :data:`SETTINGS`, and the
hydra configs in ``configs/`` must give the same fairseq options (``tests/test_hydra_configs.py``).
"""

import math
from dataclasses import dataclass, field, replace
from difflib import get_close_matches
from pathlib import Path
from typing import Dict, List, Optional

from fairseq.models import ARCH_MODEL_REGISTRY

from .dataset_meta import load_dataset_meta

#: the metrics a setting may name, with its evaluated checkpoint in words for the report: None the last
#: checkpoint (the demo scale); "bleu" checkpoint_best.pt by validation BLEU (fairseq's --eval-bleu), as the THUMT
#: trainer of the EMNLP 2018 / NAACL 2019 / journal papers keeps its best checkpoints; "loss" checkpoint_best.pt by
#: validation loss (fairseq's default best metric), as the EMNLP 2020 authors' README tests checkpoint_best.pt
#: (bangann/Repulsive-Attention, commit f480b5c, RepulsiveTransformer/README.md lines 31 and 37)
METRICS = {None: "the last", "bleu": "the best by validation BLEU", "loss": "the best by validation loss"}


def check_metric(metric: Optional[str]):
    """ValueError naming the choices unless ``metric`` is one of :data:`METRICS`."""
    if metric not in METRICS:
        raise ValueError(f"best_checkpoint_metric={metric!r} is not known: use None (evaluate checkpoint_last.pt), "
                         "'bleu' or 'loss' (evaluate checkpoint_best.pt chosen by that validation metric)")


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
    # "shared" (fairseq's sharing, plan.model_args) or "untied" (source, target and output embeddings all separate,
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
    # dataset recipe's length penalty; and the output length limit max_len_a * |x| + max_len_b (fairseq's
    # --max-len-a/-b; None: the dataset recipe's)
    length_penalty: str = "fairseq"
    max_len_a: Optional[float] = None
    max_len_b: Optional[int] = None

    def __post_init__(self):
        check_metric(self.best_checkpoint_metric)


def checkpoint_name(metric: Optional[str], average: int = 0) -> str:
    """The file evaluated for a setting whose best metric is ``metric`` (:data:`METRICS`), after averaging the last
    ``average`` checkpoints (0: none); :meth:`diverse_fairseq.runs.plan.Plan.checkpoint` applies it to a run."""
    check_metric(metric)
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
# THUMT decodes at most |x| + decode_length tokens (Diversify-MHA bin/trainer.py and bin/translator.py:
# decode_length=50; utils/inference.py: max_length = source_length + decode_length, where source_length counts
# the source's EOS, and the loop runs while step < max_length, the batch's longest; a finished hypothesis then
# has at most |x| + 50 tokens before its EOS). fairseq's limit is max_len_a * src_len + max_len_b tokens before
# the EOS, with src_len the batch's longest source *including* its EOS (src_tokens.size(1)), so |x| + 50 is
# --max-len-a 1 --max-len-b 49.
THUMT_MAX_LEN = dict(max_len_a=1.0, max_len_b=50 - 1)
TINY_LAYERS = 2
# The THUMT Transformer that the EMNLP 2018, NAACL 2019 and journal papers trained (the authors' Diversify-MHA
# fork of THUMT): untied source/target/output embeddings over separate dictionaries, pre-norm, Adam
# (0.9, 0.98, 1e-9), the best checkpoints kept by validation BLEU (their trainer keeps the top 5). Dropout:
# the journal's text (§4.1.1) says "all types of dropout rate is set to 0.1" (residual, attention, ReLU);
# the released code has attention/ReLU dropout 0: we follow the text. Decoding as their THUMT (utils/inference.py):
# GNMT's length penalty (alpha: the recipe's 0.6, decode_alpha=0.6 in bin/trainer.py) and at most |x| + 50 tokens.
# Training length: their trainer's train_steps=100000 (bin/trainer.py) for every model, Big too; the papers say none.
THUMT = dict(embeddings="untied", normalize_before=True, attention_dropout=0.1, activation_dropout=0.1,
             adam_eps=1e-9, best_checkpoint_metric="bleu", keep_best=5, length_penalty="gnmt", **THUMT_MAX_LEN)
THUMT_TRAIN_STEPS = 100000
WMT_BATCH = dict(max_tokens=4096, batch_tokens=8 * 4096, save_interval_updates=1000)  # 8 GPUs x 4096 tokens
# big (16 heads, d = 1024): the schedule of base (below) peaks at 1024^-0.5 · 4000^-0.5 = 4.9e-4; "for both Base
# and Big models ... all types of dropout rate is set to 0.1" (journal §4.1.1, not Vaswani et al.'s 0.3); 100k
# updates, as the authors' trainer runs every model
BIG = Setting("transformer_vaswani_wmt_en_de_big", lr=5e-4, dropout=0.1, max_update=THUMT_TRAIN_STEPS, **WMT_BATCH,
              **THUMT)
SETTINGS: Dict[str, Setting] = {
    # fairseq's IWSLT14 Transformer recipe: lr 5e-4, warmup 4000, dropout 0.3, weight decay 1e-4, 4096 tokens
    # on one GPU as the repulsive-attention paper (one TITAN Xp); 50k updates as fairseq's IWSLT recipes
    # (pay_less_attention_paper; the papers give no number of updates). The EMNLP 2020 authors' scripts
    # (fairseq): joined dictionary with --share-all-embeddings, Adam eps 1e-8 (fairseq's default).
    # checkpoint_best.pt by validation loss, as their README tests (test-iwslt14.sh $DATA_DIR/checkpoint_best.pt)
    "small": Setting("transformer_iwslt_de_en", lr=5e-4, dropout=0.3, weight_decay=1e-4, max_tokens=4096,
                     batch_tokens=4096, max_update=50000, adam_eps=1e-8, best_checkpoint_metric="loss"),
    # The papers follow Vaswani et al. 2017 (journal §4.1.1): "learning rate initially 1.0" warmed up over
    # 4000 steps, i.e. a peak of 1.0 · d^-0.5 · 4000^-0.5 = 7e-4 for d = 512; 8 P40 GPUs x 4096 tokens;
    # dropout 0.1; single models ("without using the averaging or ensemble model"). 100k updates: the authors'
    # trainer (THUMT_TRAIN_STEPS). The model and its decoding are the THUMT Transformer's (above).
    "base": Setting("transformer_wmt_en_de", lr=7e-4, dropout=0.1, max_update=THUMT_TRAIN_STEPS, **WMT_BATCH,
                    **THUMT),
    "big": BIG,
    # big trained for Vaswani et al.'s 300k updates (their Transformer-big) instead of the authors' 100k: an
    # option, not the papers' setting (SETTING=big_300k, or a table row's `setting: big_300k`)
    "big_300k": replace(BIG, max_update=300000),
    # fairseq's Transformer-base as the EMNLP 2020 authors ran it (their WMT14 scripts): joined dictionary with
    # --share-all-embeddings, post-norm, lr 7e-4 warmed up over 8000 updates, Adam eps 1e-8, no weight decay;
    # their scripts batch 4 GPUs x 4096 tokens x update-freq 2 for MA but 4 for RMA, while the paper says
    # the configurations are the same: one batch (8 x 4096 tokens) for every row; checkpoint_best.pt by
    # validation loss, as their README tests (test-wmt14-base.sh $DATA_DIR/checkpoint_best.pt)
    "fairseq_base": Setting("transformer_wmt_en_de", lr=7e-4, dropout=0.1, max_update=100000, warmup=8000,
                            adam_eps=1e-8, best_checkpoint_metric="loss", **WMT_BATCH),
    # fairseq's Transformer-big, EMNLP 2020's reference row ("big-MA"): the big architecture with fairseq's
    # WMT14 en-de big recipe (Ott et al. 2018: lr 5e-4, dropout 0.3), shared embeddings, Adam eps 1e-8
    "fairseq_big": Setting("transformer_vaswani_wmt_en_de_big", lr=5e-4, dropout=0.3, max_update=300000,
                           adam_eps=1e-8, best_checkpoint_metric="loss", **WMT_BATCH),
    # laptop-CPU demo scale: a 2+2-layer, 128-wide pre-norm Transformer with 4 heads, small batches so that
    # it sees many updates (800, about 1.3 epochs). lr 2e-3, warmup 400, dropout 0.1 were chosen on the
    # baseline's validation BLEU over seeds 1-3 against lr 6e-3 / warmup 150 / no dropout and lr 1e-3
    # (docs/demo-findings.md, section 1).
    "tiny": Setting("transformer", lr=2e-3, dropout=0.1, max_tokens=1024, batch_tokens=1024, max_update=800,
                    warmup=400, layers=TINY_LAYERS, save_interval_updates=400, keep_checkpoints=2, log_interval=50,
                    extra=["--encoder-layers", str(TINY_LAYERS), "--decoder-layers", str(TINY_LAYERS),
                           "--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
                           "--encoder-ffn-embed-dim", "512", "--decoder-ffn-embed-dim", "512",
                           "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
                           "--encoder-normalize-before", "--decoder-normalize-before"]),
}
DEMO_SETTING = "tiny"  # the laptop-CPU scale: every row of a table at scale demo
DEFAULT_SETTING = {"demo": "tiny", "iwslt14_de_en": "small", "wmt14_en_de": "base",
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
        raise SystemExit(f"error: {data / 'prepare.json'} not found; prepare the data first (scripts/prepare_data.sh), "
                         f"or name the setting: {', '.join(SETTINGS)}")
    pairs = load_dataset_meta(data).train_pairs
    if pairs is None:
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


def diverse_equivalent(arch: str) -> str:
    """The plugin's architecture with ``arch``'s sizes: ``diverse_<arch>`` where registered, else
    ``diverse_transformer``."""
    name = arch if arch.startswith("diverse_") else f"diverse_{arch}"
    return name if name in ARCH_MODEL_REGISTRY else "diverse_transformer"
