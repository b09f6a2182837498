"""A training run planned once: :func:`plan` turns a :class:`TrainRequest` into a frozen :class:`Plan`, which
training, the resume check, the table runner, check-tables and the report all read (docs/architecture.md, "What a
run is, planned once"). The papers' tokens per update (base/big: 8 GPUs × 4096 tokens) are kept on any number of
GPUs (:func:`update_freq`); tensorboard logs go to ``SAVE_DIR/tensorboard`` where a writer is installed.
"""

import importlib.util
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..methods.length_penalty import BEAM_SEARCHES, LENGTH_PENALTIES
from ..user_dir import USER_DIR  # the package directory, for --user-dir
from .dataset_meta import DatasetMeta, load_dataset_meta
from .identity import RESUME_ENV, identity_hash, parse_train_args, run_identity
from .naming import default_save_dir, method_label, parse_name
from .options import choice, gpus_option, integer, option, switch
from .options import path as a_path
from .paths import checkpoints_option, data_bin_option
from .settings import EMBEDDINGS, Setting, checkpoint_name, resolve_setting

PRECISIONS = ("fp16", "bf16", "amp", "memory-efficient-fp16", "fp32")


@dataclass(frozen=True)
class TrainOptions:
    """The launch options of one training: ``scripts/train.sh``'s variables (:mod:`.options` fields, read by
    ``training.options_from_env``; the table runner reads them too, for every row); None: the setting's value
    (``precision``: fp16 on GPUs, fp32 on the CPU)."""

    max_tokens: Optional[int] = option("MAX_TOKENS", "tokens per GPU batch (default: the setting's)", None, integer(1))
    update_freq: Optional[int] = option("UPDATE_FREQ", "batches per update (default: what keeps the papers' tokens "
                                                       "per update on the GPUs used)", None, integer(1))
    max_update: Optional[int] = option("MAX_UPDATE", "updates to train (default: the setting's)", None, integer(1))
    average: Optional[int] = option("AVERAGE", "average the last N checkpoints, 0: off (default: the setting's)",
                                    None, integer(0))
    precision: Optional[str] = option("PRECISION", f"{', '.join(PRECISIONS)} (default: fp16 on GPUs, fp32 on the "
                                                   f"CPU)", None, choice(PRECISIONS))
    embeddings: Optional[str] = option("EMBEDDINGS", "shared or untied (default: the setting's)", None,
                                       choice(EMBEDDINGS))
    nnodes: Optional[int] = option("NNODES", "set: launch through torchrun on NNODES nodes", None, integer(1))
    node_rank: int = option("NODE_RANK", "this node's rank under torchrun, 0 to NNODES-1", 0, integer(0))
    master_addr: str = option("MASTER_ADDR", "torchrun's rendezvous host (default 127.0.0.1)", "127.0.0.1")
    master_port: Optional[int] = option("MASTER_PORT", "torchrun's rendezvous port, or fairseq's --distributed-port "
                                                       "under SLURM", None, integer(1, 65535))
    # > 1: a SLURM job over several nodes (fairseq reads the SLURM variables itself)
    slurm_nnodes: int = option("SLURM_NNODES", "set by SLURM: the job's nodes", 1, integer(1))
    slurm_job_id: int = option("SLURM_JOB_ID", "set by SLURM: the job's id", 0, integer(0))
    slurm_node_id: int = option("SLURM_NODEID", "set by SLURM: this node's index in the job", 0, integer(0))
    checkpoints: Path = checkpoints_option()  # parent of the default save directory (when no save_dir is given)
    resume_anyway: bool = option(RESUME_ENV, "1: resume a directory trained with other options", False,
                                 switch)
    dry_run: bool = option("DRY_RUN", "1: print the command, train and write nothing", False, switch)


@dataclass(frozen=True)
class TrainRequest:
    """One training: what :func:`plan` plans and :func:`diverse_fairseq.training.run` trains (``scripts/train.sh``
    builds it from the environment, the table runner directly)."""

    dataset: str
    setting: str  # a setting name or a registered architecture (:func:`resolve_setting`)
    extra: Tuple[str, ...] = ()  # fairseq-train options that replace ours (:func:`last_wins`)
    seed: int = option("SEED", "the training's seed", 1, integer(0))
    # None: a --save-dir among ``extra``, else CHECKPOINTS/<name>-<methods>-<hash> (runs/naming.py)
    save_dir: Optional[Path] = option("SAVE_DIR", "the save directory (default: CHECKPOINTS/<dataset>_<setting>-"
                                                  "<methods>-<hash of the run's identity>)", None, a_path)
    data_bin: Path = data_bin_option()
    gpus: Optional[int] = gpus_option()  # GPUs per node: None every visible one, 0 the CPU, N the first N visible
    options: TrainOptions = TrainOptions()
    # a script started in place of ``-m fairseq_cli.train`` with the same arguments, a hook that watches training
    # (e.g. scripts/experiments/kernel_probe.py); not part of the run's identity
    entry: Optional[str] = None
    name: Optional[str] = option("NAME", "a word for the default save directory in place of the run's methods: "
                                         "CHECKPOINTS/<dataset>_<setting>-<NAME>-<hash>", None, parse_name)


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def select_gpus(requested: Optional[int], env, visible: int):
    """(GPUs to train on, environment for the training processes) for ``requested`` GPUs (None: all visible):
    ``CUDA_VISIBLE_DEVICES`` becomes the first ``requested`` entries of the current one (0..N-1 when unset), so
    that fairseq (whose default world size is the number of visible devices) and its launchers see only those."""
    if requested is None:
        return visible, {}
    current = env.get("CUDA_VISIBLE_DEVICES")
    if requested > visible:
        shown = f"CUDA_VISIBLE_DEVICES={current}" if current is not None else "CUDA_VISIBLE_DEVICES unset"
        raise SystemExit(f"error: GPUS={requested} but only {visible} GPU(s) are visible ({shown}): use GPUS={visible} "
                         f"or fewer (GPUS=0 trains on the CPU), or leave GPUS unset to use every visible GPU")
    ids = [d.strip() for d in current.split(",") if d.strip()] if current else [str(i) for i in range(visible)]
    return requested, {"CUDA_VISIBLE_DEVICES": ",".join(ids[:requested])}


def update_freq(batch_tokens: int, world: int, max_tokens: int) -> int:
    """Micro-batches per update so that ``world`` workers of ``max_tokens`` reach ``batch_tokens``."""
    return max(1, math.ceil(batch_tokens / (max(1, world) * max_tokens)))


def tensorboard_available() -> bool:
    """Whether fairseq's ``--tensorboard-logdir`` can write (it needs ``tensorboard`` or ``tensorboardX``)."""
    return any(importlib.util.find_spec(name) is not None for name in ("tensorboardX", "tensorboard"))


def task_args(length_penalty: str, beam_search: str = "fairseq") -> List[str]:
    """fairseq's ``--task`` for decoding with ``length_penalty`` and ``beam_search``: ``translation`` for fairseq's
    penalty and search, else the plugin's ``translation_length_penalty --length-penalty P`` and, for THUMT's search,
    ``--beam-search thumt`` (:mod:`diverse_fairseq.methods.length_penalty`)."""
    if length_penalty not in LENGTH_PENALTIES:
        raise ValueError(f"length penalty {length_penalty!r}: use one of {', '.join(LENGTH_PENALTIES)}")
    if beam_search not in BEAM_SEARCHES:
        raise ValueError(f"beam search {beam_search!r}: use one of {', '.join(BEAM_SEARCHES)}")
    if (length_penalty, beam_search) == ("fairseq", "fairseq"):
        return ["--task", "translation"]
    return ["--task", "translation_length_penalty", "--length-penalty", length_penalty,
            *(["--beam-search", beam_search] if beam_search != "fairseq" else [])]


@dataclass(frozen=True)
class Decoding:
    """How a run's validation BLEU and test set are decoded (:func:`decoding`)."""

    beam: int
    lenpen: float
    length_penalty: str
    beam_search: str
    max_len_a: float
    max_len_b: int


def decoding(meta: DatasetMeta, s: Setting) -> Decoding:
    """How setting ``s`` decodes the prepared data: the recipe's beam and length penalty value, the setting's
    penalty form (fairseq's or GNMT's), beam search (fairseq's or THUMT's) and its length limit
    ``max_len_a * |x| + max_len_b`` where it has one, else the recipe's."""
    return Decoding(beam=meta.beam, lenpen=meta.lenpen, length_penalty=s.length_penalty, beam_search=s.beam_search,
                    max_len_a=meta.max_len_a if s.max_len_a is None else s.max_len_a,
                    max_len_b=meta.max_len_b if s.max_len_b is None else s.max_len_b)


def eval_bleu_args(meta: DatasetMeta, s: Setting) -> List[str]:
    """fairseq's validation BLEU (``--eval-bleu``) for choosing the best checkpoint, fitted to the prepared data
    (``prepare.json``): the recipe's beam, length penalty and length limit; BPE removed as the data was
    segmented (subword-nmt ``@@ `` or sentencepiece); Moses detokenization of the target language where the
    text was Moses-tokenized (sacrebleu then scores detokenized text, as the test evaluation does)."""
    d = decoding(meta, s)  # the penalty form and the search are task options (task_args), not --eval-bleu-args
    generation = {name: getattr(d, name) for name in ("beam", "lenpen", "max_len_a", "max_len_b")}
    post = meta.post_process
    detok = ["moses", "--eval-bleu-detok-args", json.dumps({"target_lang": meta.target_lang})] \
        if meta.moses_tokenized else ["space"]
    return ["--eval-bleu", "--eval-bleu-args", json.dumps(generation),
            "--eval-bleu-remove-bpe", "@@ " if post == "subword_nmt" else post, "--eval-bleu-detok", *detok,
            "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]


#: fairseq-train options that its command line handles around fairseq's ``call_main`` (``fairseq_cli.train.cli_main``:
#: the profiler, the plasma server) or that ask for more than one process: a run with one of them starts the command
COMMAND_LINE_ONLY = ("--profile", "--use-plasma-view", "--distributed-world-size")


@dataclass(frozen=True)
class Plan:
    """One training run, decided once (:func:`plan`)."""

    request: TrainRequest
    setting_name: str  # the setting the run trains with (a name of :data:`SETTINGS`)
    setting: Setting
    arch: str
    args: Tuple[str, ...]  # fairseq-train's arguments, whatever the launcher
    launcher: Tuple[str, ...]  # the program before the arguments: this Python -m fairseq_cli.train, or torchrun
    save_dir: Path
    meta: DatasetMeta
    identity: Dict = field(compare=False)  # :func:`diverse_fairseq.runs.identity.run_identity`
    gpus: int = 0  # GPUs per node (0: the CPU)
    nodes: int = 1
    max_tokens: int = 0
    update_freq: int = 1
    max_update: int = 0
    average: int = 0  # checkpoints averaged after training (0: a single model)
    best_checkpoint_metric: Optional[str] = None
    precision: str = "fp32"  # one of PRECISIONS: training's, and the evaluation's on a GPU
    rank0: bool = True  # this process is on the first node (it averages)
    method: str = ""  # the methods it trains with, "" for none (runs/naming.py, method_label)

    @property
    def world(self) -> int:
        return max(1, self.gpus) * self.nodes

    @property
    def in_process(self) -> bool:
        """One training process (the CPU or one GPU, one node) of fairseq-train itself (no torchrun, no
        ``TRAIN_HOOK``, none of :data:`COMMAND_LINE_ONLY` among the options): :func:`diverse_fairseq.training.launch`
        runs fairseq-train's ``main`` in the calling process, as fairseq's ``call_main`` runs a world of one; the
        others are started as :attr:`command`."""
        return (self.world == 1 and self.launcher == (sys.executable, "-m", "fairseq_cli.train")
                and not any(a.split("=", 1)[0] in COMMAND_LINE_ONLY for a in self.args))

    @property
    def tokens_per_update(self) -> int:
        return self.world * self.max_tokens * self.update_freq

    @property
    def update_based(self) -> bool:  # checkpoints every N updates (else one per epoch): what averaging counts
        return bool(self.setting.save_interval_updates)

    @property
    def command(self) -> List[str]:
        return [*self.launcher, *self.args]

    @property
    def embedding_sharing(self) -> str:
        """``all``, ``decoder`` (target input with output) or ``none``, as the arguments ask fairseq."""
        return ("all" if "--share-all-embeddings" in self.args else
                "decoder" if "--share-decoder-input-output-embed" in self.args else "none")

    @property
    def single_checkpoint(self) -> Path:
        return self.checkpoint(0)

    def checkpoint(self, averaged: int) -> Path:
        """The checkpoint to evaluate after averaging ``averaged`` checkpoints (0: none): the one place that decides
        it for a run."""
        return self.save_dir / checkpoint_name(self.best_checkpoint_metric, averaged)

    @property
    def decoding(self) -> Decoding:
        return decoding(self.meta, self.setting)


def last_wins(args: Sequence[str]) -> List[str]:
    """``args`` with each option (a ``-flag`` or ``--flag[=value]`` and the values after it) kept only where it is
    given last: argparse reads the same values (fairseq's parser has no repeatable option), and the command names
    each option once."""
    groups: List[List[str]] = []
    for a in args:
        if re.match(r"--?[A-Za-z]", a) or not groups:
            groups.append([a])
        else:
            groups[-1].append(a)
    last = {g[0].split("=", 1)[0]: i for i, g in enumerate(groups)}
    return [a for i, g in enumerate(groups) if last[g[0].split("=", 1)[0]] == i for a in g]


def plan(request: TrainRequest) -> Plan:
    """The :class:`Plan` of ``request``. The save directory is ``request.save_dir``, else a ``--save-dir`` among the
    extra options, else ``CHECKPOINTS/<DATASET>_<SETTING_OR_ARCH>-<methods or NAME>-<hash of the run's identity>``
    (:func:`~diverse_fairseq.runs.naming.default_save_dir`). The launcher runs
    ``-m fairseq_cli.train`` (or ``request.entry``): through torchrun when ``options.nnodes`` is set. Options
    fairseq-train would refuse (:func:`~diverse_fairseq.runs.identity.parse_train_args`) are refused here."""
    o, dataset, setting_or_arch, extra = request.options, request.dataset, request.setting, list(request.extra)
    gpus = visible_gpus() if request.gpus is None else request.gpus
    key, s, arch = resolve_setting(setting_or_arch)
    data = Path(request.data_bin) / dataset
    meta = load_dataset_meta(data)
    nnodes = o.nnodes or o.slurm_nnodes
    world = max(1, gpus) * nnodes
    max_tokens = o.max_tokens or s.max_tokens
    freq = o.update_freq or update_freq(s.batch_tokens, world, max_tokens)
    max_update = o.max_update or s.max_update
    placeholder = "\0SAVE_DIR\0"  # replaced below: the default save directory depends on the identity
    args = [
        str(data), "--user-dir", USER_DIR, *task_args(s.length_penalty, s.beam_search),
        "--source-lang", meta.source_lang, "--target-lang", meta.target_lang,
        "--arch", arch, *s.extra,
        # embedding sharing (shared: fairseq's, all three matrices on a joined dictionary, else the target's with
        # the output; untied: none), layer-norm placement, dropout types beyond --dropout (None: fairseq's default)
        *([] if (o.embeddings or s.embeddings) == "untied" else
          ["--share-all-embeddings" if meta.joined_dictionary else "--share-decoder-input-output-embed"]),
        *(["--encoder-normalize-before", "--decoder-normalize-before"] if s.normalize_before else []),
        *(["--attention-dropout", str(s.attention_dropout)] if s.attention_dropout is not None else []),
        *(["--activation-dropout", str(s.activation_dropout)] if s.activation_dropout is not None else []),
        "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--adam-eps", f"{s.adam_eps:g}", "--clip-norm", "0.0",
        "--lr", str(s.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(s.warmup),
        "--warmup-init-lr", "1e-07", "--dropout", str(s.dropout), "--weight-decay", str(s.weight_decay),
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", str(max_tokens), "--update-freq", str(freq), "--max-update", str(max_update),
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
    best_metric = s.best_checkpoint_metric
    if best_metric == "bleu":  # "loss" is fairseq's default best metric: nothing to add
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
    # the final options (the extra ones replace ours), refused here if fairseq-train would refuse them
    args = last_wins(args + extra)
    final = parse_train_args([a.replace(placeholder, "<save-dir>") for a in args])
    identity, method = run_identity(final, meta), method_label(final)
    explicit = request.save_dir or (final.save_dir if final.save_dir != "<save-dir>" else None)
    save_dir = Path(explicit or default_save_dir(o.checkpoints, dataset, setting_or_arch, identity_hash(identity),
                                                 method, request.name))
    args = [a.replace(placeholder, str(save_dir)) for a in args]
    return Plan(request=request, setting_name=key, setting=s, arch=final.arch, args=tuple(args),
                launcher=tuple(launcher), save_dir=save_dir, meta=meta, identity=identity, gpus=gpus, nodes=nnodes,
                max_tokens=max_tokens, update_freq=freq, max_update=final.max_update or 0, average=average,
                best_checkpoint_metric=best_metric, precision=precision, method=method,
                rank0=o.node_rank == 0 and o.slurm_node_id == 0)
