"""Train with the recipes' hyper-parameters: ``fairseq-train --user-dir diverse_fairseq`` on every visible GPU.

The recipes take the papers' values where the papers give them and fill the rest from Vaswani et al. 2017 or
fairseq's examples (the comments on :data:`SETTINGS` and docs/paper-settings.md say which is which).

    python -m diverse_fairseq.training DATASET SETTING_OR_ARCH [extra fairseq-train options]
    scripts/train.sh DATASET SETTING_OR_ARCH [...]

SETTING is ``small`` (Transformer-small, IWSLT), ``base``, ``big`` (the THUMT papers' Transformer-Base and -Big,
100k updates as the authors' trainer), ``big_300k`` (big for Vaswani et al.'s 300k updates), ``fairseq_base``,
``fairseq_big`` (fairseq's Transformer, EMNLP 2020) or ``tiny`` (the laptop-CPU demo scale); an architecture name
(``transformer_wmt_en_de``, ``diverse_transformer_vaswani_wmt_en_de_big``, ...) picks the setting its name implies
(``big``, ``iwslt`` → small, ``tiny``, else base) and replaces its architecture. Extra options go to
fairseq-train after ours, so they override them (e.g. ``--criterion ... --optimizer repulsive_adam``).

Batch: the papers' tokens per update (base/big: 8 GPUs × 4096 tokens) are kept on any number of GPUs
with ``--update-freq = ceil(tokens per update / (GPUs × max tokens))``. fp16 on GPU. Tensorboard logs
go to ``SAVE_DIR/tensorboard`` when a writer is installed (``pip install -e .[tensorboard]``: tensorboardX;
fairseq also takes ``torch.utils.tensorboard`` when the ``tensorboard`` package is there); without one,
``--tensorboard-logdir`` is left out and the run says so. The journal version reports single models (the
conference papers do not say), so no setting averages checkpoints; with ``AVERAGE=N`` the last N checkpoints are
averaged after training into ``SAVE_DIR/checkpoint_avg_lastN.pt`` (fairseq's averaging, see
:mod:`diverse_fairseq.average_checkpoints`), and that average is evaluated.

These settings are the single source of the recipes' hyper-parameters: the hydra configs in ``configs/``
must give the same fairseq options (``tests/test_hydra_configs.py`` compares them).

Save directory: ``SAVE_DIR``, else ``CHECKPOINTS/<DATASET>_<SETTING_OR_ARCH>-<hash>``, one per variant: the hash
covers the effective fairseq-train options, so runs with other method flags never share a directory. The options
are stored in ``SAVE_DIR/train_args.json``; resuming a directory trained with other options is refused before
training (``RESUME_ANYWAY=1`` overrides), see :mod:`diverse_fairseq.save_dir`. A finished run (``checkpoint_last.pt``
at ``--max-update``) is left alone: raise ``MAX_UPDATE`` to train further (docs/training.md, "Resuming, finished
runs and failures").

Environment: DATA_BIN (data-bin), CHECKPOINTS (checkpoints), SAVE_DIR, MAX_TOKENS,
UPDATE_FREQ, MAX_UPDATE, PRECISION (fp16 | bf16 | amp | memory-efficient-fp16 | fp32), AVERAGE (N, default 0 = off),
SEED, DRY_RUN=1 (print the command only), RESUME_ANYWAY=1, GPUS=N (train on the first N visible GPUs only: sets
``CUDA_VISIBLE_DEVICES`` of the training processes to the first N of the devices visible now, so fairseq's world
size, torchrun's processes per node and the ``--update-freq`` arithmetic all use N; GPUS=0 trains on the CPU;
more than are visible is an error); every value is checked before anything runs. Multi-node: NNODES, NODE_RANK,
MASTER_ADDR, MASTER_PORT (the command is then started through torchrun on each node), or run under SLURM
(``srun`` with one task per node; fairseq reads the SLURM variables, we add ``--distributed-port``).

SETTING may be left out: the dataset's default is used (:func:`default_setting`: the papers' for their datasets,
else one chosen by the number of training pairs, for your own corpus).
"""

import codecs
import json
import math
import os
import re
import selectors
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import env_checks
from . import save_dir as save_dirs
from .checkpoint_choice import check_metric, checkpoint_name
from .checkpoint_file import refuse_damaged_last
from .user_dir import USER_DIR  # the package directory, for --user-dir


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
    # embeddings: "shared" (fairseq's: --share-all-embeddings on a joined dictionary, else
    # --share-decoder-input-output-embed) or "untied" (source, target and output embeddings all separate, as
    # the THUMT Transformer of the EMNLP 2018 / NAACL 2019 / journal papers); EMBEDDINGS=shared|untied overrides
    embeddings: str = "shared"
    normalize_before: bool = False  # pre-norm (layer norm before each sub-layer) in encoder and decoder
    attention_dropout: Optional[float] = None  # None: the architecture's default (0 in fairseq)
    activation_dropout: Optional[float] = None  # ReLU dropout; None: the architecture's default (0)
    adam_eps: float = 1e-9
    # the checkpoint evaluated (diverse_fairseq.checkpoint_choice): None: checkpoint_last.pt; "bleu":
    # checkpoint_best.pt by validation BLEU (fairseq's --eval-bleu, the THUMT settings); "loss": checkpoint_best.pt
    # by validation loss (fairseq's default best metric, the EMNLP 2020 authors' fairseq settings)
    best_checkpoint_metric: Optional[str] = None
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


EMBEDDINGS = ("shared", "untied")
LENGTH_PENALTIES = ("fairseq", "gnmt")  # diverse_fairseq.methods.length_penalty.LENGTH_PENALTIES
# THUMT decodes at most |x| + decode_length tokens (Diversify-MHA bin/trainer.py and bin/translator.py:
# decode_length=50; utils/inference.py: max_length = source_length + decode_length, where source_length counts
# the source's EOS, and the loop runs while step < max_length, the batch's longest; a finished hypothesis then
# has at most |x| + 50 tokens before its EOS). fairseq's limit is max_len_a * src_len + max_len_b tokens before
# the EOS, with src_len the batch's longest source *including* its EOS (src_tokens.size(1)), so |x| + 50 is
# --max-len-a 1 --max-len-b 49.
THUMT_DECODE_LENGTH = 50
THUMT_MAX_LEN = dict(max_len_a=1.0, max_len_b=THUMT_DECODE_LENGTH - 1)


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
    "base": Setting("transformer_wmt_en_de", lr=7e-4, dropout=0.1, max_tokens=4096, batch_tokens=8 * 4096,
                    max_update=THUMT_TRAIN_STEPS, save_interval_updates=1000, keep_checkpoints=10, **THUMT),
    # big (16 heads, d = 1024): the same schedule peaks at 1024^-0.5 · 4000^-0.5 = 4.9e-4; "for both Base and
    # Big models ... all types of dropout rate is set to 0.1" (journal §4.1.1, not Vaswani et al.'s 0.3);
    # 100k updates, as the authors' trainer runs every model
    "big": Setting("transformer_vaswani_wmt_en_de_big", lr=5e-4, dropout=0.1, max_tokens=4096,
                   batch_tokens=8 * 4096, max_update=THUMT_TRAIN_STEPS, save_interval_updates=1000,
                   keep_checkpoints=10, **THUMT),
    # big trained for Vaswani et al.'s 300k updates (their Transformer-big) instead of the authors' 100k: an
    # option, not the papers' setting (SETTING=big_300k, or a table row's `setting: big_300k`)
    "big_300k": Setting("transformer_vaswani_wmt_en_de_big", lr=5e-4, dropout=0.1, max_tokens=4096,
                        batch_tokens=8 * 4096, max_update=300000, save_interval_updates=1000, keep_checkpoints=10,
                        **THUMT),
    # fairseq's Transformer-base as the EMNLP 2020 authors ran it (their WMT14 scripts): joined dictionary with
    # --share-all-embeddings, post-norm, lr 7e-4 warmed up over 8000 updates, Adam eps 1e-8, no weight decay;
    # their scripts batch 4 GPUs x 4096 tokens x update-freq 2 for MA but 4 for RMA, while the paper says
    # the configurations are the same: one batch (8 x 4096 tokens) for every row; checkpoint_best.pt by
    # validation loss, as their README tests (test-wmt14-base.sh $DATA_DIR/checkpoint_best.pt)
    "fairseq_base": Setting("transformer_wmt_en_de", lr=7e-4, dropout=0.1, max_tokens=4096, batch_tokens=8 * 4096,
                            max_update=100000, warmup=8000, save_interval_updates=1000, keep_checkpoints=10,
                            adam_eps=1e-8, best_checkpoint_metric="loss"),
    # fairseq's Transformer-big, EMNLP 2020's reference row ("big-MA"): the big architecture with fairseq's
    # WMT14 en-de big recipe (Ott et al. 2018: lr 5e-4, dropout 0.3), shared embeddings, Adam eps 1e-8
    "fairseq_big": Setting("transformer_vaswani_wmt_en_de_big", lr=5e-4, dropout=0.3, max_tokens=4096,
                           batch_tokens=8 * 4096, max_update=300000, save_interval_updates=1000,
                           keep_checkpoints=10, adam_eps=1e-8, best_checkpoint_metric="loss"),
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
DEFAULT_SETTING = {"demo": "tiny", "iwslt14_de_en": "small", "wmt14_en_de": "base",
                   "wmt14_en_de_joined": "fairseq_base", "wmt17_zh_en": "base"}
# Any other dataset (your own corpus, scripts/prepare_data.sh custom) by its number of training pairs: below 20k
# the demo's tiny model (about one epoch in its 800 updates), below 1M Transformer-small (IWSLT14: 160k), else base.
SIZE_SETTINGS = ((20_000, "tiny"), (1_000_000, "small"))
LARGE_SETTING = "base"


def default_setting(dataset: str, data_bin) -> str:
    """The setting a dataset trains with when none is given: the papers' for their datasets, else by the
    number of training pairs in ``DATA_BIN/dataset/prepare.json`` (:data:`SIZE_SETTINGS`)."""
    if dataset in DEFAULT_SETTING:
        return DEFAULT_SETTING[dataset]
    meta_file = Path(data_bin) / dataset / "prepare.json"
    if not meta_file.exists():
        raise SystemExit(f"error: {meta_file} not found; prepare the data first (scripts/prepare_data.sh), "
                         f"or name the setting: {', '.join(SETTINGS)}")
    pairs = json.loads(meta_file.read_text()).get("sentences", {}).get("train")
    if not isinstance(pairs, int):
        raise SystemExit(f"error: {meta_file} does not record the number of training pairs, so no setting can be "
                         f"chosen for {dataset}: name one ({', '.join(SETTINGS)})")
    return next((name for limit, name in SIZE_SETTINGS if pairs < limit), LARGE_SETTING)


def registered_architectures() -> Dict[str, type]:
    """fairseq's ``--arch`` names with their model classes, the plugin's included (importing this package
    registers them)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    return ARCH_MODEL_REGISTRY


def resolve_setting(name: str):
    """(setting name, Setting, architecture) for a setting name or a registered architecture name.

    Any other name is refused (SystemExit) with the nearest setting: ``tinny`` must not train ``--arch tinny``
    with the base setting's hyper-parameters."""
    if name in SETTINGS:
        return name, SETTINGS[name], SETTINGS[name].arch
    if name not in registered_architectures():
        from difflib import get_close_matches

        near = get_close_matches(name.lower(), list(SETTINGS), n=1, cutoff=0.0)  # always the nearest one
        archs = get_close_matches(name, [a for a in registered_architectures() if a.startswith("diverse_")], n=1)
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
    return name if name in registered_architectures() else "diverse_transformer"


def check_model_options(args: List[str]):
    """Refuse (SystemExit) model options that the chosen architecture does not accept, naming the architecture
    that does, before fairseq-train would stop with "unrecognized arguments": the routing-by-agreement options
    (``--routing-*``, NAACL 2019) exist on the plugin's ``diverse_transformer*`` models only."""
    import argparse

    arch = save_dirs.effective_options(args).get("--arch")
    model = registered_architectures().get(arch)
    routing = sorted({a.split("=", 1)[0] for a in args if a.startswith("--routing-")})
    if not routing or model is None:
        return
    parser = argparse.ArgumentParser(add_help=False)
    model.add_args(parser)
    unknown = [flag for flag in routing if flag not in parser._option_string_actions]
    if unknown:
        raise SystemExit(f"error: {', '.join(unknown)}: routing-by-agreement options, which --arch {arch} does not "
                         f"accept: add --arch {diverse_equivalent(arch)} (the same sizes, with the routing options)")


def visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:  # pragma: no cover
        return 0


def parse_gpus(text) -> Optional[int]:
    """``GPUS``: None when unset (every visible GPU), else a non-negative integer; SystemExit otherwise."""
    if text in (None, ""):
        return None
    try:
        return env_checks.parse_int("GPUS", text)
    except SystemExit:
        raise env_checks.bad("GPUS", text, "use a non-negative integer (0 = the CPU, N = the first N visible GPUs), "
                             "or leave GPUS unset to use every visible GPU") from None


def select_gpus(requested: Optional[int], env, visible: int):
    """(GPUs to train on, environment for the training processes) for ``requested`` GPUs (None: all visible).

    ``CUDA_VISIBLE_DEVICES`` becomes the first ``requested`` entries of the current one (0..N-1 when unset), so
    that fairseq (whose default world size is the number of visible devices), torchrun and SLURM's fairseq
    launch all see exactly those devices. More than ``visible`` is an error."""
    if requested is None:
        return visible, {}
    current = env.get("CUDA_VISIBLE_DEVICES")
    if requested > visible:
        shown = f"CUDA_VISIBLE_DEVICES={current}" if current is not None else "CUDA_VISIBLE_DEVICES unset"
        raise SystemExit(f"error: GPUS={requested} but only {visible} GPU(s) are visible ({shown}): use GPUS={visible} "
                         f"or fewer (GPUS=0 trains on the CPU), or leave GPUS unset to use every visible GPU")
    if requested == 0:
        return 0, {"CUDA_VISIBLE_DEVICES": ""}
    ids = [d.strip() for d in current.split(",") if d.strip()] if current else [str(i) for i in range(visible)]
    return requested, {"CUDA_VISIBLE_DEVICES": ",".join(ids[:requested])}


def update_freq(batch_tokens: int, world: int, max_tokens: int) -> int:
    """Micro-batches per update so that ``world`` workers of ``max_tokens`` reach ``batch_tokens``."""
    return max(1, math.ceil(batch_tokens / (max(1, world) * max_tokens)))


PRECISIONS = ("fp16", "bf16", "amp", "memory-efficient-fp16", "fp32")


def _env(env, name, default=None):
    value = env_checks.get(env, name)
    return value if value is not None else default


def _int(env, name, default, minimum, maximum=None):
    """The integer environment variable ``name`` (``default`` when unset), validated."""
    value = env_checks.get(env, name)
    return default if value is None else env_checks.parse_int(name, value, minimum, maximum)


@dataclass(frozen=True)
class TrainOptions:
    """The launch options of one training besides its dataset, setting, seed and directories: what
    ``scripts/train.sh`` reads from ``MAX_TOKENS``, ``UPDATE_FREQ``, ... (:func:`options_from_env`); None: the
    setting's value (or, for ``precision``, fp16 on GPUs and fp32 on the CPU)."""

    max_tokens: Optional[int] = None
    update_freq: Optional[int] = None
    max_update: Optional[int] = None
    average: Optional[int] = None  # average the last N checkpoints (None: the setting's, 0: off)
    precision: Optional[str] = None  # one of PRECISIONS
    embeddings: Optional[str] = None  # one of EMBEDDINGS
    nnodes: Optional[int] = None  # set: launch through torchrun on NNODES nodes
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: Optional[int] = None
    slurm_nnodes: int = 1  # > 1: a SLURM job over several nodes (fairseq reads the SLURM variables itself)
    slurm_job_id: int = 0
    slurm_node_id: int = 0
    checkpoints: str = "checkpoints"  # parent of the default save directory (when no save_dir is given)
    resume_anyway: bool = False  # resume a directory trained with other options (RESUME_ANYWAY=1)
    dry_run: bool = False  # print the command, train and write nothing (DRY_RUN=1)


@dataclass(frozen=True)
class TrainRequest:
    """One training: what :func:`build_command` makes a command of and :func:`run` trains. The table runner
    builds it directly; ``scripts/train.sh`` from the environment (:func:`request_from_env`)."""

    dataset: str
    setting: str  # a setting name or a registered architecture (:func:`resolve_setting`)
    extra: Tuple[str, ...] = ()  # fairseq-train options after ours (they override them)
    seed: int = 1
    save_dir: Optional[Path] = None  # None: a --save-dir among ``extra``, else CHECKPOINTS/<name>-<hash>
    data_bin: Path = Path("data-bin")
    gpus: Optional[int] = None  # GPUs per node: None every visible one, 0 the CPU, N the first N visible
    options: TrainOptions = TrainOptions()
    # a Python script started in place of ``-m fairseq_cli.train`` with the same arguments: a per-run hook that
    # watches training (e.g. scripts/experiments/kernel_probe.py); it is not part of the command's identity
    entry: Optional[str] = None


def options_from_env(env) -> TrainOptions:
    """The validated launch options of the environment (SystemExit naming a bad variable)."""
    nnodes = _int(env, "NNODES", None, 1)
    return TrainOptions(
        nnodes=nnodes, slurm_nnodes=_int(env, "SLURM_NNODES", 1, 1),
        max_tokens=_int(env, "MAX_TOKENS", None, 1), update_freq=_int(env, "UPDATE_FREQ", None, 1),
        max_update=_int(env, "MAX_UPDATE", None, 1), average=_int(env, "AVERAGE", None, 0),
        node_rank=_int(env, "NODE_RANK", 0, 0, (nnodes or 1) - 1),
        master_addr=_env(env, "MASTER_ADDR", "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT", None, 1, 65535), slurm_job_id=_int(env, "SLURM_JOB_ID", 0, 0),
        slurm_node_id=_int(env, "SLURM_NODEID", 0, 0),
        precision=None if env_checks.get(env, "PRECISION") is None
        else env_checks.parse_choice("PRECISION", env["PRECISION"], PRECISIONS),
        dry_run=env_checks.parse_flag("DRY_RUN", env.get("DRY_RUN")),
        resume_anyway=env_checks.parse_flag(save_dirs.RESUME_ENV, env.get(save_dirs.RESUME_ENV)),
        embeddings=None if env_checks.get(env, "EMBEDDINGS") is None
        else env_checks.parse_choice("EMBEDDINGS", env["EMBEDDINGS"], EMBEDDINGS),
        checkpoints=_env(env, "CHECKPOINTS", "checkpoints"),
    )


def request_from_env(dataset: str, setting_or_arch: str, extra: List[str], env=None,
                     gpus: Optional[int] = None) -> TrainRequest:
    """The request of ``scripts/train.sh DATASET SETTING EXTRA...``: every variable of ``env`` (default: this
    process's environment) checked before anything runs. ``gpus`` overrides ``GPUS``; a ``GPUS`` above the
    visible devices is an error here."""
    env = dict(os.environ if env is None else env)
    options = options_from_env(env)  # every variable, before anything else
    seed = _int(env, "SEED", 1, 0)
    if gpus is None:
        gpus = parse_gpus(env.get("GPUS"))
        select_gpus(gpus, env, visible_gpus())  # more than are visible: stop now
    save_dir = _env(env, "SAVE_DIR")
    return TrainRequest(dataset=dataset, setting=setting_or_arch, extra=tuple(extra), seed=seed,
                        save_dir=Path(save_dir) if save_dir else None,
                        data_bin=Path(_env(env, "DATA_BIN", "data-bin")), gpus=gpus, options=options)


def command_from_env(dataset: str, setting_or_arch: str, extra: List[str], env=None, gpus: Optional[int] = None):
    """:func:`build_command` of :func:`request_from_env`'s request."""
    return build_command(request_from_env(dataset, setting_or_arch, extra, env=env, gpus=gpus))


def run_from_env(dataset: str, setting_or_arch: str, extra: List[str], env=None, gpus: Optional[int] = None) -> Dict:
    """:func:`run` of :func:`request_from_env`'s request, ``env`` also being the training processes' environment."""
    return run(request_from_env(dataset, setting_or_arch, extra, env=env, gpus=gpus), env=env)


def tensorboard_available() -> bool:
    """Whether fairseq's ``--tensorboard-logdir`` can write: it uses ``torch.utils.tensorboard`` (needs the
    ``tensorboard`` package) or else ``tensorboardX``; with neither it only warns and writes nothing."""
    import importlib.util

    return any(importlib.util.find_spec(name) is not None for name in ("tensorboardX", "tensorboard"))


def embedding_args(embeddings: str, joined_dictionary: bool) -> List[str]:
    """fairseq-train's embedding-sharing flags: ``untied`` none; ``shared`` fairseq's standard model (one matrix
    for source, target and output on a joined dictionary, else the target's shared with the output)."""
    if embeddings == "untied":
        return []
    return ["--share-all-embeddings" if joined_dictionary else "--share-decoder-input-output-embed"]


def model_args(s: Setting) -> List[str]:
    """The setting's layer-norm placement and dropout types beyond ``--dropout`` (nothing for fairseq's defaults)."""
    args = ["--encoder-normalize-before", "--decoder-normalize-before"] if s.normalize_before else []
    if s.attention_dropout is not None:
        args += ["--attention-dropout", str(s.attention_dropout)]
    if s.activation_dropout is not None:
        args += ["--activation-dropout", str(s.activation_dropout)]
    return args


def decoding(meta: Dict, s: Optional[Setting] = None) -> Dict[str, object]:
    """How setting ``s`` decodes the prepared data (``prepare.json``): the recipe's beam and length penalty
    value, the setting's penalty form (``length_penalty``: fairseq's or GNMT's) and its length limit where it has
    one (``max_len_a``/``max_len_b``), else the recipe's (without ``s``: fairseq's penalty, the recipe's limit).
    The validation BLEU and the test evaluation both use it."""
    a = s.max_len_a if s is not None and s.max_len_a is not None else meta.get("max_len_a", 0.0)
    b = s.max_len_b if s is not None and s.max_len_b is not None else meta.get("max_len_b", 200)
    return {"beam": meta.get("beam", 5), "lenpen": meta.get("lenpen", 1.0),
            "length_penalty": s.length_penalty if s is not None else "fairseq", "max_len_a": a, "max_len_b": b}


def decoding_args(meta: Dict, s: Optional[Setting] = None) -> List[str]:
    """The options of :mod:`diverse_fairseq.evaluate` that decode as :func:`decoding` says (the table runner
    passes them; the beam and the length penalty value stay the recipe's, which evaluate reads itself)."""
    d = decoding(meta, s)
    return ["--length-penalty", str(d["length_penalty"]), "--max-len-a", f"{d['max_len_a']:g}",
            "--max-len-b", str(d["max_len_b"])]


def task_args(length_penalty: str) -> List[str]:
    """fairseq's ``--task`` for decoding with ``length_penalty``: ``translation`` for fairseq's penalty, the
    plugin's ``translation_length_penalty --length-penalty gnmt`` for GNMT's
    (:mod:`diverse_fairseq.methods.length_penalty`)."""
    if length_penalty not in LENGTH_PENALTIES:
        raise ValueError(f"length penalty {length_penalty!r}: use one of {', '.join(LENGTH_PENALTIES)}")
    if length_penalty == "fairseq":
        return ["--task", "translation"]
    return ["--task", "translation_length_penalty", "--length-penalty", length_penalty]


def eval_bleu_args(meta: Dict, s: Optional[Setting] = None) -> List[str]:
    """fairseq's validation BLEU (``--eval-bleu``) for choosing the best checkpoint, fitted to the prepared data
    (``prepare.json``) and the setting ``s`` (:func:`decoding`: beam, length penalty value and form, length
    limit; without ``s``, fairseq's penalty and the recipe's limit); BPE removed as the data was
    segmented (subword-nmt ``@@ `` or sentencepiece); Moses detokenization of the target language where the
    text was Moses-tokenized (sacrebleu then scores detokenized text, as the test evaluation does). The penalty
    form is a task option (:func:`task_args`), not part of ``--eval-bleu-args``."""
    generation = decoding(meta, s)
    generation.pop("length_penalty")
    post = meta.get("post_process", "subword_nmt")
    args = ["--eval-bleu", "--eval-bleu-args", json.dumps(generation),
            "--eval-bleu-remove-bpe", "@@ " if post == "subword_nmt" else post]
    if meta.get("moses_tokenized", post == "subword_nmt"):
        args += ["--eval-bleu-detok", "moses", "--eval-bleu-detok-args",
                 json.dumps({"target_lang": meta["target_lang"]})]
    else:
        args += ["--eval-bleu-detok", "space"]
    return args + ["--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]


def build_command(request: TrainRequest):
    """Return (fairseq-train arguments, launcher prefix, info dict) for ``request``.

    The save directory is ``request.save_dir`` when given (or a ``--save-dir`` among the extra options), else
    ``CHECKPOINTS/<DATASET>_<SETTING_OR_ARCH>-<hash of the effective options>`` (:mod:`diverse_fairseq.save_dir`).
    The launcher runs ``-m fairseq_cli.train`` (or ``request.entry``) with the arguments: torchrun when
    ``options.nnodes`` is set, else this Python; ``info["args"]`` are the arguments, ``info["launcher"]`` the prefix."""
    o, dataset, setting_or_arch, extra = request.options, request.dataset, request.setting, list(request.extra)
    gpus = visible_gpus() if request.gpus is None else request.gpus
    key, s, arch = resolve_setting(setting_or_arch)
    data = Path(request.data_bin) / dataset
    meta_file = data / "prepare.json"
    if not meta_file.exists():
        raise SystemExit(f"error: {meta_file} not found; prepare the data first: scripts/prepare_data.sh {dataset}")
    meta = json.loads(meta_file.read_text())
    nnodes = o.nnodes or o.slurm_nnodes
    world = max(1, gpus) * nnodes
    max_tokens = o.max_tokens or s.max_tokens
    freq = o.update_freq or update_freq(s.batch_tokens, world, max_tokens)
    name = f"{dataset}_{setting_or_arch}"
    placeholder = "\0SAVE_DIR\0"  # replaced below: the default save directory depends on the other options
    args = [
        str(data), "--user-dir", USER_DIR, *task_args(s.length_penalty),
        "--source-lang", meta["source_lang"], "--target-lang", meta["target_lang"],
        "--arch", arch, *s.extra,
        *embedding_args(o.embeddings or s.embeddings, bool(meta.get("joined_dictionary"))),
        *model_args(s),
        "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--adam-eps", f"{s.adam_eps:g}", "--clip-norm", "0.0",
        "--lr", str(s.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(s.warmup),
        "--warmup-init-lr", "1e-07", "--dropout", str(s.dropout), "--weight-decay", str(s.weight_decay),
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", str(max_tokens), "--update-freq", str(freq),
        "--max-update", str(o.max_update or s.max_update),
        "--save-dir", placeholder,
        *(["--tensorboard-logdir", placeholder + "/tensorboard"] if tensorboard_available() else []),
        "--log-format", "simple", "--log-interval", str(s.log_interval), "--seed", str(request.seed),
    ]
    average = s.average if o.average is None else o.average
    keep = max(s.keep_checkpoints, average)  # AVERAGE=N needs the last N checkpoints
    if s.save_interval_updates:
        args += ["--save-interval-updates", str(s.save_interval_updates),
                 "--keep-interval-updates", str(keep), "--no-epoch-checkpoints"]
    else:
        args += ["--keep-last-epochs", str(keep)]
    if s.best_checkpoint_metric == "bleu":  # "loss" is fairseq's default best metric: nothing to add
        args += eval_bleu_args(meta, s) + (["--keep-best-checkpoints", str(s.keep_best)] if s.keep_best else [])
    precision = o.precision or ("fp16" if gpus else "fp32")
    if gpus == 0:
        args.append("--cpu")
        if precision != "fp32":
            raise SystemExit(f"error: PRECISION={precision!r} is not possible: no GPU is visible, so only "
                             "PRECISION=fp32 is (unset PRECISION or set it to fp32)")
    elif precision != "fp32":
        args.append(f"--{precision}")
        if precision == "fp16" and "repulsive_adam" in extra:
            # the repulsive optimizer needs per-parameter gradients: keep fp16 master params unflattened
            args.append("--fp16-no-flatten-grads")
    if world > 1:
        args.append("--load-checkpoint-on-all-dp-ranks")  # resuming under torch >= 2.6 (docs/fairseq-notes.md)
    entry = [request.entry] if request.entry else ["-m", "fairseq_cli.train"]
    launcher = [sys.executable, *entry]
    if o.nnodes:
        args += ["--distributed-world-size", str(world)]
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
                    "--node-rank", str(o.node_rank), "--nproc-per-node", str(max(1, gpus)),
                    "--master-addr", o.master_addr, "--master-port", str(o.master_port or 29500), *entry]
    elif nnodes > 1:  # SLURM: fairseq derives ranks and the master from the SLURM variables
        args += ["--distributed-world-size", str(world),
                 "--distributed-port", str(o.master_port or 12000 + o.slurm_job_id % 20000)]
    explicit = request.save_dir or save_dirs.effective_options(extra).get("--save-dir")
    if explicit:
        save_dir = Path(explicit)
    else:
        save_dir = save_dirs.default_save_dir(Path(o.checkpoints), name, args + extra, meta)
    args = [a.replace(placeholder, str(save_dir)) for a in args]
    info = {"setting": key, "arch": arch, "gpus": gpus, "nodes": nnodes, "world": world, "max_tokens": max_tokens,
            "update_freq": freq, "tokens_per_update": world * max_tokens * freq,
            "paper_tokens_per_update": s.batch_tokens,
            "save_dir": str(save_dir), "average": average, "update_based": bool(s.save_interval_updates),
            "rank0": o.node_rank == 0 and o.slurm_node_id == 0, "data_meta": meta,
            "best_checkpoint_metric": s.best_checkpoint_metric}
    args = args + extra
    info["args"], info["launcher"] = args, launcher
    return args, launcher, info


def run(request: TrainRequest, env=None) -> Dict:
    """Train (resuming from SAVE_DIR/checkpoint_last.pt if present), then average; return the run's info.

    A finished run, whose ``checkpoint_last.pt`` has reached ``--max-update`` (``MAX_UPDATE``), is left alone
    (``info["finished_earlier"]``): fairseq would resume it and train one more update before its stop check,
    overwriting the finished model. Model options the architecture lacks (``--routing-*`` without a routing
    architecture) stop the run before it starts. A failed fairseq-train raises SystemExit that offers to resume
    only where a checkpoint exists (a save directory left with nothing but ``train_args.json`` is removed) and
    ends with fairseq's own error line (:func:`failure_message`). A ``checkpoint_last.pt`` that cannot be read is
    refused before training, naming the intact checkpoint to resume from (:func:`refuse_damaged_last`). Ctrl-C
    raises :class:`Interrupted` whose ``message`` gives the update reached, the last checkpoint's update and the
    command that resumes (:func:`interrupt_message`).

    ``info["checkpoint"]`` is the checkpoint to evaluate (:mod:`diverse_fairseq.checkpoint_choice`): the average of
    the last N checkpoints when ``AVERAGE=N`` asks for one and enough checkpoints exist, else the setting's single
    checkpoint (``checkpoint_best.pt`` where the setting names a ``best_checkpoint_metric``, else
    ``checkpoint_last.pt``);
    ``info["averaged"]`` is the number of checkpoints averaged into it (0: a single model, as the journal
    version reports). ``request.gpus`` (None: every visible GPU) restricts training to the first ``gpus``
    visible devices (:func:`select_gpus`). ``env`` is the training processes' environment (default: this
    process's), their ``CUDA_VISIBLE_DEVICES`` set to the chosen devices; no training option is read from it.
    """
    env = dict(os.environ if env is None else env)
    gpus, device_env = select_gpus(request.gpus, env, visible_gpus())
    env.update(device_env)
    asked, request = request, replace(request, gpus=gpus)
    dataset, setting_or_arch = request.dataset, request.setting
    args, launcher, info = build_command(request)
    cmd = launcher + args
    device = f"{info['world']} GPU(s)" if info["gpus"] else "the CPU"
    arch = save_dirs.effective_options(args).get("--arch") or info["arch"]  # an --arch among the extra options
    print(f"[train] {dataset} {setting_or_arch}: {arch} on {device}, "
          f"{info['max_tokens']} tokens x {info['world']} x update-freq {info['update_freq']} = "
          f"{info['tokens_per_update']} tokens per update (papers: {info['paper_tokens_per_update']})", flush=True)
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in device_env.items())
    print("[train] " + prefix + shlex.join(cmd), flush=True)
    if "--tensorboard-logdir" not in cmd:
        print("[train] no tensorboard logs: neither tensorboardX nor tensorboard is installed "
              "(pip install -e '.[tensorboard]')", flush=True)
    info["command"] = cmd
    info["device_env"] = device_env
    save_dir = Path(info["save_dir"])
    info["checkpoint"] = str(save_dir / checkpoint_name(info["best_checkpoint_metric"]))  # the setting's single model
    info["averaged"] = 0
    info["finished_earlier"] = False
    check_model_options(args)  # e.g. --routing-* without a routing architecture: before anything runs
    warning = save_dirs.check_resume(save_dir, args, info["data_meta"],
                                     resume_anyway=request.options.resume_anyway)  # refuses a different run
    if warning:
        print(f"[train] warning: {warning}", flush=True)
    max_update = int(save_dirs.effective_options(args).get("--max-update") or 0)
    done = save_dirs.finished(save_dir, max_update)
    if done is not None:  # resuming would train update max_update + 1 and overwrite the finished model
        info["finished_earlier"] = True
        print(f"[train] already trained to {done} updates (--max-update {max_update}): {save_dir}; left as it is. "
              f"To train further, raise MAX_UPDATE (e.g. MAX_UPDATE={2 * max_update}: the run resumes in the same "
              f"directory); to train afresh, delete it or give another SAVE_DIR. Evaluate with: "
              f"scripts/evaluate.sh {info['checkpoint']} {dataset}", flush=True)
        if not request.options.dry_run:
            _average(info, save_dir, reuse=True)
        return info
    # fairseq would crash reading it, on every rerun; "the same command": train.sh's or the table runner's
    refuse_damaged_last(save_dir)
    rerun = resume_command(asked, save_dir)  # GPUS as the user gave it (unset: every visible GPU)
    resume = "resuming from" if (save_dir / "checkpoint_last.pt").exists() else "new run in"
    print(f"[train] {resume} {save_dir}; evaluate with: scripts/evaluate.sh {info['checkpoint']} {dataset}",
          flush=True)
    if request.options.dry_run:
        return info
    save_dir.mkdir(parents=True, exist_ok=True)
    save_dirs.write_args(save_dir, args, info["data_meta"], cmd)
    try:
        rc, last_error = call_keeping_error(cmd, env)
    except Interrupted as e:  # Ctrl-C: one line, what was saved and how to resume
        raise Interrupted(e.update, interrupt_message(e.update, save_dir, rerun)) from None
    if rc != 0:
        raise SystemExit(failure_message(rc, last_error, save_dir))
    _average(info, save_dir)
    return info


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during fairseq-train: ``update`` is the last update fairseq's progress reported (None: none yet);
    ``message`` (set by :func:`run`) the one line that says what was saved and how to resume."""

    def __init__(self, update: Optional[int] = None, message: str = ""):
        super().__init__(update, message)
        self.update, self.message = update, message


#: the update number in fairseq's progress lines: ``num_updates=50`` (simple, tqdm), ``"num_updates": "50"``
#: (json), ``num_updates 200`` (end-of-epoch summaries), ``"train_num_updates": "200"``
_NUM_UPDATES = re.compile(r"num_updates\W{1,4}(\d+)")
INTERRUPT_EXIT = 130  # the shell's status for a command ended by SIGINT (128 + 2)


def last_update(text: str) -> Optional[int]:
    """The last update number that fairseq's progress output ``text`` reports, or None."""
    found = _NUM_UPDATES.findall(text)
    return int(found[-1]) if found else None


def call_keeping_error(cmd: List[str], env) -> tuple:
    """Run ``cmd`` with its output shown as it comes; return (exit status, the last line it wrote to stderr).

    stdout (fairseq's log) and stderr are passed on chunk by chunk (progress bars with carriage returns
    included); the last 64 KiB of stderr are kept, so that fairseq's own error line (argparse's ``error: ...``, a
    traceback's exception) can be repeated as the last line the user sees, and the update number of fairseq's
    last progress line is followed. Ctrl-C reaches fairseq-train too (one process group): this waits for it to
    stop, without passing on its KeyboardInterrupt traceback, and raises :class:`Interrupted` with that update
    (an ``Interrupted`` also when fairseq-train alone was stopped by SIGINT)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    streams = {proc.stdout.fileno(): sys.stdout, proc.stderr.fileno(): sys.stderr}
    decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in streams}
    selector = selectors.DefaultSelector()
    for fd in streams:
        selector.register(fd, selectors.EVENT_READ)
    tail, update, interrupted_at, carry = "", None, None, {fd: "" for fd in streams}
    try:
        while selector.get_map():
            try:
                ready = selector.select(timeout=1.0)
                for key, _ in ready:
                    chunk = os.read(key.fd, 65536)
                    text = decoders[key.fd].decode(chunk, final=not chunk)
                    if not chunk:
                        selector.unregister(key.fd)
                    seen = last_update(carry[key.fd] + text)  # tqdm's progress bar writes to stderr
                    update = update if seen is None else seen
                    carry[key.fd] = (carry[key.fd] + text)[-64:]  # a number split between two chunks
                    if key.fd == proc.stderr.fileno():
                        tail = (tail + text)[-65536:]
                    if interrupted_at is None or key.fd == proc.stdout.fileno():  # not its traceback
                        streams[key.fd].write(text)
                        streams[key.fd].flush()
                if interrupted_at is not None and proc.poll() is None and time.time() - interrupted_at > 10:
                    proc.send_signal(signal.SIGINT)  # the signal reached only this process: pass it on, once
                    interrupted_at = float("inf")
            except KeyboardInterrupt:
                interrupted_at = interrupted_at or time.time()
    finally:
        selector.close()
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # a second Ctrl-C: fairseq is stopping already
                interrupted_at = interrupted_at or time.time()
        proc.stdout.close()
        proc.stderr.close()
    if interrupted_at is not None or rc in (-signal.SIGINT, INTERRUPT_EXIT):
        raise Interrupted(update)
    lines = [line.strip() for line in tail.replace("\r", "\n").split("\n")]
    return rc, next((line for line in reversed(lines) if line), "")


def resume_command(request: TrainRequest, save_dir: Path) -> str:
    """The ``scripts/train.sh`` command that continues ``request``'s training in ``save_dir``: its dataset,
    setting and extra options, with the variables that set its options (``SAVE_DIR`` pins the directory)."""
    o = request.options
    variables = {"SAVE_DIR": str(save_dir), "DATA_BIN": str(request.data_bin),
                 "SEED": str(request.seed) if request.seed != 1 else None,
                 "GPUS": None if request.gpus is None else str(request.gpus),
                 "MAX_TOKENS": o.max_tokens, "UPDATE_FREQ": o.update_freq, "MAX_UPDATE": o.max_update,
                 "AVERAGE": o.average, "PRECISION": o.precision, "EMBEDDINGS": o.embeddings,
                 "RESUME_ANYWAY": "1" if o.resume_anyway else None}
    prefix = "".join(f"{k}={shlex.quote(str(v))} " for k, v in variables.items() if v is not None)
    return prefix + shlex.join(["scripts/train.sh", request.dataset, request.setting, *request.extra])


def interrupt_message(update: Optional[int], save_dir: Path, resume: str) -> str:
    """The one line after Ctrl-C: the update fairseq reached, the update its last checkpoint holds (read from
    ``save_dir/checkpoint_last.pt``, where fairseq resumes from) and the command that resumes."""
    at = f"interrupted at update {update}" if update is not None else "interrupted before fairseq reported an update"
    last = Path(save_dir) / "checkpoint_last.pt"
    saved = save_dirs.trained_updates(last) if last.exists() else None
    if saved is not None:
        return f"{at}; the last checkpoint is at update {saved} ({last}); resume with: {resume}"
    if last.exists():
        return (f"{at}; {last} cannot be read (Ctrl-C during its save?): the next run refuses it and names the "
                f"fix; then resume with: {resume}")
    return f"{at}; no checkpoint was saved yet, so a new run starts from update 0 with: {resume}"


def failure_message(rc: int, last_error: str, save_dir: Path) -> str:
    """The error for a failed fairseq-train: "resume" only where a checkpoint exists (a save directory holding
    nothing but ours is removed), fairseq's own error line last."""
    how = f"killed by signal {-rc}" if rc < 0 else f"exit {rc}"
    if (save_dir / "checkpoint_last.pt").exists():
        what = f"run the same command again to resume from {save_dir}/checkpoint_last.pt"
    elif save_dirs.remove_unused(save_dir):
        what = f"it wrote no checkpoint, so there is nothing to resume; removed the unused {save_dir}"
    else:
        what = f"it wrote no checkpoint, so there is nothing to resume ({save_dir} kept: it holds other files)"
    said = f"\nfairseq-train said: {last_error}" if last_error else ""
    return f"error: fairseq-train failed ({how}): {what}{said}"


def _average(info: Dict, save_dir: Path, reuse: bool = False):
    """``AVERAGE=N``: average the last N checkpoints into ``SAVE_DIR/checkpoint_avg_lastN.pt`` (rank 0 only) and
    make it ``info["checkpoint"]``; ``reuse``: keep an average written before (a finished run's)."""
    if not (info["average"] and info["rank0"]):
        return
    from .average_checkpoints import main as average

    out = save_dir / checkpoint_name(info["best_checkpoint_metric"], info["average"])
    if reuse and out.exists():
        info["checkpoint"], info["averaged"] = str(out), info["average"]
        return
    kind = "--num-update-checkpoints" if info["update_based"] else "--num-epoch-checkpoints"
    print(f"[train] averaging the last {info['average']} checkpoints into {out}", flush=True)
    try:
        average(["--inputs", str(save_dir), kind, str(info["average"]), "--output", str(out)])
        info["checkpoint"] = str(out)
        info["averaged"] = info["average"]
    except SystemExit as e:  # too few checkpoints (a short run): training itself succeeded
        print(f"[train] warning: no average written: {e}", flush=True)


#: variables of other commands that this one does not read: {name: what to use here instead}
FOREIGN_VARIABLES = {
    "SEEDS": "SEED (one seed per training; SEEDS is the table runner's: make table-<id>, python -m "
             "diverse_fairseq.tables)",
    "TRAIN_ARGS": "extra fairseq-train options after the setting on the command line (TRAIN_ARGS is the table "
                  "runner's)",
}


def foreign_variable_warnings(env) -> List[str]:
    """Warnings for variables set in ``env`` that belong to another command (``SEEDS=3 scripts/train.sh``
    would otherwise silently train, or resume, seed 1), each naming the variable to use."""
    return [f"{name}={env[name]} is not read by scripts/train.sh: use {instead}; now training with SEED="
            f"{env.get('SEED') or 1}" if name == "SEEDS" else
            f"{name}={env[name]} is not read by scripts/train.sh: use {instead}"
            for name, instead in FOREIGN_VARIABLES.items() if env_checks.get(env, name) is not None]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    for warning in foreign_variable_warnings(os.environ):
        print(f"[train] warning: {warning}", flush=True)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print("settings: " + ", ".join(f"{k} ({v.arch})" for k, v in SETTINGS.items()))
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    dataset, rest = argv[0], argv[1:]
    if rest and not rest[0].startswith("-"):
        setting, extra = rest[0], rest[1:]
    else:  # no setting named: the dataset's default
        setting, extra = default_setting(dataset, os.environ.get("DATA_BIN") or "data-bin"), rest
        print(f"[train] no setting given: {dataset} trains with {setting!r} (name one to choose: "
              f"{', '.join(SETTINGS)})", flush=True)
    try:
        run_from_env(dataset, setting, extra)
    except KeyboardInterrupt as e:  # Interrupted: during fairseq-train, with its line; else before or after it
        print(f"[train] {getattr(e, 'message', '') or 'interrupted (outside fairseq-train)'}", file=sys.stderr,
              flush=True)
        return INTERRUPT_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
