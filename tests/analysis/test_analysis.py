"""Head-diversity analysis (``python -m diverse_fairseq.analyze``): scores against hand-computed values,
head masking against a manual computation, the pictures, and end-to-end runs on tiny checkpoints."""

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import linked_prepared
from fairseq.modules.multihead_attention import MultiheadAttention
from PIL import Image
from torch import nn

from diverse_fairseq.analysis import plots
from diverse_fairseq.analysis.scores import (
    ScoreAccumulator,
    combine_layers,
    output_score,
    pair_cosines,
    position_score,
    sentence_position_overlap,
    subspace_score,
)
from diverse_fairseq.methods.attention import DiverseMultiheadAttention
from diverse_fairseq.methods.disagreement.similarity import output_similarity, subspace_similarity
from diverse_fairseq.methods.sites import AttentionSite, observe

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------- scores


def _pairs_loop(x, pad=None):
    """Reference: per token (1/H²) Σ_i Σ_j cos and mean_{i≠j} cos by a double loop over head pairs, then the
    mean over the non-padding tokens."""
    heads = x.size(1)
    unit = [F.normalize(x[:, i].double(), dim=-1, eps=1e-6) for i in range(heads)]  # H x [B, N, d]
    total, offdiag = torch.zeros(x.size(0), x.size(2), dtype=torch.float64), 0.0
    for i in range(heads):
        for j in range(heads):
            cos = (unit[i] * unit[j]).sum(-1)  # [B, N]
            total = total + cos
            offdiag = offdiag + (cos if i != j else 0.0)
    keep = torch.ones_like(total, dtype=torch.bool) if pad is None else ~pad
    return float((total / heads**2)[keep].mean()), float((offdiag / (heads * (heads - 1)))[keep].mean())


@pytest.mark.parametrize("heads", [4, 8])
def test_orthogonal_heads_score_exp_minus_one_over_h(heads):
    """The paper's baseline 0.882 = exp(−1/8): mutually orthogonal heads, each paired with itself too."""
    o = torch.eye(heads).mul(3.0).view(1, heads, 1, heads).expand(3, heads, 6, heads).contiguous()  # head i = 3·e_i
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, 4:] = True
    assert output_score(o, pad) == pytest.approx(math.exp(-1 / heads), abs=1e-12)
    assert subspace_score(o) == pytest.approx(math.exp(-1 / heads), abs=1e-12)
    assert pair_cosines(o)[0].numpy() == pytest.approx(np.full((3, 6), 1 / heads), abs=1e-12)
    assert pair_cosines(o)[1].numpy() == pytest.approx(np.zeros((3, 6)), abs=1e-12)
    if heads == 8:
        assert f"{output_score(o):.3f}" == "0.882"


def test_identical_heads_score_e_to_minus_one():
    v = torch.randn(2, 1, 5, 8).expand(2, 4, 5, 8).contiguous()  # every head the same vector
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    assert subspace_score(v) == pytest.approx(math.exp(-1), abs=1e-9)
    assert output_score(v, pad) == pytest.approx(math.exp(-1), abs=1e-9)
    assert pair_cosines(v)[1].numpy() == pytest.approx(np.ones((2, 5)), abs=1e-12)


@pytest.mark.parametrize("heads", [2, 4])
def test_cancelling_heads_score_one(heads):
    """The maximum 1.0 needs the unit head vectors to sum to zero (here ±x, and 4 heads ±x, ±y)."""
    x, y = torch.randn(2, 1, 3, 5), torch.randn(2, 1, 3, 5)
    o = torch.cat([x, -x] if heads == 2 else [x, -x, 2 * y, -y], dim=1)
    assert output_score(o) == pytest.approx(1.0, abs=1e-12)
    assert subspace_score(o) == pytest.approx(1.0, abs=1e-12)
    assert float(pair_cosines(o)[1].mean()) == pytest.approx(-1 / (heads - 1), abs=1e-12)  # its lower bound


def test_zero_vectors_give_no_nan():
    o = torch.zeros(1, 3, 2, 4)
    o[0, 0] = 1.0  # head 1 nonzero, heads 2 and 3 zero: only cos(x_1, x_1) = 1 is nonzero among 9 pairs
    assert output_score(o) == pytest.approx(math.exp(-1 / 9))
    assert float(pair_cosines(o)[1].mean()) == 0.0


def test_scores_match_a_double_loop_over_head_pairs():
    torch.manual_seed(0)
    v = torch.randn(3, 5, 7, 6) + 0.7  # correlated heads, H = 5
    pad = torch.arange(7).unsqueeze(0) >= torch.tensor([[7], [4], [2]])
    all_pairs, offdiag = _pairs_loop(v, pad)
    assert subspace_score(v, pad) == pytest.approx(math.exp(-all_pairs), rel=1e-12)
    assert output_score(v, pad) == pytest.approx(math.exp(-all_pairs), rel=1e-12)
    assert float(pair_cosines(v)[1][~pad].mean()) == pytest.approx(offdiag, rel=1e-12)
    assert subspace_score(v) == pytest.approx(math.exp(-_pairs_loop(v)[0]), rel=1e-12)
    # the padded tokens matter: without the mask the score differs
    assert subspace_score(v) != pytest.approx(subspace_score(v, pad), rel=1e-6)


def test_scores_use_the_training_similarity():
    """The reported score is exp(−similarity) with the similarity training minimises
    (methods/disagreement/similarity.py)."""
    torch.manual_seed(0)
    v = torch.randn(3, 5, 7, 6) + 0.7
    pad = torch.arange(7).unsqueeze(0) >= torch.tensor([[7], [4], [2]])
    assert -math.log(subspace_score(v, pad)) == pytest.approx(subspace_similarity(v, pad).item(), rel=1e-5)
    assert -math.log(output_score(v, pad)) == pytest.approx(output_similarity(v, pad).item(), rel=1e-5)


def test_position_score_hand_computed():
    # sentence 1 (H=2, T=2, S=2): A1 = [[1,0],[.5,.5]], A2 = [[0,1],[.5,.5]]
    #   (1/4)(ΣA1² + ΣA2² + 2ΣA1A2) = (1.5 + 1.5 + 2·0.5)/4 = 1.0
    # sentence 2: only query 1 is real; both heads [.5,.5] there: (1/4)·(1² + 1²) = 0.5; query 2 is padding
    a = torch.tensor([
        [[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]],
        [[[0.5, 0.5], [1.0, 0.0]], [[0.5, 0.5], [1.0, 0.0]]],
    ])  # [B=2, H=2, T=2, S=2]
    query_pad = torch.tensor([[False, False], [False, True]])
    assert sentence_position_overlap(a, query_pad).tolist() == pytest.approx([1.0, 0.5])
    # per-sentence exp, then the mean over sentences (not exp of the mean overlap)
    assert position_score(a, query_pad) == pytest.approx((math.exp(-1.0) + math.exp(-0.5)) / 2)


def test_position_score_sums_over_query_tokens():
    """Heads attending alike to one position: overlap 1 per query, T per sentence (why the paper gets 0.007)."""
    a = torch.zeros(1, 4, 5, 5)
    a[..., 2] = 1.0
    assert position_score(a) == pytest.approx(math.exp(-5.0))


def test_position_score_matches_a_loop():
    """Per sentence exp(−(1/H²) Σ_i Σ_j Σ_{t,s} A_i A_j) over its real queries, by loops; mean over sentences."""
    torch.manual_seed(2)
    heads = 3
    a = torch.randn(3, heads, 4, 5).softmax(-1)
    query_pad = torch.arange(4).unsqueeze(0) >= torch.tensor([[4], [2], [1]])
    expected = []
    for b in range(a.size(0)):
        overlap = 0.0
        for t in range(a.size(2)):
            if query_pad[b, t]:
                continue
            for i in range(heads):
                for j in range(heads):
                    overlap += float((a[b, i, t].double() * a[b, j, t].double()).sum())
        expected.append(math.exp(-overlap / heads**2))
    assert position_score(a, query_pad) == pytest.approx(sum(expected) / len(expected), rel=1e-12)
    assert torch.exp(-sentence_position_overlap(a, query_pad)).tolist() == pytest.approx(expected, rel=1e-12)


def test_accumulator_is_a_token_mean_over_the_whole_set():
    torch.manual_seed(1)
    v1, v2 = torch.randn(2, 4, 6, 3), torch.randn(3, 4, 2, 3)
    pad1 = torch.arange(6).unsqueeze(0) >= torch.tensor([[6], [1]])
    pad2 = torch.zeros(3, 2, dtype=torch.bool)
    a1, a2 = torch.randn(2, 4, 6, 6).softmax(-1), torch.randn(3, 4, 2, 2).softmax(-1)
    acc = ScoreAccumulator()
    acc.update({"v": v1, "o": v1, "a": a1}, key_pad=pad1, query_pad=pad1)
    acc.update({"v": v2, "o": v2, "a": a2}, key_pad=pad2, query_pad=pad2)
    tokens = torch.cat([pair_cosines(v1)[0][~pad1], pair_cosines(v2)[0][~pad2]])  # 7 + 6 tokens
    assert acc.scores()["sub"] == pytest.approx(math.exp(-float(tokens.mean())))
    assert acc.scores()["out"] == pytest.approx(math.exp(-float(tokens.mean())))
    assert acc.similarities()["sub"] == pytest.approx(float(tokens.mean()))
    offdiag = torch.cat([pair_cosines(v1)[1][~pad1], pair_cosines(v2)[1][~pad2]])
    assert acc.offdiag() == pytest.approx({"sub": float(offdiag.mean()), "out": float(offdiag.mean())})
    # the two figures are tied for nonzero vectors: all pairs = 1/H + (H−1)/H · off-diagonal
    assert acc.similarities()["out"] == pytest.approx(1 / 4 + 3 / 4 * acc.offdiag()["out"])
    sentences = torch.cat([sentence_position_overlap(a1, pad1), sentence_position_overlap(a2, pad2)])
    assert acc.scores()["pos"] == pytest.approx(float(torch.exp(-sentences).mean()))


def test_layer_combination_reproduces_paper_table4_from_table5():
    """EMNLP 2018: Table 5 baseline positions per encoder layer -> Table 4's 0.007 (and Pos. row -> 0.219)."""
    baseline = [{"pos": p} for p in (0.040, 0.009, 0.002, 0.003, 0.008, 0.006)]
    regularized = [{"pos": p} for p in (0.217, 0.167, 0.219, 0.242, 0.233, 0.249)]
    assert combine_layers(baseline)["pos"] == pytest.approx(0.007, abs=5e-4)
    assert combine_layers(regularized)["pos"] == pytest.approx(0.219, abs=5e-4)
    sims = [0.1, 0.3]
    assert combine_layers([{"out": math.exp(-s)} for s in sims])["out"] == pytest.approx(math.exp(-0.2))
    layers = [{"out": 0.8, "offdiag_cos": {"sub": 0.2, "out": 0.1}},
              {"out": 0.9, "offdiag_cos": {"sub": 0.4, "out": None}}]
    assert combine_layers(layers)["offdiag_cos"] == pytest.approx({"sub": 0.3, "out": 0.1})


# ------------------------------------------------------------------------------------------- head masking

E, H, T, S, B = 16, 4, 5, 7, 3


def _manual_attention(mha, query, key, key_pad, head, aggregator=None):
    """Reference: projections, per-head softmax(QKᵀ/√d)V, head ``head`` zeroed, concat, out_proj."""
    d = E // H
    q = F.linear(query, mha.q_proj.weight, mha.q_proj.bias) * d**-0.5  # [T, B, E]
    k = F.linear(key, mha.k_proj.weight, mha.k_proj.bias)  # [S, B, E]
    v = F.linear(key, mha.v_proj.weight, mha.v_proj.bias)
    outs = []
    for h in range(H):  # plain loops on purpose: an independent computation
        sl = slice(h * d, (h + 1) * d)
        logits = torch.einsum("tbd,sbd->bts", q[..., sl], k[..., sl])
        logits = logits.masked_fill(key_pad.unsqueeze(1), float("-inf"))
        o = torch.einsum("bts,sbd->tbd", logits.softmax(-1), v[..., sl])
        outs.append(torch.zeros_like(o) if h == head else o)
    concat = torch.cat(outs, dim=-1)  # [T, B, E]
    return aggregator(concat) if aggregator is not None else mha.out_proj(concat)


class _Squash(nn.Module):
    """A custom head combination: tanh of a linear map (takes the padding mask like a routing aggregator)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(E, E)

    def forward(self, x, padding_mask=None):
        return torch.tanh(self.fc(x))


def _module(kind):
    torch.manual_seed(3)
    if kind == "stock_self":
        return MultiheadAttention(E, H, self_attention=True), None
    if kind == "stock_cross":
        return MultiheadAttention(E, H, encoder_decoder_attention=True), None
    if kind == "diverse_self":
        return DiverseMultiheadAttention(E, H, self_attention=True), None
    aggregator = _Squash()
    return DiverseMultiheadAttention(E, H, self_attention=True, aggregator=aggregator), aggregator


def _observable(mha):
    """What the analysis does with a stock model (analysis.loading.as_diverse): the same weights in a
    DiverseMultiheadAttention."""
    if isinstance(mha, DiverseMultiheadAttention):
        return mha
    kind = dict(self_attention=True) if mha.self_attention else dict(encoder_decoder_attention=True)
    ours = DiverseMultiheadAttention(E, H, **kind)
    ours.load_state_dict(mha.state_dict(), strict=True)
    return ours.train(mha.training)


@pytest.mark.parametrize("kind", ["stock_self", "stock_cross", "diverse_self", "diverse_aggregator"])
def test_masking_a_head_matches_manual_computation(kind):
    mha, aggregator = _module(kind)
    mha.eval()
    torch.manual_seed(4)
    query = torch.randn(T, B, E)
    key = query if "self" in kind or "aggregator" in kind else torch.randn(S, B, E)
    key_pad = torch.arange(key.size(0)).unsqueeze(0) >= torch.tensor([[key.size(0)], [3], [5]])
    with torch.no_grad():
        unmasked_stock, _ = mha(query, key, key, key_padding_mask=key_pad, need_weights=False)
        ours = _observable(mha)
        site = AttentionSite("enc_self", 0, ours)
        with observe([site]) as seen:
            unmasked, _ = ours(query, key, key, key_padding_mask=key_pad, need_weights=False)
            for head in range(H):
                seen.mask_head(site, head)
                masked, _ = ours(query, key, key, key_padding_mask=key_pad, need_weights=False)
                expected = _manual_attention(ours, query, key, key_pad, head, aggregator)
                torch.testing.assert_close(masked, expected, atol=1e-5, rtol=1e-5)
                assert not torch.allclose(masked, unmasked, atol=1e-4)
            seen.mask_head(None)
            again, _ = ours(query, key, key, key_padding_mask=key_pad, need_weights=False)
        torch.testing.assert_close(unmasked, unmasked_stock, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(again, unmasked_stock, atol=1e-5, rtol=1e-5)
        # after the block: nothing left on the module, same behaviour
        assert ours.observer is None
        if aggregator is not None:
            assert ours.aggregator is aggregator
        after, _ = ours(query, key, key, key_padding_mask=key_pad, need_weights=False)
        torch.testing.assert_close(after, unmasked_stock, atol=0, rtol=0)


def test_observe_restores_after_an_exception_and_refuses_stock_modules():
    mha = DiverseMultiheadAttention(E, H, self_attention=True)
    with pytest.raises(RuntimeError, match="boom"):
        with observe([AttentionSite("enc_self", 0, mha)], {"o"}):
            assert mha.observer is not None
            raise RuntimeError("boom")
    assert mha.observer is None
    with pytest.raises(ValueError, match="expose their heads"):
        with observe([AttentionSite("enc_self", 0, MultiheadAttention(E, H, self_attention=True))], {"o"}):
            pass


def test_observed_taps_match_shapes():
    mha = _observable(MultiheadAttention(E, H, encoder_decoder_attention=True).eval())
    site = AttentionSite("enc_dec", 0, mha)
    with torch.no_grad(), observe([site], {"v", "a", "o"}) as seen:
        mha(torch.randn(T, B, E), torch.randn(S, B, E), None)
    tapped = seen.heads(site)
    assert tapped["v"].shape == (B, H, S, E // H)
    assert tapped["a"].shape == (B, H, T, S)
    assert tapped["o"].shape == (B, H, T, E // H)
    torch.testing.assert_close(tapped["a"].sum(-1), torch.ones(B, H, T))


# ------------------------------------------------------------------------------------------- pictures


def assert_png(path, min_side=200, max_side=6000):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        width, height = img.size
        pixels = np.asarray(img.convert("L"), dtype=float)
    assert min_side <= width <= max_side and min_side <= height <= max_side, (path, width, height)
    assert pixels.std() > 1.0, f"{path} looks blank"


def test_plots_write_valid_pngs(tmp_path):
    rng = np.random.default_rng(0)
    maps = {layer: rng.dirichlet(np.ones(6), size=(4, 5)) for layer in range(2)}  # [H, T, S]
    plots.plot_attention_heatmaps(maps, [f"t{i}" for i in range(5)], [f"s{i}" for i in range(6)], "heatmaps",
                                  tmp_path / "heat.png")
    panels = {"enc_self": {"layer 1": rng.normal(size=(4, 8)), "layer 2": rng.normal(size=(4, 8))}}
    plots.plot_tsne(panels, tmp_path / "tsne.png", seed=1, title="tsne")
    layers = {"enc_self": [{"sub": 0.8, "pos": 0.01, "out": 0.9}, {"sub": 0.85, "pos": 0.005, "out": 0.95}]}
    plots.plot_layer_scores({"a": layers, "b": layers}, tmp_path / "layers.png", "layers")
    plots.plot_importance_histogram({"a": rng.normal(size=24), "b": rng.normal(size=24)}, tmp_path / "hist.png", "h")
    plots.plot_importance_grid({"enc_self": rng.normal(size=(2, 4))}, tmp_path / "grid.png", "grid")
    for name in ("heat", "tsne", "layers", "hist", "grid"):
        assert_png(tmp_path / f"{name}.png")


def test_tsne_is_deterministic_for_a_seed():
    points = np.random.default_rng(0).normal(size=(12, 16))
    first, second = plots._tsne(points, seed=7), plots._tsne(points, seed=7)
    assert first.shape == (12, 2)
    np.testing.assert_array_equal(first, second)


# ------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_analyze_cli_end_to_end(tiny_checkpoints, tmp_path):
    out = tmp_path / "analysis"
    cmd = [sys.executable, "-m", "diverse_fairseq.analyze", tiny_checkpoints["transformer"],
           tiny_checkpoints["diverse_transformer"], "--out", out, "--max-sentences", "40", "--seed", "3", "--cpu"]
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env=dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    # output redirected: no progress bars (carriage returns), no fairseq user-dir line, fairseq's log format
    assert "\r" not in proc.stderr and "has already been imported" not in proc.stderr, proc.stderr[-4000:]
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| INFO \| diverse_fairseq", proc.stderr, re.M), proc.stderr
    assert "Head-diversity comparison" in proc.stdout
    for label in ("transformer", "diverse_transformer"):
        d = out / label
        scores = json.loads((d / "scores.json").read_text())
        assert scores["arch"] == label and scores["sentences"] == 40
        assert set(scores["by_type"]) == {"enc_self", "dec_self", "enc_dec"}
        for atype, layers in scores["by_layer"].items():
            assert [e["layer"] for e in layers] == [1, 2]
            for e in layers:
                assert 0.0 < e["pos"] <= 1.0
                for name in ("sub", "out"):  # between identical heads (e^-1) and cancelling ones (1.0)
                    assert math.exp(-1) - 1e-9 <= e[name] <= 1.0 + 1e-9
                    # the two figures agree: exp(−(1/H + (H−1)/H · off-diagonal cosine)), H = 4
                    assert e[name] == pytest.approx(math.exp(-(1 / 4 + 3 / 4 * e["offdiag_cos"][name])), rel=1e-5)
            combined = combine_layers(layers)
            assert {k: scores["by_type"][atype][k] for k in ("sub", "pos", "out")} == pytest.approx(
                {k: combined[k] for k in ("sub", "pos", "out")})
            assert scores["by_type"][atype]["offdiag_cos"] == pytest.approx(combined["offdiag_cos"])
        importance = json.loads((d / "importance.json").read_text())
        assert len(importance["heads"]) == 3 * 2 * 4
        assert importance["base_nll"] == pytest.approx(scores["nll"], rel=1e-4)
        assert any(abs(h["delta_nll"]) > 1e-6 for h in importance["heads"])
        markdown = (d / "scores.md").read_text()
        assert "| enc_self |" in markdown and "Head importance" in markdown
        assert "exp(−mean over all H² head pairs, self-pairs included)" in markdown and "mean cos i≠j" in markdown
        for png in ("attention_enc_self", "attention_dec_self", "attention_enc_dec", "tsne", "layer_scores",
                    "importance_hist", "importance_grid"):
            assert_png(d / f"{png}.png")
    compare = (out / "compare.md").read_text()
    assert "| transformer |" in compare and "| diverse_transformer |" in compare
    for png in ("tsne", "layer_scores", "importance_hist"):
        assert_png(out / f"{png}.png")


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["transformer", "diverse_transformer"])
def test_ablation_with_replayed_layers_equals_full_recomputation(tiny_checkpoints, tiny_data, arch):
    """Reusing the unmasked outputs of the layers below a masked head changes nothing; masking changes the NLL."""
    from diverse_fairseq.analysis.ablation import head_importance
    from diverse_fairseq.analysis.loading import load_batches, load_checkpoint
    from diverse_fairseq.methods.sites import attention_sites

    loaded = load_checkpoint(str(tiny_checkpoints[arch]), str(tiny_data))
    pad = loaded.task.target_dictionary.pad()
    batches = load_batches(loaded.task, "valid", 12, max_tokens=60)
    assert len(batches) > 1
    sites = attention_sites(loaded.model)
    assert [(s.attention_type, s.layer) for s in sites] == [
        ("enc_self", 0), ("enc_self", 1), ("dec_self", 0), ("dec_self", 1), ("enc_dec", 0), ("enc_dec", 1)]
    fast = head_importance(loaded.model, loaded.task, sites, batches, pad, progress=False, replay=True)
    slow = head_importance(loaded.model, loaded.task, sites, batches, pad, progress=False, replay=False)
    assert fast["base_nll"] == slow["base_nll"]
    assert [h["nll"] for h in fast["heads"]] == pytest.approx([h["nll"] for h in slow["heads"]], rel=1e-6)
    assert all(abs(h["delta_nll"]) > 0 for h in fast["heads"])
    assert len(loaded.model.encoder.layers) == 2 and all(
        type(layer).__name__ != "_Replayed" for layer in [*loaded.model.encoder.layers, *loaded.model.decoder.layers])


@pytest.mark.slow
def test_score_checkpoint_equals_the_full_pass(tiny_checkpoints, tiny_data):
    """The scores-only pass (no output projection, no NLL, its own batching) gives the analysis' scores."""
    from diverse_fairseq.analysis.loading import load_batches, load_checkpoint
    from diverse_fairseq.analysis.pipeline import Options, collect, score_checkpoint
    from diverse_fairseq.methods.sites import attention_sites

    ckpt = str(tiny_checkpoints["diverse_transformer"])
    fast = score_checkpoint(ckpt, Options(data=str(tiny_data), max_sentences=None, max_tokens=300, progress=False))
    loaded = load_checkpoint(ckpt, str(tiny_data))
    sites = attention_sites(loaded.model)
    full, _ = collect(loaded.model, sites, load_batches(loaded.task, "valid", None, 4096),
                      loaded.task.target_dictionary.pad(), progress=False)
    assert fast["nll"] is None and full["nll"] > 0
    assert fast["sentences"] == full["sentences"] == 60 and fast["max_sentences"] is None
    for atype, layers in full["by_layer"].items():
        for quick, slow in zip(fast["by_layer"][atype], layers, strict=True):
            assert {k: quick[k] for k in ("sub", "pos", "out")} == pytest.approx(
                {k: slow[k] for k in ("sub", "pos", "out")}, rel=1e-5)


@pytest.mark.slow
def test_table_runner_scores_the_whole_set_per_layer_and_caches(tiny_checkpoints, tiny_data, tmp_path, capsys):
    from diverse_fairseq.tables.config import RunConfig
    from diverse_fairseq.tables.job import make_job
    from diverse_fairseq.tables.spec import Row
    from diverse_fairseq.tables.steps import disagreement_scores

    run = RunConfig(dataset="toy", scale="demo", seeds=[1], gpus=0, out_dir=tmp_path,
                    data_bin=linked_prepared(tiny_data, tmp_path / "data-bin"))
    row = Row(id="dis", label="+ Disagreement", family="diverse_transformer")
    ckpt, job = tiny_checkpoints["diverse_transformer"], make_job("t", row, run, 1)
    scores = disagreement_scores(job, ckpt)
    assert "head-diversity scores of 60 sentences" in capsys.readouterr().out  # the whole validation set
    assert set(scores) == {"enc_self", "dec_self", "enc_dec"}
    for atype, per_type in scores.items():
        assert [e["layer"] for e in per_type["layers"]] == [1, 2]
        assert per_type["out"] == pytest.approx(combine_layers(per_type["layers"])["out"])
        assert math.exp(-1) <= per_type["sub"] <= 1.0 and set(per_type["offdiag_cos"]) == {"sub", "out"}
    cache = run.run_dir(row, 1) / "analysis" / "disagreement.json"
    assert disagreement_scores(job, ckpt) == scores and "head-diversity" not in capsys.readouterr().out
    stale = json.loads(cache.read_text())
    stale["scale"] = "off-diagonal"  # a cache written on another scale is measured again
    cache.write_text(json.dumps(stale))
    assert disagreement_scores(job, ckpt) == scores and "head-diversity" in capsys.readouterr().out
