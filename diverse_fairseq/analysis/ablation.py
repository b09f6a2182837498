"""Head importance by ablation at test time (Michel, Levy, Neubig 2019, "Are Sixteen Heads Really Better than
One?"; An et al., EMNLP 2020, Figure 2 "Distribution of heads by performance drop after masking at test time").

Each head is masked in turn by zeroing its output O_h before the heads are combined (the head mask of
:func:`diverse_fairseq.methods.sites.observe`): its importance is the **increase** of the teacher-forced token
NLL (negative: the model got better without it) and, optionally, the **drop** of beam-search BLEU. The NLL
passes replay the layers below the masked module from the unmasked pass (:class:`LayerReplay`).
"""

import contextlib
import statistics
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
from tqdm import tqdm

from diverse_fairseq.methods.sites import AttentionSite, observe

METHOD = ("Michel et al. 2019 head ablation: zero one head's output O_h before the output projection; "
          "delta_nll = masked - unmasked teacher-forced NLL (nats/target token), "
          "delta_bleu = unmasked - masked BLEU; layer and head numbers are 1-based")


class _Replayed(nn.Module):
    """Stands in for a layer: returns, call after call, the outputs that layer produced in the recorded pass."""

    def __init__(self, outputs: List):
        super().__init__()
        self.outputs = iter(outputs)

    def forward(self, *args, **kwargs):
        return next(self.outputs)


class LayerReplay:
    """Records the output of every layer of ``model.encoder.layers`` and ``model.decoder.layers`` over one pass,
    then lets later passes replay the layers below a given depth: each returns exactly what the real layer
    returned (a tensor, or the decoder layer's tuple)."""

    def __init__(self, model):
        self.stacks = {"encoder": model.encoder.layers, "decoder": model.decoder.layers}
        self.outputs = {layer: [] for layers in self.stacks.values() for layer in layers}

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        for recorded in self.outputs.values():
            recorded.clear()
        handles = [layer.register_forward_hook(lambda module, inputs, output: self.outputs[module].append(output))
                   for layer in self.outputs]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def replaying(self, below: Dict[str, int]) -> Iterator[None]:
        """Replace ``layers[j]`` for ``j < below[stack]`` by their recorded outputs."""
        originals = []
        try:
            for name, depth in below.items():
                layers = self.stacks[name]
                for j in range(depth):
                    originals.append((layers, j, layers[j]))
                    layers[j] = _Replayed(self.outputs[layers[j]])
            yield
        finally:
            for layers, j, layer in reversed(originals):
                layers[j] = layer


def batch_nll(model, sample: Dict, net_output, pad: int) -> Tuple[float, int]:
    """Summed token NLL (nats) of the reference under teacher forcing, and the number of target tokens."""
    lprobs = model.get_normalized_probs(net_output, log_probs=True)  # [B, T, V]
    target = sample["target"]
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [B, T]
    keep = target.ne(pad)
    return float(nll[keep].double().sum()), int(keep.sum())


@torch.no_grad()
def mean_nll(model, batches: List[Dict], pad: int) -> float:
    """Teacher-forced NLL (nats per target token) of the references in ``batches``."""
    sums = [batch_nll(model, sample, model(**sample["net_input"]), pad) for sample in batches]
    return sum(nll for nll, _ in sums) / max(sum(tokens for _, tokens in sums), 1)


@torch.no_grad()
def corpus_bleu(model, task, batches: List[Dict], beam: int = 4) -> float:
    """sacrebleu BLEU (tokenize=none) of beam-search output against the references, both as dictionary
    symbols with subword markers removed. Comparable between ablations of one model, not to papers."""
    import sacrebleu
    from fairseq.sequence_generator import SequenceGenerator

    tgt_dict = task.target_dictionary
    spm = any(sym.startswith("\u2581") for sym in tgt_dict.symbols[tgt_dict.nspecial:tgt_dict.nspecial + 200])
    bpe = "sentencepiece" if spm else "subword_nmt"

    def detok(tokens) -> str:
        return " ".join(tgt_dict.string(tokens.int().cpu(), bpe_symbol=bpe).split())

    generator = SequenceGenerator([model], tgt_dict, beam_size=beam, max_len_a=1.2, max_len_b=10)
    hyps, refs = [], []
    for sample in batches:
        for i, hypos in enumerate(generator.generate([model], sample)):
            hyps.append(detok(hypos[0]["tokens"]))
            refs.append(detok(sample["target"][i]))
    return float(sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score)


@torch.no_grad()
def head_importance(model, task, sites: Sequence[AttentionSite], batches: List[Dict], pad: int,
                    bleu_batches: Optional[List[Dict]] = None, beam: int = 4, progress: bool = True,
                    replay: bool = True) -> Dict:
    """Mask every head of every site in turn: the ``importance.json`` payload less the run's metadata.

    All passes, the unmasked reference NLL/BLEU included, run inside one :func:`observe` block, i.e. on the
    path where head masks apply, so the differences are due to the mask alone. With ``replay`` the NLL
    passes reuse the unmasked outputs of the layers below the masked module.
    """
    layers = LayerReplay(model)
    with observe(sites) as seen:
        with layers.recording():
            base_nll = mean_nll(model, batches, pad)
        base_bleu = corpus_bleu(model, task, bleu_batches, beam) if bleu_batches is not None else None
        heads = []
        jobs = [(site, h) for site in sites for h in range(site.num_heads)]
        for site, head in tqdm(jobs, desc="ablation", unit="head", disable=None if progress else True):
            seen.mask_head(site, head)
            # the layers a mask on ``site`` cannot change: all below it (the whole encoder for a decoder-side site)
            below = {"encoder": site.layer} if site.attention_type == "enc_self" else \
                {"encoder": len(model.encoder.layers), "decoder": site.layer}
            with layers.replaying(below if replay else {}):
                nll = mean_nll(model, batches, pad)
            bleu = corpus_bleu(model, task, bleu_batches, beam) if bleu_batches is not None else None
            heads.append({"attention_type": site.attention_type, "layer": site.layer + 1, "head": head + 1,
                          "nll": nll, "delta_nll": nll - base_nll,  # positive: the head helps
                          "bleu": bleu, "delta_bleu": None if bleu is None else base_bleu - bleu})
    deltas = [h["delta_nll"] for h in heads]
    return {"method": METHOD, "base_nll": base_nll, "base_bleu": base_bleu,
            "bleu_sentences": None if bleu_batches is None else sum(b["target"].size(0) for b in bleu_batches),
            "summary": {"heads": len(deltas), "mean_delta_nll": statistics.fmean(deltas), "max_delta_nll": max(deltas),
                        "min_delta_nll": min(deltas), "heads_improving_when_masked": sum(d < 0 for d in deltas)},
            "heads": heads}
