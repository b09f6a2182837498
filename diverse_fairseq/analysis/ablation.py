"""Head importance by ablation at test time (Michel, Levy, Neubig 2019, "Are Sixteen Heads Really Better than
One?"; An et al., EMNLP 2020, Figure 2 "Distribution of heads by performance drop after masking at test time").

Each head of each attention module is masked in turn by zeroing its output O_h before the heads are combined
(the head mask of :func:`diverse_fairseq.methods.sites.observe`), and the set is scored again: a head's
importance is the **increase** of the teacher-forced token NLL (nats per target token; negative: the model got
better without it) and, optionally, the **drop** of beam-search BLEU. For the NLL the layers below the masked
module are replayed from the unmasked pass (:class:`LayerReplay`; they cannot depend on the mask), which
roughly halves the cost.
"""

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence

import torch
from torch import nn
from tqdm import tqdm

from diverse_fairseq.methods.sites import AttentionSite, observe

from .collect import batch_nll


@dataclass
class HeadImportance:
    attention_type: str
    layer: int  # 0-based
    head: int  # 0-based
    nll: float
    delta_nll: float  # masked − unmasked (positive: the head helps)
    bleu: Optional[float] = None
    delta_bleu: Optional[float] = None  # unmasked − masked (positive: the head helps)

    def as_dict(self) -> Dict:
        """For ``importance.json``: layer and head numbered from 1."""
        return {**asdict(self), "layer": self.layer + 1, "head": self.head + 1}


@dataclass
class Importance:
    base_nll: float
    heads: List[HeadImportance] = field(default_factory=list)
    base_bleu: Optional[float] = None
    bleu_sentences: Optional[int] = None


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
        self.outputs = {(name, j): [] for name, layers in self.stacks.items() for j in range(len(layers))}

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        for recorded in self.outputs.values():
            recorded.clear()
        handles = [layer.register_forward_hook(lambda module, inputs, output, key=(name, j):
                                               self.outputs[key].append(output))
                   for name, layers in self.stacks.items() for j, layer in enumerate(layers)]
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
                    layers[j] = _Replayed(self.outputs[(name, j)])
            yield
        finally:
            for layers, j, layer in reversed(originals):
                layers[j] = layer


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
                    replay: bool = True) -> Importance:
    """Mask every head of every site in turn.

    All passes, the unmasked reference NLL/BLEU included, run inside one :func:`observe` block, i.e. on the
    path where head masks apply, so the differences are due to the mask alone. With ``replay`` the NLL
    passes reuse the unmasked outputs of the layers below the masked module.
    """
    layers = LayerReplay(model) if replay else None
    with observe(sites) as seen:
        with layers.recording() if replay else contextlib.nullcontext():
            result = Importance(base_nll=mean_nll(model, batches, pad))
        if bleu_batches is not None:
            result.base_bleu = corpus_bleu(model, task, bleu_batches, beam)
            result.bleu_sentences = sum(b["target"].size(0) for b in bleu_batches)
        jobs = [(site, h) for site in sites for h in range(site.num_heads)]
        for site, head in tqdm(jobs, desc="ablation", unit="head", disable=not progress):
            seen.mask_head(site, head)
            # the layers a mask on ``site`` cannot change: all below it (the whole encoder for a decoder-side site)
            below = {"encoder": site.layer} if site.attention_type == "enc_self" else \
                {"encoder": len(model.encoder.layers), "decoder": site.layer}
            with layers.replaying(below) if replay else contextlib.nullcontext():
                nll = mean_nll(model, batches, pad)
            entry = HeadImportance(site.attention_type, site.layer, head, nll, nll - result.base_nll)
            if bleu_batches is not None:
                entry.bleu = corpus_bleu(model, task, bleu_batches, beam)
                entry.delta_bleu = result.base_bleu - entry.bleu
            result.heads.append(entry)
    return result
