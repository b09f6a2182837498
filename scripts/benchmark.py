#!/usr/bin/env python
"""Training-step time and peak memory of diverse-fairseq's methods relative to stock fairseq.

Every case is measured in the same process against its stock-fairseq baseline, on the same synthetic
batches: for translation, fairseq's ``transformer`` with ``label_smoothed_cross_entropy`` at
``transformer_iwslt_de_en`` size (512 dim, 4 heads, 6+6 layers, FFN 1024, dropout 0.3, shared decoder
input/output embeddings, 10k joined vocabulary), Adam, and all translation models start from its weights;
for the ``lm_*`` cases, fairseq's ``transformer_lm`` (512 dim, 8 heads, 6 layers, FFN 2048, dropout 0.1,
same vocabulary) with ``cross_entropy`` and Adam on sequences of ``--lm-length`` tokens, every LM built from
the same seed (the diverse LM initialises exactly as the stock one); for the ``roberta_*`` cases, fairseq's
``roberta`` (base: 768 dim, 12 heads, 12 layers, FFN 3072, same vocabulary) with a two-class classification
head, ``sentence_prediction`` and Adam on sentences of ``--roberta-length`` / 2 to ``--roberta-length`` tokens,
built the same way. After warm-up, the cases run
interleaved, one training step each per round (so machine load drifts cancel); a case's time ratio is
the median over rounds of (case step time / its baseline's step time in that round).

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

Memory of the benchmark itself. Each case is measured against its baseline and then freed before the next
case is built, so that the process holds the baselines and one case at a time (the rounds interleave the
case with its baseline only; the stock LM and RoBERTa are built for their first case and freed after their
last). The RoBERTa-base cases (12 layers, 768 wide) and EM routing in every attention module
(``routing_em_all_train``, about 3 GB for its step alone) run only with ``--large`` (or when ``--only`` names
them): without them the default run stays small enough for a laptop.
The line above the table gives the peak resident memory (RSS) of the whole run.

A case is one entry of ``CASES`` in ``scripts/benchlib/cases.py`` (measuring: ``benchlib/measure.py``). The
last line of output is one JSON object ``{case: time ratio, ..., case_peak_mem: memory ratio}``.

Usage: python scripts/benchmark.py [--device cpu|cuda] [--steps N] [--only KEY[,KEY]] [--large] [--tokens N]
       [--beam 5] [--decode-len 30] [--decode-tokens 300] [--model-args '...'] [--lm-length 256]
       [--lm-arch diverse_transformer_lm] [--lm-model-args '...'] [--roberta-length 128]
       [--roberta-arch diverse_roberta] [--roberta-model-args '...']
"""

import argparse
import copy
import gc
import json
import os
import resource
import shlex
import statistics
import sys
import time
import warnings
from typing import Dict

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchlib.cases import CASES, CLASSIFICATION_HEAD, REFERENCES, Case, Context, build_baseline  # noqa: E402
from benchlib.measure import (  # noqa: E402
    peak_memory,
    synthetic_batches,
    synthetic_lm_batches,
    synthetic_roberta_batches,
    time_rounds,
    to_device,
)
from fairseq.data import Dictionary  # noqa: E402
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask  # noqa: E402
from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask  # noqa: E402
from fairseq.tasks.translation import TranslationConfig, TranslationTask  # noqa: E402

ROBERTA_CLASSES = 2
# the cases that run only with --large (or when --only names them): RoBERTa-base, and EM routing in every
# attention module (its step alone holds about 3 GB at the default batch size on the CPU)
LARGE_CASES = ("roberta_", "routing_em_all_train")
LARGE = "the roberta_* cases and routing_em_all_train"


def is_large(key: str) -> bool:
    return key.startswith(LARGE_CASES)


def peak_rss_mib() -> float:
    """The peak resident memory of this process so far, in MiB (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def roberta_task(dictionary: Dictionary, length: int, seed: int) -> SentencePredictionTask:
    """``sentence_prediction`` over ``dictionary`` with ``ROBERTA_CLASSES`` labels and room for ``length`` tokens."""
    labels = Dictionary()
    for i in range(ROBERTA_CLASSES):
        labels.add_symbol(f"label{i}")
    config = SentencePredictionConfig(data="unused-data-dir", num_classes=ROBERTA_CLASSES, max_positions=length,
                                      regression_target=False, classification_head_name=CLASSIFICATION_HEAD,
                                      seed=seed)
    return SentencePredictionTask(config, dictionary, labels)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=7, help="measured rounds (one step per case each)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps per case first")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated case keys (default: all, {LARGE} only with --large)")
    parser.add_argument("--large", action="store_true",
                        help=f"also run {LARGE} (several GB more memory)")
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
    parser.add_argument("--model-args", default="",
                        help="more model options of every translation model, e.g. '--encoder-layers 3'")
    parser.add_argument("--lm-arch", default="diverse_transformer_lm", help="the lm_* cases' architecture")
    parser.add_argument("--lm-model-args", default="", help="more model options of every language model")
    parser.add_argument("--lm-length", type=int, default=256, help="tokens per sequence of the lm_* cases")
    parser.add_argument("--roberta-arch", default="diverse_roberta", help="the roberta_* cases' architecture")
    parser.add_argument("--roberta-model-args", default="", help="more model options of every RoBERTa model")
    parser.add_argument("--roberta-length", type=int, default=128,
                        help="longest sentence (tokens) of the roberta_* cases; sentences are half to all of it")
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
    keys = [k for k in CASES if args.large or not is_large(k)] if args.only is None else \
        [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = [k for k in keys if k not in CASES]
    if unknown:
        parser.error(f"--only: unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")

    dictionary = Dictionary()
    for i in range(args.vocab - dictionary.nspecial):
        dictionary.add_symbol(f"w{i}")
    dictionary.pad_to_multiple_(8)
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    ctx = Context(task, device, args.arch,
                  ["--share-decoder-input-output-embed", "--dropout", "0.3", *shlex.split(args.model_args)],
                  beam=args.beam, decode_len=args.decode_len,
                  lm_task=LanguageModelingTask(LanguageModelingConfig(tokens_per_sample=args.lm_length), dictionary),
                  lm_arch=args.lm_arch, lm_model_args=shlex.split(args.lm_model_args),
                  roberta_task=roberta_task(dictionary, args.roberta_length, args.seed),
                  roberta_arch=args.roberta_arch, roberta_model_args=shlex.split(args.roberta_model_args))

    torch.manual_seed(args.seed)
    baseline = build_baseline(ctx)
    ctx.baseline_state = copy.deepcopy(baseline.model.state_dict())
    cases: Dict[str, Case] = {"baseline": baseline}
    # case key -> the baseline it is measured against (each case is built when its turn comes)
    reference = {key: CASES[key].reference for key in keys}
    if "baseline_decode" in reference.values():  # the baseline model's beam search, on its own copy
        stock = copy.deepcopy(baseline.model).eval()
        cases["baseline_decode"] = Case(stock, None, None, mode="decode", generator=ctx.generator(stock),
                                        batches="test")
        del stock
    del baseline  # held by cases["baseline"] alone from here, so that it can be freed
    needed = set(reference.values())
    refs = [n for n in ("baseline", *REFERENCES, "baseline_decode") if n in needed]
    timed = refs + keys  # references first
    if "baseline" not in needed:  # only the translation cases train against it
        del cases["baseline"]
    gc.collect()
    batch_sets = {
        "translation": synthetic_batches(dictionary, args.batches, tokens, args.seed),
        "test": synthetic_batches(dictionary, args.batches, args.decode_tokens, args.seed + 1),
        "lm": synthetic_lm_batches(dictionary, args.batches, tokens, args.lm_length, args.seed),
        "roberta": synthetic_roberta_batches(dictionary, args.batches, tokens, args.roberta_length, ROBERTA_CLASSES,
                                             args.seed),
    }
    batch_sets = {kind: [to_device(b, device) for b in sets] for kind, sets in batch_sets.items()}
    print(f"device {device} ({torch.get_num_threads()} threads, {clock_name} clock)  {args.steps} rounds after "
          f"{args.warmup} warm-up steps")

    def describe(name: str) -> None:
        kind = cases[name].batches
        ntok = statistics.mean(int(b["ntokens"]) for b in batch_sets[kind])
        n_params = sum(p.numel() for p in cases[name].model.parameters())
        arch = args.arch if name == "baseline" else ctx.single_stack_arch(kind)
        print(f"  {name}: stock {arch.replace('diverse_', '')}, params {n_params / 1e6:.1f}M, "
              f"~{ntok:.0f} {'input' if kind == 'roberta' else 'target'} tokens / batch ({kind})", flush=True)

    if "baseline" in cases:
        describe("baseline")

    def data(case: Case, i: int) -> dict:
        sets = batch_sets[case.batches]
        return sets[i % len(sets)]

    # one case at a time against its reference (built, measured, freed), so that the process never holds
    # more than the references and one case; a reference is freed after the last case that needs it
    ratios: Dict[str, list] = {}
    memory: Dict[str, Dict[str, float]] = {}
    done: Dict[str, Case] = {}  # the measured cases, without their models
    for i, key in enumerate(keys):
        ref = reference[key]
        if ref not in cases:  # the stock LM or RoBERTa: built for its first case, freed after its last
            torch.manual_seed(args.seed)
            cases[ref] = REFERENCES[ref](ctx)
            describe(ref)
        torch.manual_seed(args.seed)
        cases[key] = CASES[key](ctx)
        ratios.update(time_rounds(cases, [key], [ref, key], data, args.steps, args.warmup, clock, device))
        if not args.no_memory:
            for name in (ref, key):
                if cases[name].mode == "train" and name not in memory:
                    memory[name] = peak_memory(cases[name], data(cases[name], 0), device)
        done[key] = cases.pop(key)
        done[key].model = done[key].criterion = done[key].optimizer = done[key].generator = None
        if ref not in reference.values() or all(reference[k] != ref for k in keys[i + 1:]):
            done[ref] = cases.pop(ref)
            done[ref].model = done[ref].criterion = done[ref].optimizer = done[ref].generator = None
        gc.collect()
    cases = done

    result: Dict[str, float] = {}
    print(f"peak resident memory (RSS) of this run: {peak_rss_mib():.0f} MiB"
          + ("" if args.large or args.only else f"; {LARGE} run with --large"))
    print(f"{'case':<28}{'median step (s)':>16}{'time ratio':>12}{'peak mem (MiB)':>16}{'mem ratio':>11}"
          f"{'activations (MiB)':>19}{'act. ratio':>12}")
    for name in timed:
        case = cases[name]
        ratio = statistics.median(ratios[name]) if name in keys else 1.0
        if name in keys:
            result[name] = round(ratio, 3)
        line = f"{name:<28}{statistics.median(case.times):>16.3f}{ratio:>12.3f}"
        if name in memory:
            mem, base = memory[name], memory[case.reference if name in keys else name]
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
    gc.freeze()  # what the imports made: each gc.collect() of the run then walks only what the run makes
    main()
