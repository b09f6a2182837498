"""The three similarity functions of disagreement regularization (docs/methods.md#disagreement-regularization)
against naive O(H²) loops."""

import pytest
import torch

from diverse_fairseq.methods.disagreement.similarity import output_similarity, position_similarity, subspace_similarity


def naive_cosine(x, pad_mask=None):
    """(1/H²) Σ_i Σ_j cos(x_i[b,n], x_j[b,n]) per token, then the mean over non-pad tokens: plain loops."""
    bsz, heads, ntok, _ = x.shape
    total, count = 0.0, 0
    for b in range(bsz):
        for n in range(ntok):
            if pad_mask is not None and bool(pad_mask[b, n]):
                continue
            s = 0.0
            for i in range(heads):
                for j in range(heads):
                    xi, xj = x[b, i, n].double(), x[b, j, n].double()
                    s += float(xi @ xj / (xi.norm().clamp_min(1e-6) * xj.norm().clamp_min(1e-6)))
            total += s / heads**2
            count += 1
    return total / count


def naive_overlap(a, pad_mask=None):
    """(1/H²) Σ_i Σ_j Σ_s A_i[b,t,s] A_j[b,t,s] per token, then the mean over non-pad tokens."""
    bsz, heads, tgt, src = a.shape
    total, count = 0.0, 0
    for b in range(bsz):
        for t in range(tgt):
            if pad_mask is not None and bool(pad_mask[b, t]):
                continue
            s = 0.0
            for i in range(heads):
                for j in range(heads):
                    s += float((a[b, i, t].double() * a[b, j, t].double()).sum())
            total += s / heads**2
            count += 1
    return total / count


def random_pad(bsz, ntok, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, ntok + 1, (bsz,), generator=g)
    return torch.arange(ntok).unsqueeze(0) >= lengths.unsqueeze(1)  # True = pad


def random_attention(bsz, heads, tgt, src, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(bsz, heads, tgt, src, generator=g).mul(2).softmax(-1)


@pytest.mark.parametrize("fn", [subspace_similarity, output_similarity])
@pytest.mark.parametrize("masked", [False, True])
def test_cosine_terms_match_naive_loop(fn, masked):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 7, 6)
    pad = random_pad(3, 7, 1) if masked else None
    got = fn(x, pad)
    assert got.dim() == 0 and got.dtype == torch.float32
    assert got.item() == pytest.approx(naive_cosine(x, pad), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("masked", [False, True])
def test_position_term_matches_naive_loop(masked):
    a = random_attention(3, 4, 6, 9, 0)
    pad = random_pad(3, 6, 2) if masked else None
    got = position_similarity(a, pad)
    assert got.dim() == 0 and got.dtype == torch.float32
    assert got.item() == pytest.approx(naive_overlap(a, pad), rel=1e-5, abs=1e-6)


def test_known_values():
    # identical heads: cosine 1 everywhere; orthogonal heads: only the diagonal, 1/H
    v = torch.randn(2, 1, 3, 4).expand(2, 4, 3, 4).contiguous()
    assert subspace_similarity(v).item() == pytest.approx(1.0, abs=1e-6)
    eye = torch.eye(4).view(1, 4, 1, 4).expand(2, 4, 3, 4).contiguous()
    assert output_similarity(eye).item() == pytest.approx(0.25, abs=1e-6)
    one_hot = torch.zeros(1, 2, 1, 3)
    one_hot[0, 0, 0, 0] = one_hot[0, 1, 0, 2] = 1.0  # disjoint positions: only the diagonal, 2/H² = 0.5
    assert position_similarity(one_hot).item() == pytest.approx(0.5)


@pytest.mark.parametrize("fn", [subspace_similarity, output_similarity])
def test_cosine_gradcheck(fn):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    pad = random_pad(2, 4, 3)
    assert torch.autograd.gradcheck(lambda t: fn(t, pad), (x,), eps=1e-6, atol=1e-7)
    assert torch.autograd.gradcheck(lambda t: fn(t), (x,), eps=1e-6, atol=1e-7)


def test_position_gradcheck():
    a = random_attention(2, 3, 4, 5, 4).double().requires_grad_(True)
    pad = random_pad(2, 4, 5)
    assert torch.autograd.gradcheck(lambda t: position_similarity(t, pad), (a,), eps=1e-6, atol=1e-7)
    assert torch.autograd.gradcheck(lambda t: position_similarity(t), (a,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "fn,make",
    [
        (subspace_similarity, lambda: torch.randn(3, 4, 6, 5)),
        (output_similarity, lambda: torch.randn(3, 4, 6, 5)),
        (position_similarity, lambda: random_attention(3, 4, 6, 7, 6)),
    ],
)
def test_padding_changes_nothing(fn, make):
    torch.manual_seed(2)
    x = make()
    pad = random_pad(3, 6, 7)
    pad[0, 0] = False  # at least one real token
    changed = x.clone()
    changed.masked_scatter_(pad[:, None, :, None].expand_as(x), torch.randn_like(x) * 100)
    x.requires_grad_(True)
    changed.requires_grad_(True)
    y1, y2 = fn(x, pad), fn(changed, pad)
    assert torch.equal(y1, y2)
    y1.backward()
    y2.backward()
    expanded = pad[:, None, :, None].expand_as(x)
    assert torch.all(x.grad[expanded] == 0) and torch.all(changed.grad[expanded] == 0)
    assert torch.equal(x.grad[~expanded], changed.grad[~expanded])
    # an all-padding mask gives 0, not NaN
    assert fn(x, torch.ones_like(pad)).item() == 0.0


@pytest.mark.parametrize("fn", [subspace_similarity, output_similarity])
def test_zero_vectors_give_no_nan(fn):
    x = torch.randn(2, 3, 4, 5)
    x[0, 1] = 0.0  # one head all zero
    x[1, :, 2] = 0.0  # every head zero at one token
    x.requires_grad_(True)
    y = fn(x)
    y.backward()
    assert torch.isfinite(y) and torch.isfinite(x.grad).all()
    assert y.item() == pytest.approx(naive_cosine(x.detach()), rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_accumulate_in_fp32(dtype):
    torch.manual_seed(3)
    o = (torch.randn(4, 8, 16, 64) * 30).to(dtype)  # squared norms overflow fp16 without fp32 accumulation
    a = random_attention(4, 8, 16, 16, 8).to(dtype)
    pad = random_pad(4, 16, 9)
    for fn, x in ((output_similarity, o), (subspace_similarity, o), (position_similarity, a)):
        x = x.clone().requires_grad_(True)
        y = fn(x, pad)
        assert y.dtype == torch.float32 and torch.isfinite(y)
        assert y.item() == pytest.approx(fn(x.detach().float(), pad).item(), rel=1e-5, abs=1e-6)
        y.backward()
        assert x.grad.dtype == dtype and torch.isfinite(x.grad.float()).all()


def test_bad_inputs_raise():
    # the number of heads is checked by the criterion (tests/methods/disagreement/test_disagreement_criterion.py);
    # here it is only asserted
    with pytest.raises(AssertionError, match="at least 2 heads, got H = 1"):
        output_similarity(torch.randn(2, 1, 3, 4))
    with pytest.raises(AssertionError, match="at least 2 heads, got H = 1"):
        position_similarity(torch.rand(2, 1, 3, 3))
    with pytest.raises(ValueError, match="expected v of shape"):
        subspace_similarity(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="pad_mask has shape"):
        output_similarity(torch.randn(2, 3, 4, 5), torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="pad_mask has shape"):
        position_similarity(torch.rand(2, 3, 4, 5), torch.zeros(2, 5, dtype=torch.bool))
