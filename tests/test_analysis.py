"""Head-diversity analysis (``python -m diverse_fairseq.analyze``): scores against hand-computed values,
head masking against a manual computation, the pictures, and end-to-end runs on tiny checkpoints."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from fairseq.modules.multihead_attention import MultiheadAttention
from torch import nn

from conftest import run_cli, tiny_train_args
from diverse_fairseq.analysis import plots
from diverse_fairseq.analysis.attention import AttentionSite, instrument, set_head_mask, set_taps
from diverse_fairseq.analysis.scores import (
    ScoreAccumulator,
    combine_layers,
    offdiag_cosine,
    output_score,
    position_score,
    sentence_position_overlap,
    subspace_score,
)
from diverse_fairseq.disagreement import subspace_similarity
from diverse_fairseq.modules.diverse_attention import DiverseMultiheadAttention

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------- scores


def test_identical_heads_score_e_to_minus_one():
    v = torch.randn(2, 1, 5, 8).expand(2, 4, 5, 8).contiguous()  # every head the same vector
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    assert subspace_score(v) == pytest.approx(math.exp(-1), abs=1e-9)
    assert output_score(v, pad) == pytest.approx(math.exp(-1), abs=1e-9)
    assert offdiag_cosine(v).numpy() == pytest.approx(np.ones((2, 5)), abs=1e-12)


def test_orthogonal_heads_score_one():
    o = torch.eye(4).mul(3.0).view(1, 4, 1, 4).expand(3, 4, 6, 4).contiguous()  # head i = 3·e_i
    assert output_score(o) == pytest.approx(1.0, abs=1e-12)
    assert subspace_score(o) == pytest.approx(1.0, abs=1e-12)


def test_anticorrelated_heads_exceed_one_up_to_the_bound():
    x = torch.randn(1, 1, 3, 5)
    o = torch.cat([x, -x], dim=1)  # H = 2, cos = -1: the largest possible score e^(1/(H-1)) = e
    assert output_score(o) == pytest.approx(math.e, rel=1e-9)


def test_zero_vectors_give_no_nan():
    o = torch.zeros(1, 3, 2, 4)
    o[0, 0] = 1.0  # head 1 nonzero, heads 2 and 3 zero: every cosine 0
    assert output_score(o) == pytest.approx(1.0)


def test_offdiagonal_matches_training_similarity():
    """mean_{i≠j} = (H·mean_{all pairs} − 1)/(H − 1) for nonzero vectors, the latter from disagreement.py."""
    torch.manual_seed(0)
    v = torch.randn(3, 5, 7, 6) + 0.7  # correlated heads
    pad = torch.arange(7).unsqueeze(0) >= torch.tensor([[7], [4], [2]])
    heads = v.size(1)
    expected = (heads * subspace_similarity(v, pad).item() - 1) / (heads - 1)
    assert -math.log(subspace_score(v, pad)) == pytest.approx(expected, rel=1e-5)


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


def test_accumulator_is_a_token_mean_over_the_whole_set():
    torch.manual_seed(1)
    v1, v2 = torch.randn(2, 4, 6, 3), torch.randn(3, 4, 2, 3)
    pad1 = torch.arange(6).unsqueeze(0) >= torch.tensor([[6], [1]])
    pad2 = torch.zeros(3, 2, dtype=torch.bool)
    a1, a2 = torch.randn(2, 4, 6, 6).softmax(-1), torch.randn(3, 4, 2, 2).softmax(-1)
    acc = ScoreAccumulator()
    acc.update({"v": v1, "o": v1, "a": a1}, key_pad=pad1, query_pad=pad1)
    acc.update({"v": v2, "o": v2, "a": a2}, key_pad=pad2, query_pad=pad2)
    tokens = torch.cat([offdiag_cosine(v1)[~pad1], offdiag_cosine(v2)[~pad2]])  # 7 + 6 tokens
    assert acc.scores()["sub"] == pytest.approx(math.exp(-float(tokens.mean())))
    assert acc.scores()["out"] == pytest.approx(math.exp(-float(tokens.mean())))
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


def _module(kind):
    torch.manual_seed(3)
    if kind == "stock_self":
        return MultiheadAttention(E, H, self_attention=True), None
    if kind == "stock_cross":
        return MultiheadAttention(E, H, encoder_decoder_attention=True), None
    if kind == "diverse_self":
        return DiverseMultiheadAttention(E, H, self_attention=True), None
    aggregator = nn.Sequential(nn.Linear(E, E), nn.Tanh())
    return DiverseMultiheadAttention(E, H, self_attention=True, aggregator=aggregator), aggregator


@pytest.mark.parametrize("kind", ["stock_self", "stock_cross", "diverse_self", "diverse_aggregator"])
def test_masking_a_head_matches_manual_computation(kind):
    mha, aggregator = _module(kind)
    mha.eval()
    torch.manual_seed(4)
    query = torch.randn(T, B, E)
    key = query if "self" in kind or "aggregator" in kind else torch.randn(S, B, E)
    key_pad = torch.arange(key.size(0)).unsqueeze(0) >= torch.tensor([[key.size(0)], [3], [5]])
    original_class = type(mha)
    site = AttentionSite("enc_self", 0, mha)
    with torch.no_grad():
        unmasked_stock, _ = mha(query, key, key, key_padding_mask=key_pad, need_weights=False)
        with instrument([site]):
            set_taps([site], {"o"})
            unmasked, _ = mha(query, key, key, key_padding_mask=key_pad, need_weights=False)
            for head in range(H):
                set_head_mask([site], site, head)
                masked, _ = mha(query, key, key, key_padding_mask=key_pad, need_weights=False)
                expected = _manual_attention(mha, query, key, key_pad, head, aggregator)
                torch.testing.assert_close(masked, expected, atol=1e-5, rtol=1e-5)
                assert not torch.allclose(masked, unmasked, atol=1e-4)
            set_head_mask([site], None)
            again, _ = mha(query, key, key, key_padding_mask=key_pad, need_weights=False)
        torch.testing.assert_close(unmasked, unmasked_stock, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(again, unmasked_stock, atol=1e-5, rtol=1e-5)
        # restored: same class, no leftover attributes, same behaviour
        assert type(mha) is original_class
        assert "head_mask" not in mha.__dict__
        if kind.startswith("stock"):
            assert not hasattr(mha, "taps") and not hasattr(mha, "aggregator")
        if aggregator is not None:
            assert mha.aggregator is aggregator
        after, _ = mha(query, key, key, key_padding_mask=key_pad, need_weights=False)
        torch.testing.assert_close(after, unmasked_stock, atol=0, rtol=0)


def test_instrument_restores_after_an_exception():
    mha = MultiheadAttention(E, H, self_attention=True)
    with pytest.raises(RuntimeError):
        with instrument([AttentionSite("enc_self", 0, mha)]):
            assert isinstance(mha, DiverseMultiheadAttention)
            raise RuntimeError("boom")
    assert type(mha) is MultiheadAttention and "taps" not in mha.__dict__


def test_instrumented_taps_match_shapes():
    mha = MultiheadAttention(E, H, encoder_decoder_attention=True).eval()
    site = AttentionSite("enc_dec", 0, mha)
    with torch.no_grad(), instrument([site]):
        set_taps([site], {"v", "a", "o"})
        mha(torch.randn(T, B, E), torch.randn(S, B, E), None)
        tapped = dict(mha.tapped)
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
    panels = {"enc_self": {"layer 1": (rng.normal(size=(4, 8)), ["h1", "h2", "h3", "h4"]),
                           "layer 2": (rng.normal(size=(4, 8)), ["h1", "h2", "h3", "h4"])}}
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


@pytest.fixture(scope="module")
def tiny_checkpoints(tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("analysis_ckpt")
    ckpts = {}
    for arch in ("transformer", "diverse_transformer"):
        run_cli("train", tiny_train_args(tiny_data, root / arch, arch=arch, max_update=8))
        ckpts[arch] = root / arch / "checkpoint_last.pt"
    return ckpts


@pytest.mark.slow
def test_analyze_cli_end_to_end(tiny_checkpoints, tmp_path):
    out = tmp_path / "analysis"
    cmd = [sys.executable, "-m", "diverse_fairseq.analyze", tiny_checkpoints["transformer"],
           tiny_checkpoints["diverse_transformer"], "--out", out, "--max-sentences", "40", "--seed", "3",
           "--no-progress", "--cpu"]
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env=dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
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
                for name in ("sub", "out"):  # between identical (e^-1) and anti-correlated (e^(1/(H-1))) heads
                    assert math.exp(-1) - 1e-9 <= e[name] <= math.exp(1 / 3) + 1e-9
            assert scores["by_type"][atype] == pytest.approx(combine_layers(layers))
        importance = json.loads((d / "importance.json").read_text())
        assert len(importance["heads"]) == 3 * 2 * 4
        assert importance["base_nll"] == pytest.approx(scores["nll"], rel=1e-4)
        assert any(abs(h["delta_nll"]) > 1e-6 for h in importance["heads"])
        markdown = (d / "scores.md").read_text()
        assert "| enc_self |" in markdown and "Head importance" in markdown
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
    from diverse_fairseq.analysis.attention import attention_sites
    from diverse_fairseq.analysis.loading import load_batches, load_checkpoint

    loaded = load_checkpoint(str(tiny_checkpoints[arch]), str(tiny_data))
    pad = loaded.task.target_dictionary.pad()
    batches = load_batches(loaded.task, "valid", 24, max_tokens=120)
    assert len(batches) > 1
    sites = attention_sites(loaded.model)
    assert [(s.attention_type, s.layer) for s in sites] == [
        ("enc_self", 0), ("enc_self", 1), ("dec_self", 0), ("dec_self", 1), ("enc_dec", 0), ("enc_dec", 1)]
    with instrument(sites):
        fast = head_importance(loaded.model, loaded.task, sites, batches, pad, progress=False, replay=True)
        slow = head_importance(loaded.model, loaded.task, sites, batches, pad, progress=False, replay=False)
    assert fast.base_nll == slow.base_nll
    assert [h.nll for h in fast.heads] == pytest.approx([h.nll for h in slow.heads], rel=1e-6)
    assert all(abs(h.delta_nll) > 0 for h in fast.heads)
    assert len(loaded.model.encoder.layers) == 2 and all(
        type(layer).__name__ != "_Replayed" for layer in [*loaded.model.encoder.layers, *loaded.model.decoder.layers])
