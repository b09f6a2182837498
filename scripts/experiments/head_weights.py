"""Per-head size of the Q/K/V weights of fairseq checkpoints (docs/demo-findings.md, section 2).

    .venv/bin/python scripts/experiments/head_weights.py CHECKPOINT [CHECKPOINT ...]

For every checkpoint, averaged over the attention modules (every ``*.q_proj/k_proj/v_proj.weight``, [E, E],
head h = rows h·d..(h+1)·d): the norm of a head's row block, the median distance between the row blocks of one
projection, and the spectral norm of each head's bilinear form W_Q,hᵀ W_K,h (the largest gain from a pair of
unit inputs to the attention logit, before the 1/√d scaling).
"""

import re
import sys

import torch


def head_weights(path: str) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=False)
    cfg = state["cfg"]["model"]
    sd = state["model"]
    norms, dists, gains = {"q": [], "k": [], "v": []}, {"q": [], "k": [], "v": []}, []
    for name, w in sd.items():
        m = re.search(r"(?:self_attn|encoder_attn)\.([qkv])_proj\.weight$", name)
        if not m:
            continue
        heads = cfg.decoder_attention_heads if name.startswith("decoder") else cfg.encoder_attention_heads
        blocks = w.float().view(heads, -1)  # [H, d·E]
        norms[m.group(1)].append(blocks.norm(dim=1).mean().item())
        dists[m.group(1)].append(torch.pdist(blocks).median().item())
        if m.group(1) == "q":
            wq = w.float().view(heads, -1, w.shape[1])  # [H, d, E]
            wk = sd[name.replace("q_proj", "k_proj")].float().view(heads, -1, w.shape[1])
            gains += torch.linalg.matrix_norm(wq.transpose(1, 2) @ wk, ord=2).tolist()  # [H]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"head_norm": {p: mean(v) for p, v in norms.items()},
            "median_head_distance": {p: mean(v) for p, v in dists.items()},
            "qk_gain": mean(gains)}


if __name__ == "__main__":
    for path in sys.argv[1:]:
        r = head_weights(path)
        norm = "/".join(f"{r['head_norm'][p]:.2f}" for p in "qkv")
        dist = "/".join(f"{r['median_head_distance'][p]:.2f}" for p in "qkv")
        print(f"{path}\n  head norm q/k/v {norm}  median head distance q/k/v {dist}  "
              f"||W_Q,h^T W_K,h||_2 {r['qk_gain']:.2f}")
