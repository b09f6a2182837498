"""Measuring: synthetic batches, one training or decoding step, interleaved step timing, peak memory."""

from typing import Dict, List

import numpy as np
import torch
from fairseq.data import Dictionary, LanguagePairDataset, data_utils

from .cases import Case


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


def synthetic_lm_batches(dictionary: Dictionary, n_batches: int, tokens: int, length: int, seed: int) -> List[dict]:
    """Language-model batches of ``tokens // length`` (at least one) full sequences of ``length`` tokens, the
    target being the input shifted by one token (``language_modeling`` with ``--sample-break-mode none``)."""
    gen = torch.Generator().manual_seed(seed)
    rows = max(1, tokens // length)
    batches = []
    for _ in range(n_batches):
        seqs = torch.randint(dictionary.nspecial, len(dictionary), (rows, length + 1), generator=gen)
        batches.append({"id": torch.arange(rows), "nsentences": rows, "ntokens": rows * length,
                        "net_input": {"src_tokens": seqs[:, :-1].contiguous(),
                                      "src_lengths": torch.full((rows,), length)},
                        "target": seqs[:, 1:].contiguous()})  # (rows, length) each
    return batches


def synthetic_roberta_batches(dictionary: Dictionary, n_batches: int, tokens: int, length: int, n_classes: int,
                              seed: int) -> List[dict]:
    """Sentence-classification batches as ``sentence_prediction`` collates them: ``tokens // length`` (at least
    one) sentences ``<s> w1 .. wn </s>`` of ``length // 2`` to ``length`` tokens, right-padded, each with a label
    in ``[0, n_classes)``."""
    gen = torch.Generator().manual_seed(seed)
    rows = max(1, tokens // length)
    batches = []
    for _ in range(n_batches):
        lengths = torch.randint(max(3, length // 2), length + 1, (rows,), generator=gen)
        sents = [torch.cat([torch.tensor([dictionary.bos()]),
                            torch.randint(dictionary.nspecial, len(dictionary), (int(n) - 2,), generator=gen),
                            torch.tensor([dictionary.eos()])]) for n in lengths]
        batches.append({"id": torch.arange(rows), "nsentences": rows, "ntokens": int(lengths.sum()),
                        "net_input": {"src_tokens": data_utils.collate_tokens(sents, dictionary.pad()),  # (rows, max n)
                                      "src_lengths": lengths},
                        "target": torch.randint(0, n_classes, (rows,), generator=gen)})  # (rows,)
    return batches


def to_device(sample, device):
    if torch.is_tensor(sample):
        return sample.to(device)
    if isinstance(sample, dict):
        return {k: to_device(v, device) for k, v in sample.items()}
    return sample


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
    """Peak bytes of one training step (scripts/benchmark.py's docstring says how on CPU)."""
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


def time_rounds(cases: Dict[str, Case], keys: List[str], timed: List[str], data, steps: int, warmup: int, clock,
                device) -> Dict[str, List[float]]:
    """``warmup`` unmeasured steps per case of ``timed`` (the cases of ``keys`` and their references), then
    ``steps`` interleaved rounds (see scripts/benchmark.py): appends each measured time to its case's ``times``
    and returns the per-round time ratios of the cases in ``keys``, each against its ``reference``.
    ``data(case, i)`` is the batch of step ``i``."""
    for name in timed:  # warm-up (also creates the optimizer state)
        for i in range(warmup):
            run_step(cases[name], data(cases[name], i))
    sync(device)

    def timed_step(name: str, r: int) -> float:
        sync(device)
        t0 = clock()
        run_step(cases[name], data(cases[name], r))
        sync(device)
        return clock() - t0

    ratios: Dict[str, List[float]] = {k: [] for k in keys}
    train = [n for n in timed if cases[n].mode == "train"]
    for r in range(steps):
        for name in train if r % 2 == 0 else list(reversed(train)):
            cases[name].times.append(timed_step(name, r))
        for k in keys:
            ref = cases[k].reference
            if cases[k].mode == "train":
                ratios[k].append(cases[k].times[-1] / cases[ref].times[-1])
            else:  # a decode case and the baseline's decoding, twice each in ABBA order (drift cancels)
                pair = [k, ref, ref, k] if r % 2 == 0 else [ref, k, k, ref]
                spent = {k: 0.0, ref: 0.0}
                for name in pair:
                    spent[name] += timed_step(name, r)
                cases[k].times.append(spent[k] / 2)
                cases[ref].times.append(spent[ref] / 2)
                ratios[k].append(spent[k] / spent[ref])
    return ratios
