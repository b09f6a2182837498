#!/usr/bin/env python
"""Training-step time and peak memory of diverse-fairseq's methods relative to stock fairseq.

Every case is measured in the same process against the same baseline: fairseq's ``transformer`` with
``label_smoothed_cross_entropy`` at ``transformer_iwslt_de_en`` size (512 dim, 4 heads, 6+6 layers,
FFN 1024, dropout 0.3, shared decoder input/output embeddings, 10k joined vocabulary), Adam, on the
same synthetic batches. All models start from the baseline's weights. After warm-up, the cases run
interleaved, one training step each per round (so machine load drifts cancel); a case's time ratio is
the median over rounds of (case step time / baseline step time in that round).

Step time. On CUDA: wall-clock time with synchronisation. On CPU the default clock is the CPU time of
this process (``time.process_time``) with one torch thread: on a machine shared with other jobs the
wall clock mostly measures the other jobs, while the CPU time of a single-threaded step is the work
the step does (with several threads it would also count OpenMP spin-waiting). ``--clock wall`` and
``--threads N`` measure wall-clock time with N threads instead (meaningful on an idle machine).

Peak memory. On CUDA: ``torch.cuda.max_memory_allocated`` over one training step. On CPU (no allocator
statistics): the bytes a step must hold at its peak, i.e. parameters + gradients + optimizer state
(after a step) + the tensors autograd saves for backward during forward and loss, each storage counted
once (``torch.autograd.graph.saved_tensors_hooks``; parameter storages are not counted twice). The
table also shows the activation part alone.

Decoding cases (``mode="decode"``) time fairseq's beam search (``SequenceGenerator``, beam 5) over
separate synthetic test batches (~``--decode-tokens`` source tokens each) against the same beam search
with the baseline model, in the same rounds: each decode case and the baseline's decoding run twice per
round in ABBA order (single decoding times on a shared CPU drift by a few percent). Every hypothesis is
decoded for exactly ``--decode-len`` steps (EOS barred before, forced at that length): untrained models
with different weights would otherwise stop at different lengths and the ratio would not compare equal work.

Later issues add a case by adding one entry to ``CASES`` (see ``register_case``). The last line of
output is one JSON object ``{case: time ratio, ..., case_peak_mem: memory ratio}``.

Usage: python scripts/benchmark.py [--device cpu|cuda] [--steps N] [--only KEY[,KEY]] [--tokens N]
       [--beam 5] [--decode-len 30] [--decode-tokens 300]
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from fairseq import options  # noqa: E402
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion  # noqa: E402
from fairseq.data import Dictionary, LanguagePairDataset  # noqa: E402
from fairseq.models.transformer import TransformerModel  # noqa: E402
from fairseq.tasks.translation import TranslationConfig, TranslationTask  # noqa: E402

import diverse_fairseq  # noqa: E402,F401  (registers the plugin)
from diverse_fairseq.methods.disagreement.criterion import (  # noqa: E402
    LabelSmoothedCrossEntropyWithDisagreementCriterion,
)
from diverse_fairseq.methods.transformer import DiverseTransformerModel  # noqa: E402
from diverse_fairseq.methods.repulsive.particles import track_model  # noqa: E402
from diverse_fairseq.methods.repulsive.optimizer import RepulsiveAdam, RepulsiveAdamConfig  # noqa: E402

LABEL_SMOOTHING = 0.1


# ----------------------------------------------------------------------------------------- set-up


@dataclass
class Context:
    """What every case builder gets: the task, model arguments and the baseline's weights."""

    task: TranslationTask
    device: torch.device
    arch: str
    extra_model_args: List[str]
    baseline_state: Optional[Dict[str, torch.Tensor]] = None
    beam: int = 5
    decode_len: int = 30

    def generator(self, model: torch.nn.Module):
        """fairseq's beam search with exactly ``decode_len`` steps for every hypothesis (EOS is barred
        before and forced at that length), so that models with different weights do the same work."""
        from fairseq.sequence_generator import SequenceGenerator

        return SequenceGenerator([model], self.task.target_dictionary, beam_size=self.beam,
                                 max_len_a=0, max_len_b=self.decode_len, min_len=self.decode_len)

    def model_args(self, arch: str, extra=()) -> argparse.Namespace:
        parser = options.get_training_parser()
        argv = ["unused-data-dir", "--arch", arch, "--task", "translation", *self.extra_model_args, *extra]
        return options.parse_args_and_arch(parser, input_args=argv)

    def finish(self, model: torch.nn.Module) -> torch.nn.Module:
        """Load the baseline's weights (same names) and move to the device, in training mode.

        A model with routing aggregators has no ``out_proj`` in its routed attention modules and
        aggregator parameters the baseline lacks: exactly those are left out (and checked to be the only
        differences), everything else is loaded."""
        if self.baseline_state is not None:
            routed = [name for name, m in model.named_modules() if getattr(m, "aggregator", None) is not None]
            if not routed:
                model.load_state_dict(self.baseline_state, strict=True)
            else:
                state = {k: v for k, v in self.baseline_state.items()
                         if not any(k.startswith(f"{name}.out_proj.") for name in routed)}
                missing, unexpected = model.load_state_dict(state, strict=False)
                assert not unexpected, unexpected
                assert all(any(k.startswith(f"{name}.aggregator.") for name in routed) for k in missing), missing
        return model.to(self.device).train()


@dataclass
class Case:
    model: torch.nn.Module
    criterion: Optional[torch.nn.Module]
    optimizer: object  # zero_grad(set_to_none=...) and step(), e.g. a torch optimizer
    report_memory: bool = False  # put "<key>_peak_mem" in the JSON (the table shows every case)
    times: List[float] = field(default_factory=list)
    #: "train": one training step per round, against the baseline's training step; "decode": beam search
    #: over one test batch per round with ``generator``, against the baseline model's beam search
    mode: str = "train"
    generator: Optional[object] = None


def adam(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=5e-4, betas=(0.9, 0.98), weight_decay=1e-4)


def build_baseline(ctx: Context) -> Case:
    args = ctx.model_args(ctx.arch.replace("diverse_", ""))
    model = ctx.finish(TransformerModel.build_model(args, ctx.task))
    criterion = LabelSmoothedCrossEntropyCriterion(ctx.task, sentence_avg=False, label_smoothing=LABEL_SMOOTHING)
    return Case(model, criterion.to(ctx.device), adam(model))


def disagreement_case(terms: str, attention: str = "enc_self,dec_self,enc_dec", report_memory=False):
    def build(ctx: Context) -> Case:
        args = ctx.model_args(ctx.arch)
        model = ctx.finish(DiverseTransformerModel.build_model(args, ctx.task))
        criterion = LabelSmoothedCrossEntropyWithDisagreementCriterion(
            ctx.task, sentence_avg=False, label_smoothing=LABEL_SMOOTHING,
            disagreement_lambda=1.0, disagreement_terms=terms, disagreement_attention=attention,
        )
        return Case(model, criterion.to(ctx.device), adam(model), report_memory=report_memory)

    return build


class SvgdThenAdam:
    """The baseline's Adam after ``repulsive_adam``'s SVGD transform of the Q/K/V head blocks of every
    attention module (the transformed gradients are copied into ``.grad``), so that the ratio is the
    cost of the transform itself and not of a different Adam implementation."""

    def __init__(self, model: torch.nn.Module, **options):
        config = RepulsiveAdamConfig(lr=[5e-4], adam_betas="(0.9, 0.98)", weight_decay=1e-4, **options)
        self.repulsive = RepulsiveAdam(config, list(model.parameters()))
        self.adam = adam(model)
        self.state = self.adam.state

    def zero_grad(self, set_to_none=True):
        self.adam.zero_grad(set_to_none=set_to_none)

    def step(self):
        new = self.repulsive.particle_gradients()
        for p in self.repulsive.particle_params:
            p.grad.copy_(new[id(p)])
        self.adam.step()


def repulsive_case(**options):
    def build(ctx: Context) -> Case:
        args = ctx.model_args(ctx.arch.replace("diverse_", ""))  # stock fairseq transformer
        model = track_model(ctx.finish(TransformerModel.build_model(args, ctx.task)))
        criterion = LabelSmoothedCrossEntropyCriterion(ctx.task, sentence_avg=False, label_smoothing=LABEL_SMOOTHING)
        return Case(model, criterion.to(ctx.device), SvgdThenAdam(model, **options))

    return build


def routing_args(routing: str = "em", encoder=None, decoder=None, enc_dec=None) -> List[str]:
    """``--routing-*`` options: ``encoder`` / ``decoder`` / ``enc_dec`` are layer lists ("0,1", "all")."""
    args = ["--routing-type", routing, "--routing-iterations", "3"]
    for flag, layers in (("--routing-encoder-layers", encoder), ("--routing-decoder-layers", decoder),
                         ("--routing-encoder-decoder-layers", enc_dec)):
        if layers is not None:
            args += [flag, layers]
    return args


def routing_case(report_memory=False, **placement):
    """Training step of diverse_transformer with routing-by-agreement aggregation (NAACL 2019) in the
    given attention modules, plain label-smoothed cross-entropy."""

    def build(ctx: Context) -> Case:
        args = ctx.model_args(ctx.arch, routing_args(**placement))
        model = ctx.finish(DiverseTransformerModel.build_model(args, ctx.task))
        criterion = LabelSmoothedCrossEntropyCriterion(ctx.task, sentence_avg=False, label_smoothing=LABEL_SMOOTHING)
        return Case(model, criterion.to(ctx.device), adam(model), report_memory=report_memory)

    return build


def decode_case(train_builder: Callable[[Context], Case]):
    """Beam search (``Context.beam`` beams, ``Context.decode_len`` steps) with the model that
    ``train_builder`` builds, against the same beam search with the baseline model."""

    def build(ctx: Context) -> Case:
        case = train_builder(ctx)
        case.model.eval()
        return Case(case.model, None, None, mode="decode", generator=ctx.generator(case.model))

    return build


#: key -> builder(Context) -> Case. Later issues register their cases here.
CASES: Dict[str, Callable[[Context], Case]] = {
    "disagreement_out_all": disagreement_case("out", report_memory=True),
    "disagreement_pos_all": disagreement_case("pos"),
    "disagreement_sub_all": disagreement_case("sub"),
    "repulsive_svgd_all": repulsive_case(repulsive_method="svgd"),
    # routing-by-agreement (NAACL 2019): EM routing in the lowest two encoder layers (the paper's
    # "Effective Aggregation"), in all encoder layers, in every attention module; beam search with the first
    # (encoder routing runs once per test sentence, not once per decoding step)
    "routing_em_enc2_train": routing_case(encoder="0,1", report_memory=True),
    "routing_em_enc_all_train": routing_case(encoder="all"),
    "routing_em_all_train": routing_case(encoder="all", decoder="all", enc_dec="all"),
    "routing_em_enc2_decode": decode_case(routing_case(encoder="0,1")),
}


def register_case(key: str, builder: Callable[[Context], Case]) -> None:
    CASES[key] = builder


def synthetic_batches(dictionary: Dictionary, n_batches: int, tokens: int, seed: int) -> List[dict]:
    """Batches of ~``tokens`` target tokens, sentence lengths 15-35 (plus EOS), fairseq-collated."""
    gen = torch.Generator().manual_seed(seed)
    low, high = dictionary.nspecial, len(dictionary)
    batches = []
    for _ in range(n_batches):
        src, tgt = [], []
        while sum(len(t) for t in tgt) < tokens:
            n_src = int(torch.randint(15, 36, (1,), generator=gen))
            n_tgt = max(5, n_src + int(torch.randint(-5, 6, (1,), generator=gen)))
            src.append(torch.cat([torch.randint(low, high, (n_src,), generator=gen), torch.tensor([dictionary.eos()])]))
            tgt.append(torch.cat([torch.randint(low, high, (n_tgt,), generator=gen), torch.tensor([dictionary.eos()])]))
        ds = LanguagePairDataset(
            src, np.array([len(s) for s in src]), dictionary, tgt, np.array([len(t) for t in tgt]), dictionary
        )
        batches.append(ds.collater([ds[i] for i in range(len(src))]))
    return batches


def to_device(sample, device):
    if torch.is_tensor(sample):
        return sample.to(device)
    if isinstance(sample, dict):
        return {k: to_device(v, device) for k, v in sample.items()}
    return sample


# ------------------------------------------------------------------------------------- measuring


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(case: Case, sample: dict) -> None:
    """One fairseq-style update: loss (token sum) → backward → grads / sample_size → optimizer step."""
    case.optimizer.zero_grad(set_to_none=True)
    loss, sample_size, _ = case.criterion(case.model, sample)
    loss.backward()
    grads = [p.grad for p in case.model.parameters() if p.grad is not None]
    torch._foreach_mul_(grads, 1.0 / float(sample_size))
    case.optimizer.step()


def decode_step(case: Case, sample: dict) -> None:
    """Beam search over one batch (``SequenceGenerator.generate`` runs without autograd)."""
    case.generator.generate([case.model], {"net_input": sample["net_input"]})


def run_step(case: Case, sample: dict) -> None:
    (train_step if case.mode == "train" else decode_step)(case, sample)


def _bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


def peak_memory(case: Case, sample: dict, device) -> Dict[str, float]:
    """Peak bytes of one training step (see the module docstring for the CPU method)."""
    if device.type == "cuda":
        case.optimizer.zero_grad(set_to_none=True)
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        train_step(case, sample)
        sync(device)
        return {"peak": float(torch.cuda.max_memory_allocated(device)), "activations": float("nan")}
    params = list(case.model.parameters())
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    state = [v for s in getattr(case.optimizer, "state", {}).values() for v in s.values() if torch.is_tensor(v)]
    saved: Dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in param_ptrs and ptr not in saved:
            saved[ptr] = st.nbytes()
        return t

    case.optimizer.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, sample_size, _ = case.criterion(case.model, sample)
    loss.backward()
    grads = [p.grad for p in params if p.grad is not None]
    activations = float(sum(saved.values()))
    persistent = float(_bytes(params) + _bytes(grads) + _bytes(state))
    return {"peak": persistent + activations, "activations": activations}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=7, help="measured rounds (one step per case each)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps per case first")
    parser.add_argument("--only", default=None, help="comma-separated case keys (default: all)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="target tokens per batch (default 1000 on CPU, 4096 on CUDA)")
    parser.add_argument("--batches", type=int, default=4, help="distinct batches, used in turn")
    parser.add_argument("--arch", default="diverse_transformer_iwslt_de_en")
    parser.add_argument("--vocab", type=int, default=10000, help="synthetic joined vocabulary size")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default 1 with --clock process, torch's default otherwise)")
    parser.add_argument("--clock", choices=["process", "wall"], default=None,
                        help="step timer: process CPU time (default on CPU) or wall clock (default on CUDA)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    parser.add_argument("--beam", type=int, default=5, help="beam size of the decode cases")
    parser.add_argument("--decode-len", type=int, default=30, help="decoding steps per sentence (decode cases)")
    parser.add_argument("--decode-tokens", type=int, default=300,
                        help="source tokens per test batch of the decode cases (~12 sentences)")
    args = parser.parse_args(argv)
    # stock fairseq hands torch a bool key padding mask with a float causal mask (decoder self-attention)
    warnings.filterwarnings("ignore", message="Support for mismatched key_padding_mask")

    device = torch.device(args.device)
    clock_name = args.clock or ("wall" if device.type == "cuda" else "process")
    if clock_name == "process" and device.type == "cuda":
        parser.error("--clock process measures CPU work; use --clock wall on CUDA")
    clock = time.perf_counter if clock_name == "wall" else time.process_time
    threads = args.threads or (1 if clock_name == "process" else None)
    if threads:
        torch.set_num_threads(threads)
    tokens = args.tokens or (4096 if device.type == "cuda" else 1000)
    keys = list(CASES) if args.only is None else [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = [k for k in keys if k not in CASES]
    if unknown:
        parser.error(f"--only: unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")

    dictionary = Dictionary()
    for i in range(args.vocab - dictionary.nspecial):
        dictionary.add_symbol(f"w{i}")
    dictionary.pad_to_multiple_(8)
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    ctx = Context(task, device, args.arch, ["--share-decoder-input-output-embed", "--dropout", "0.3"],
                  beam=args.beam, decode_len=args.decode_len)

    torch.manual_seed(args.seed)
    baseline = build_baseline(ctx)
    ctx.baseline_state = copy.deepcopy(baseline.model.state_dict())
    cases: Dict[str, Case] = {"baseline": baseline}
    for key in keys:
        torch.manual_seed(args.seed)
        cases[key] = CASES[key](ctx)
    if any(cases[k].mode == "decode" for k in keys):  # the baseline model's beam search, on its own copy
        stock = copy.deepcopy(baseline.model).eval()
        cases["baseline_decode"] = Case(stock, None, None, mode="decode", generator=ctx.generator(stock))
    reference = {"train": "baseline", "decode": "baseline_decode"}
    batches = [to_device(b, device) for b in synthetic_batches(dictionary, args.batches, tokens, args.seed)]
    test_batches = [to_device(b, device)
                    for b in synthetic_batches(dictionary, args.batches, args.decode_tokens, args.seed + 1)]
    n_params = sum(p.numel() for p in baseline.model.parameters())
    ntok = statistics.mean(int(b["ntokens"]) for b in batches)
    print(f"device {device} ({torch.get_num_threads()} threads, {clock_name} clock)  arch {args.arch}  params {n_params / 1e6:.1f}M  "
          f"~{ntok:.0f} target tokens / batch  {args.steps} rounds after {args.warmup} warm-up steps")

    def data(case: Case, i: int) -> dict:
        return (batches if case.mode == "train" else test_batches)[i % len(batches)]

    timing_training = any(cases[k].mode == "train" for k in keys)  # else only decoding is timed
    for name, case in cases.items():  # warm-up (also creates the optimizer state)
        if name == "baseline" and not timing_training:
            continue
        for i in range(args.warmup):
            run_step(case, data(case, i))
    sync(device)
    def timed(name: str, r: int) -> float:
        sync(device)
        t0 = clock()
        run_step(cases[name], data(cases[name], r))
        sync(device)
        return clock() - t0

    ratios: Dict[str, List[float]] = {k: [] for k in keys}
    for r in range(args.steps):
        train = [n for n in cases if cases[n].mode == "train" and (n != "baseline" or timing_training)]
        for name in train if r % 2 == 0 else list(reversed(train)):
            cases[name].times.append(timed(name, r))
        for k in keys:
            if cases[k].mode == "train":
                ratios[k].append(cases[k].times[-1] / cases["baseline"].times[-1])
            else:  # a decode case and the baseline's decoding, twice each in ABBA order (drift cancels)
                ref = reference["decode"]
                pair = [k, ref, ref, k] if r % 2 == 0 else [ref, k, k, ref]
                spent = {k: 0.0, ref: 0.0}
                for name in pair:
                    spent[name] += timed(name, r)
                cases[k].times.append(spent[k] / 2)
                cases[ref].times.append(spent[ref] / 2)
                ratios[k].append(spent[k] / spent[ref])

    memory: Dict[str, Dict[str, float]] = {}
    if not args.no_memory and timing_training:
        for name in cases:
            if cases[name].mode == "train":
                memory[name] = peak_memory(cases[name], batches[0], device)

    result: Dict[str, float] = {}
    print(f"{'case':<28}{'median step (s)':>16}{'time ratio':>12}{'peak mem (MiB)':>16}{'mem ratio':>11}"
          f"{'activations (MiB)':>19}{'act. ratio':>12}")
    for name, case in cases.items():
        if not case.times:  # the training baseline when only decoding was timed
            continue
        ratio = 1.0 if name in reference.values() else statistics.median(ratios[name])
        if name not in reference.values():
            result[name] = round(ratio, 3)
        line = f"{name:<28}{statistics.median(case.times):>16.3f}{ratio:>12.3f}"
        if name in memory:
            mem, base = memory[name], memory["baseline"]
            mem_ratio = mem["peak"] / base["peak"]
            act_ratio = mem["activations"] / base["activations"] if base["activations"] > 0 else float("nan")
            line += (f"{mem['peak'] / 2**20:>16.1f}{mem_ratio:>11.3f}"
                     f"{mem['activations'] / 2**20:>19.1f}{act_ratio:>12.3f}")
            if name != "baseline" and case.report_memory:
                result[f"{name}_peak_mem"] = round(mem_ratio, 3)
        print(line)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
