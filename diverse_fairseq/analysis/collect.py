"""Teacher-forced passes over the reference (one forward per batch, every attention module tapped): the
disagreement scores (:class:`~.scores.ScoreAccumulator`), each head's output averaged over the non-padding query
tokens (the "head representations" of the journal version's Figure 3 t-SNE), the token NLL, attention maps."""

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from tqdm import tqdm

from diverse_fairseq.methods.sites import AttentionSite, observe

from .scores import TOKEN_SIDE, ScoreAccumulator


def batch_nll(model, sample: Dict, net_output, pad: int) -> Tuple[float, int]:
    """Summed token NLL (nats) of the reference under teacher forcing, and the number of target tokens."""
    lprobs = model.get_normalized_probs(net_output, log_probs=True)  # [B, T, V]
    target = sample["target"]
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [B, T]
    keep = target.ne(pad)
    return float(nll[keep].double().sum()), int(keep.sum())


@dataclass
class Collected:
    scores: Dict[Tuple[str, int], ScoreAccumulator]
    head_means: Dict[Tuple[str, int], Tensor]  # (type, layer) -> [H, d] mean head output over query tokens
    nll: Optional[float]  # mean over target tokens, nats (None when not computed)
    sentences: int
    source_tokens: int
    target_tokens: int


@torch.no_grad()
def collect(model, sites: Sequence[AttentionSite], batches: List[Dict], pad: int, progress: bool = True,
            nll: bool = True) -> Collected:
    """Scores, mean head outputs and NLL over ``batches``.

    ``nll=False`` skips the NLL and the decoder's output projection (``features_only``), which is most of
    the cost of a pass that only wants the scores."""
    scores = {(s.attention_type, s.layer): ScoreAccumulator() for s in sites}
    out_sums: Dict[Tuple[str, int], Tensor] = {}
    out_counts: Dict[Tuple[str, int], int] = {}
    nll_sum, sentences, src_tokens, tgt_tokens = 0.0, 0, 0, 0
    for sample in tqdm(batches, desc="scores", unit="batch", disable=not progress, leave=False):
        with observe(sites, {"v", "a", "o"}) as seen:
            net_output = model(**sample["net_input"], features_only=not nll)
        # True at padding (fairseq left-pads sources: any side works)
        masks = {"source": sample["net_input"]["src_tokens"].eq(pad), "target": sample["target"].eq(pad)}
        for site in sites:
            key, side = site.key, TOKEN_SIDE[site.attention_type]
            tapped = seen.heads(site)
            scores[key].update(tapped, key_pad=masks[side["sub"]], query_pad=masks[side["out"]])
            o = tapped["o"].double()  # [B, H, T, d]
            keep = (~masks[side["out"]]).to(o.dtype)  # [B, T]
            out_sums[key] = out_sums.get(key, 0.0) + torch.einsum("bhtd,bt->hd", o, keep)  # [H, d]
            out_counts[key] = out_counts.get(key, 0) + int(keep.sum())
        if nll:
            nll_sum += batch_nll(model, sample, net_output, pad)[0]
        tgt_tokens += int((~masks["target"]).sum())
        src_tokens += int((~masks["source"]).sum())
        sentences += sample["target"].size(0)
    head_means = {key: (out_sums[key] / max(out_counts[key], 1)).float().cpu() for key in out_sums}
    return Collected(scores, head_means, nll_sum / max(tgt_tokens, 1) if nll else None, sentences, src_tokens,
                     tgt_tokens)


@torch.no_grad()
def attention_maps(model, sites: Sequence[AttentionSite], sample: Dict) -> Dict[Tuple[str, int], Tensor]:
    """Attention probabilities of every head for a batch of one sentence: ``(type, layer) -> [H, T, S]``."""
    with observe(sites, {"a"}) as seen:
        model(**sample["net_input"])
    return {s.key: seen.heads(s)["a"][0].float().cpu() for s in sites}
