"""Repulsive attention (An et al., EMNLP 2020): SVGD/SPOS/SGLD core and ``--optimizer repulsive_adam``."""

import copy
import functools
import math
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import USER_DIR, tiny_train_args
from fairseq_in_process import fairseq_train

from diverse_fairseq.methods.hooks import track_model, tracked_models
from diverse_fairseq.methods.repulsive import particle_adam as particle_adam_module
from diverse_fairseq.methods.repulsive.particles import ParticleTag, find_particle_tags, particle_weights
from diverse_fairseq.methods.repulsive.svgd import sgld_direction, spos_direction, svgd_direction
from diverse_fairseq.methods.sites import attention_sites

# ------------------------------------------------------------------------------- core vs formula


def naive_svgd(theta, grad, alpha, stepsize, bandwidth):
    """The update of ``diverse_fairseq.methods.repulsive.svgd`` written as a double loop over particle pairs
    (float64)."""
    m = theta.shape[0]
    sq = [[float(((theta[i] - theta[j]) ** 2).sum()) for j in range(m)] for i in range(m)]
    if bandwidth == "median":
        dists = sorted(math.sqrt(sq[i][j]) for i in range(m) for j in range(i + 1, m))
        med = dists[(len(dists) - 1) // 2]  # lower middle value, as torch.median
        h, width, factor = med**2 / math.log(m), 1.0, None
    elif bandwidth == "authors":
        squared = sorted(sq[i][j] for i in range(m) for j in range(m))
        h, width = 0.5 * squared[(len(squared) - 1) // 2] / math.log(m + 1), 2.0
    else:
        h, width = float(bandwidth), 1.0
    # a zero bandwidth (e.g. "authors" with M = 2: half of the M² squared distances are the
    # diagonal's zeros) means κ = 1 and no repulsion
    factor = 0.0 if h == 0 else (2.0 / h if width == 1.0 else 1.0 / h)
    out = torch.zeros_like(theta)
    for i in range(m):
        for j in range(m):
            kappa = 1.0 if h == 0 else math.exp(-sq[i][j] / (width * h))
            out[i] += kappa * grad[j] - alpha * factor * (theta[i] - theta[j]) * kappa
    return stepsize * out / m


@pytest.mark.parametrize("bandwidth", ["median", "authors", 2.5])
@pytest.mark.parametrize("m", [2, 4, 5])
def test_svgd_matches_double_loop(bandwidth, m):
    gen = torch.Generator().manual_seed(m)
    theta = torch.randn(m, 9, generator=gen, dtype=torch.float64)
    grad = torch.randn(m, 9, generator=gen, dtype=torch.float64)
    got = svgd_direction(theta, grad, alpha=0.3, stepsize=0.1, bandwidth=bandwidth)
    want = naive_svgd(theta, grad, 0.3, 0.1, bandwidth)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)


def authors_rbf_svgd_literal(theta, grad, alpha, stepsize):
    """The authors' ``rbf`` SVGD (their fairseq ``trainer.py``), transcribed element by element.

    h = 0.5 · median of all M² squared distances (diagonal zeros included, lower middle value as
    torch.median) / ln(M + 1); κ_ij = exp(−D²_ij / 2h); kernel_grad_i = Σ_j κ_ij (θ_i − θ_j) / h;
    ĝ_i = ε/M (Σ_j κ_ij g_j − α kernel_grad_i). Plain Python floats, no tensor algebra.
    """
    m, n = len(theta), len(theta[0])
    d2 = [[sum((theta[i][k] - theta[j][k]) ** 2 for k in range(n)) for j in range(m)] for i in range(m)]
    flat = sorted(d2[i][j] for i in range(m) for j in range(m))
    median = flat[(m * m - 1) // 2]
    h = 0.5 * median / math.log(m + 1)
    out = []
    for i in range(m):
        row = []
        for k in range(n):
            drive = sum(math.exp(-d2[i][j] / (2 * h)) * grad[j][k] for j in range(m))
            kernel_grad = sum(math.exp(-d2[i][j] / (2 * h)) * (theta[i][k] - theta[j][k]) / h for j in range(m))
            row.append(stepsize * (drive - alpha * kernel_grad) / m)
        out.append(row)
    return out


@pytest.mark.parametrize("m", [3, 4, 5, 8])
def test_authors_bandwidth_is_the_authors_rbf(m):
    """``bandwidth="authors"``: the whole update equals the literal transcription of the authors' kernel."""
    gen = torch.Generator().manual_seed(100 + m)
    theta = torch.randn(m, 7, generator=gen, dtype=torch.float64)
    grad = torch.randn(m, 7, generator=gen, dtype=torch.float64)
    got = svgd_direction(theta, grad, alpha=0.7, stepsize=0.1, bandwidth="authors")
    want = torch.tensor(authors_rbf_svgd_literal(theta.tolist(), grad.tolist(), 0.7, 0.1), dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)


def test_svgd_batches_independent_sets():
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(3, 4, 6, generator=gen, dtype=torch.float64) * torch.tensor([0.1, 1.0, 10.0]).view(3, 1, 1)
    grad = torch.randn(3, 4, 6, generator=gen, dtype=torch.float64)
    batched = svgd_direction(theta, grad, alpha=0.5, stepsize=0.2)
    for k in range(3):
        torch.testing.assert_close(batched[k], naive_svgd(theta[k], grad[k], 0.5, 0.2, "median"))


def test_spos_adds_beta_gradient_and_seeded_noise():
    gen = torch.Generator().manual_seed(3)
    theta = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    grad = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    eps, beta = 0.1, 0.05
    got = spos_direction(theta, grad, 0.2, eps, beta, generator=torch.Generator().manual_seed(7), noise_scale="unit")
    xi = torch.randn((1, 4, 5), generator=torch.Generator().manual_seed(7), dtype=torch.float64)[0]
    want = naive_svgd(theta, grad, 0.2, eps, "median") + eps * (beta * grad - math.sqrt(2 * beta / eps) * xi)
    torch.testing.assert_close(got, want)
    again = spos_direction(theta, grad, 0.2, eps, beta, generator=torch.Generator().manual_seed(7), noise_scale="unit")
    assert torch.equal(got, again)  # same seed, same noise


def test_spos_and_sgld_default_to_the_authors_noise():
    """The authors' ``spos`` (their trainer.py): β = 1 and the noise times the median |g| of the particle set, in
    the pure functions and in --optimizer repulsive_adam's options."""
    from diverse_fairseq.methods.repulsive.optimizer import RepulsiveAdamConfig

    assert RepulsiveAdamConfig.repulsive_beta == 1.0
    assert RepulsiveAdamConfig.repulsive_noise_scale == "grad_median"
    gen = torch.Generator().manual_seed(5)
    theta = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    grad = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    xi = torch.randn((1, 4, 5), generator=torch.Generator().manual_seed(7), dtype=torch.float64)[0]
    median = sorted(grad.abs().flatten().tolist())[(grad.numel() - 1) // 2]
    langevin = 0.1 * (1.0 * grad - math.sqrt(2 * 1.0 / 0.1) * median * xi)
    spos = spos_direction(theta, grad, 0.01, 0.1, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(spos, naive_svgd(theta, grad, 0.01, 0.1, "median") + langevin)
    sgld = sgld_direction(grad, 0.1, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(sgld, langevin)


def naive_sgld(grad, stepsize, beta, xi, noise_scale="unit"):
    """SGLD written as a loop over sets and particles: ĝ_i = ε (β g_i − √(2β/ε) s ξ_i), s = 1 or the set's
    median |g| (lower middle value, as torch.median)."""
    out = torch.zeros_like(grad)
    for k in range(grad.shape[0]):
        values = sorted(grad[k].abs().flatten().tolist())
        scale = 1.0 if noise_scale == "unit" else values[(len(values) - 1) // 2]
        for i in range(grad.shape[1]):
            out[k, i] = stepsize * (beta * grad[k, i] - math.sqrt(2 * beta / stepsize) * scale * xi[k, i])
    return out


@pytest.mark.parametrize("noise_scale", ["unit", "grad_median"])
def test_sgld_matches_per_particle_loop(noise_scale):
    gen = torch.Generator().manual_seed(11)
    grad = torch.randn(3, 4, 6, generator=gen, dtype=torch.float64)
    eps, beta = 0.1, 0.05
    got = sgld_direction(grad, eps, beta, generator=torch.Generator().manual_seed(7), noise_scale=noise_scale)
    xi = torch.randn((3, 4, 6), generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    torch.testing.assert_close(got, naive_sgld(grad, eps, beta, xi, noise_scale), rtol=1e-12, atol=1e-15)
    single = sgld_direction(grad[0], eps, beta, generator=torch.Generator().manual_seed(7), noise_scale=noise_scale)
    assert single.shape == (4, 6)
    xi1 = torch.randn((1, 4, 6), generator=torch.Generator().manual_seed(7), dtype=torch.float64)  # [M, D] as [1, M, D]
    torch.testing.assert_close(single, naive_sgld(grad[:1], eps, beta, xi1, noise_scale)[0])


@pytest.mark.parametrize("noise_scale", ["unit", "grad_median"])
def test_sgld_is_spos_without_the_kernel_terms(noise_scale):
    """Same generator state: SPOS − SVGD = SGLD (same gradient term, the very same noise draws)."""
    gen = torch.Generator().manual_seed(4)
    theta = torch.randn(2, 4, 5, generator=gen, dtype=torch.float64)
    grad = torch.randn(2, 4, 5, generator=gen, dtype=torch.float64)
    spos = spos_direction(theta, grad, 0.3, 0.1, 0.02, generator=torch.Generator().manual_seed(9),
                          noise_scale=noise_scale)
    svgd = svgd_direction(theta, grad, 0.3, 0.1)
    sgld = sgld_direction(grad, 0.1, 0.02, generator=torch.Generator().manual_seed(9), noise_scale=noise_scale)
    torch.testing.assert_close(sgld, spos - svgd, rtol=1e-10, atol=1e-14)


def test_sgld_asserts_a_positive_beta():
    """The optimizer's config refuses such a beta with a message naming the flag (below); the update asserts it."""
    for beta in (0.0, -1.0):
        with pytest.raises(AssertionError, match="SGLD needs beta > 0"):
            sgld_direction(torch.randn(4, 3), 0.1, beta)


def test_single_particle_is_exactly_stepsize_times_gradient():
    theta, grad = torch.randn(1, 33), torch.randn(1, 33)
    for bandwidth in ("median", "authors", 1.0):
        assert torch.equal(svgd_direction(theta, grad, alpha=0.7, stepsize=0.1, bandwidth=bandwidth), 0.1 * grad)
    assert torch.equal(spos_direction(theta, grad, 0.7, 0.1, beta=0.0), 0.1 * grad)


@pytest.mark.parametrize("alpha", [0.0, 0.5])
@pytest.mark.parametrize("bandwidth", ["median", "authors"])
def test_identical_particles_get_the_mean_gradient(alpha, bandwidth):
    """Zero bandwidth: κ = 1 and no repulsion, never NaN (α = 0 is the definition; α > 0 must agree)."""
    theta = torch.randn(1, 50, dtype=torch.float64).repeat(4, 1)
    grad = torch.randn(4, 50, dtype=torch.float64)
    got = svgd_direction(theta, grad, alpha=alpha, stepsize=0.1, bandwidth=bandwidth)
    torch.testing.assert_close(got, (0.1 * grad.mean(0)).expand(4, 50), rtol=1e-12, atol=1e-15)
    assert torch.isfinite(svgd_direction(theta.float(), grad.float(), alpha, 0.1, bandwidth)).all()


def test_zero_median_bandwidth_with_some_distinct_particles_is_finite():
    # 3 of 4 particles equal: 3 of the 6 pairwise distances are 0, so the (lower) median is 0
    theta = torch.cat([torch.zeros(3, 8), torch.ones(1, 8)])
    grad = torch.randn(4, 8)
    got = svgd_direction(theta, grad, alpha=1.0, stepsize=0.1)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, (0.1 * grad.mean(0)).expand(4, 8))


def _pairwise(x):  # [M, D] -> distances of the M(M-1)/2 pairs
    m = x.shape[0]
    rows, cols = torch.triu_indices(m, m, 1)
    return (x[rows] - x[cols]).norm(dim=-1)


@pytest.mark.parametrize("bandwidth", ["median", "authors"])
def test_repulsion_with_zero_loss_gradient_moves_every_pair_apart(bandwidth):
    gen = torch.Generator().manual_seed(11)
    theta = torch.randn(5, 64, generator=gen, dtype=torch.float64)
    update = svgd_direction(theta, torch.zeros_like(theta), alpha=0.5, stepsize=0.1, bandwidth=bandwidth)
    after = theta - 1.0 * update  # the optimizer subtracts the returned gradient
    assert (_pairwise(after) > _pairwise(theta)).all()


# ------------------------------------------------------------------- in-process fairseq set-up

VOCAB = 40


@functools.lru_cache(maxsize=None)
def _cfg(*extra, arch="transformer"):
    """The full fairseq config (so that the optimizer's ``${common.*}`` fields resolve); read only."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = [
        "unused-data", "--user-dir", USER_DIR, "--task", "translation", "--cpu", "--arch", arch,
        "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
        "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--share-all-embeddings",
        "--dropout", "0.0", "--optimizer", "repulsive_adam", "--lr", "0.005", *extra,
    ]
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))


def _model(cfg, seed=0, tracked=True):
    import fairseq.models
    from fairseq.data import Dictionary
    from fairseq.tasks.translation import TranslationTask

    dictionary = Dictionary()
    for i in range(VOCAB - dictionary.nspecial):
        dictionary.add_symbol(f"w{i}")
    task = TranslationTask(cfg.task, dictionary, dictionary)
    torch.manual_seed(seed)
    if not tracked:  # fairseq's own build_model, bypassing diverse_fairseq.methods.hooks
        return fairseq.models.build_model.__wrapped__(cfg.model, task)
    return task.build_model(cfg.model)  # through fairseq.models.build_model: tracked


def _loss(model):
    gen = torch.Generator().manual_seed(5)
    src = torch.randint(4, VOCAB, (6, 7), generator=gen)
    tgt = torch.randint(4, VOCAB, (6, 5), generator=gen)
    prev = torch.cat([torch.full((6, 1), 2), tgt[:, :-1]], dim=1)
    logits = model(src, torch.full((6,), 7), prev)[0].float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="sum")


def _update(optimizer, model, clip=0.5, call_clip=True, sample_size=30.0):
    """One update in the fairseq trainer's order: backward, normalise, clip, step."""
    optimizer.zero_grad()
    optimizer.backward(_loss(model))
    optimizer.multiply_grads(1.0 / sample_size)
    if call_clip:
        optimizer.clip_grad_norm(clip)
    optimizer.step()


@pytest.fixture
def seen():
    """The gradients handed to the SVGD transform, one [G, M, D] tensor per group and step, as the documented
    observer hook (``add_svgd_observer``, the kernel probe's) sees them."""
    calls = []

    def observer(theta, grad, rule, grad_scale):
        calls.append(grad.detach().clone() * (1.0 if grad_scale is None else grad_scale))

    remove = particle_adam_module.add_svgd_observer(observer)
    yield calls
    remove()
    assert observer not in particle_adam_module.SVGD_OBSERVERS


def _build(cfg, params):
    from fairseq import optim

    return optim.build_optimizer(cfg.optimizer, params)


def test_finds_every_qkv_of_a_stock_transformer_and_selects_by_type_layer_projection():
    cfg = _cfg()
    model = _model(cfg)
    opt = _build(cfg, list(model.parameters()))
    tags = opt.particle_tags
    assert len(tags) == 2 * 3 + 2 * 2 * 3  # enc self, dec self, enc-dec: 2 layers × q, k, v
    assert {(t.attention_type, t.layer_idx) for t in tags} == {
        (a, i) for a in ("enc_self", "dec_self", "enc_dec") for i in (0, 1)
    }
    assert ParticleTag("enc_self", 0, "q", 4) in tags and len(set(tags)) == len(tags)

    cfg = _cfg("--repulsive-attention", "enc_self,enc_dec", "--repulsive-layers", "-1", "--repulsive-projections", "v")
    model = _model(cfg)
    opt = _build(cfg, list(model.parameters()))
    assert opt.particle_tags == [ParticleTag("enc_self", 1, "v", 4), ParticleTag("enc_dec", 1, "v", 4)]
    weights = [model.encoder.layers[1].self_attn.v_proj.weight, model.decoder.layers[1].encoder_attn.v_proj.weight]
    assert opt.particle_params == weights

    cfg = _cfg("--repulsive-attention", "enc_self", "--repulsive-projections", "q")
    model = _model(cfg)  # kept alive: the optimizer finds the attention modules of live tracked models
    assert [t.layer_idx for t in _build(cfg, list(model.parameters())).particle_tags] == [0, 1]  # all


@pytest.mark.parametrize("value,message", [
    ("5", "--repulsive-layers 5: layer index 5 is out of range for 2 layers of enc_self attention"),
    ("0,-3", "layer index -3 is out of range for 2 layers"),
    ("none", "--repulsive-layers none selects no particles"),  # not "all", as it once was
    ("0;1", "--repulsive-layers: expected 'all', 'none' or comma-separated layer indices"),
])
def test_bad_repulsive_layers_are_refused(value, message):
    cfg = _cfg("--repulsive-layers", value)
    model = _model(cfg)
    with pytest.raises(ValueError, match=re.escape(message)):
        _build(cfg, list(model.parameters()))


@pytest.mark.parametrize("value", ["-0.01", "inf"])
def test_negative_repulsive_alpha_is_refused(value):
    cfg = _cfg("--repulsive-alpha", value)
    model = _model(cfg)
    with pytest.raises(ValueError, match=f"--repulsive-alpha must be a finite number >= 0 .*got {value}"):
        _build(cfg, list(model.parameters()))


def test_repulsive_flags_without_the_repulsive_optimizer_are_rejected_by_fairseq(capsys):
    """``--repulsive-*`` are registered by the optimizer's config only: with ``--optimizer adam`` fairseq's
    parser refuses them as unrecognized arguments."""
    from fairseq import options

    argv = ["unused-data", "--user-dir", USER_DIR, "--task", "translation", "--arch", "transformer",
            "--optimizer", "adam", "--repulsive-alpha", "0.5"]
    with pytest.raises(SystemExit):
        options.parse_args_and_arch(options.get_training_parser(), argv)
    assert "unrecognized arguments: --repulsive-alpha 0.5" in capsys.readouterr().err


def test_project_model_is_found_through_its_attention_sites():
    cfg = _cfg(arch="diverse_transformer")
    model = _model(cfg)
    opt = _build(cfg, list(model.parameters()))
    expected = [(s.attention_type, s.layer, proj) for s in attention_sites(model) for proj in "qkv"]
    assert len(expected) == 18
    assert sorted((t.attention_type, t.layer_idx, t.projection) for t in opt.particle_tags) == sorted(expected)


def test_non_particle_parameters_get_fairseqs_adam_update_bitwise():
    cfg_rep = _cfg("--weight-decay", "0.01")
    cfg_adam = _cfg("--weight-decay", "0.01", "--optimizer", "adam")
    model_rep, model_adam = _model(cfg_rep), _model(cfg_adam)
    opt_rep = _build(cfg_rep, list(model_rep.parameters()))
    opt_adam = _build(cfg_adam, list(model_adam.parameters()))
    assert type(opt_adam.optimizer).__name__ == "Adam"  # fairseq's own Adam (no FusedAdam on CPU)
    _update(opt_rep, model_rep)
    _update(opt_adam, model_adam)
    particles = {id(p) for p in opt_rep.particle_params}
    compared = 0
    for p_rep, p_adam in zip(model_rep.parameters(), model_adam.parameters()):
        if id(p_rep) in particles:
            assert not torch.equal(p_rep, p_adam)
        else:
            assert torch.equal(p_rep, p_adam)
            compared += 1
    assert compared > 10


@pytest.mark.parametrize("stepsize", ["0.1", "0.01"])
def test_identity_kernel_trains_every_parameter_as_adam(stepsize):
    """A tiny fixed bandwidth makes κ the identity and the repulsion 0, so ĝ_i = (ε/M)·g_i; Adam ignores a
    constant factor on a gradient, so three updates equal plain Adam's for every parameter, whatever ε."""
    # Adam's ε (denominator floor) far below |ĝ| ≈ 1e-7 here, so that it cannot tell the scales apart
    cfg_rep = _cfg("--repulsive-bandwidth", "1e-6", "--repulsive-stepsize", stepsize, "--adam-eps", "1e-30")
    cfg_adam = _cfg("--optimizer", "adam", "--adam-eps", "1e-30")
    _assert_trains_as_adam(cfg_rep, cfg_adam)


@pytest.mark.parametrize("bandwidth", ["median", "authors", "0.5"])
def test_one_head_is_one_particle_without_repulsion_and_trains_as_adam(bandwidth):
    """M = 1 (the first point of EMNLP 2020 Figure 3): every particle set holds one head, so there is no pair
    to repel, whatever the bandwidth (the median one has no pair to take a median of: h = 0), and the SVGD
    direction is ε·g. Adam ignores that constant, so repulsive_adam trains a 1-head model as plain Adam."""
    one = ("--encoder-attention-heads", "1", "--decoder-attention-heads", "1", "--adam-eps", "1e-30")
    cfg_rep = _cfg(*one, "--repulsive-bandwidth", bandwidth, "--repulsive-alpha", "1.0")
    opt_rep = _assert_trains_as_adam(cfg_rep, _cfg(*one, "--optimizer", "adam"))
    assert len(opt_rep.particle_tags) == 18 and {g.num_heads for g in opt_rep.optimizer.particle_groups} == {1}


def _assert_trains_as_adam(cfg_rep, cfg_adam):
    """Three updates of repulsive_adam (``cfg_rep``) equal plain Adam's for every parameter; the optimizer.

    In float64: Adam with a tiny ε divides m by √v, which turns the float32 round-off of ĝ = (ε/M)·g on a
    near-zero gradient coordinate into differences of a few 1e-7 (processor-dependent); in float64 the two runs
    agree far inside the tolerance, so any real difference (a missed factor, a repulsive term) still fails."""
    model_rep, model_adam = _model(cfg_rep).double(), _model(cfg_adam).double()
    opt_rep = _build(cfg_rep, list(model_rep.parameters()))
    opt_adam = _build(cfg_adam, list(model_adam.parameters()))
    for _ in range(3):  # no clipping: fairseq's clip_grad_norm takes float32 norms only
        _update(opt_rep, model_rep, call_clip=False)
        _update(opt_adam, model_adam, call_clip=False)
    moved = 0
    for (name, p_rep), p_adam, p_init in zip(model_rep.named_parameters(), model_adam.parameters(),
                                             _model(cfg_adam).double().parameters()):
        if name.endswith("k_proj.bias"):
            continue  # its true gradient is 0 (softmax ignores q·b_k); Adam blows its round-off up to full steps
        torch.testing.assert_close(p_rep, p_adam, rtol=1e-5, atol=1e-7)
        moved += not torch.equal(p_adam, p_init)
    assert moved > 10
    return opt_rep


def test_one_step_with_zero_loss_gradient_moves_every_pair_of_heads_apart():
    cfg = _cfg("--repulsive-alpha", "0.5")
    model = _model(cfg)
    opt = _build(cfg, list(model.parameters()))
    before = [p.detach().clone().view(4, -1) for p in opt.particle_params]
    opt.zero_grad()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = [p.detach().view(4, -1) for p in opt.particle_params]
    for b, a in zip(before, after):
        assert (_pairwise(a) > _pairwise(b)).all()


def _reference_gradients(seen, cfg_args=(), clip=0.5, call_clip=True, weights=None):
    cfg = _cfg(*cfg_args)
    model = _model(cfg)
    if weights is not None:
        model.load_state_dict(weights)
    opt = _build(cfg, list(model.parameters()))
    _update(opt, model, clip=clip, call_clip=call_clip)
    assert len(seen) == 1
    return seen.pop(), model


@pytest.mark.parametrize("call_clip", [True, False])
def test_amp_transform_sees_the_unscaled_gradient(seen, call_clip):
    """fairseq's AMPOptimizer + a GradScaler that really scales (on CPU fairseq's CUDA scaler is off)."""
    from fairseq.optim.amp_optimizer import AMPOptimizer

    want, ref_model = _reference_gradients(seen, call_clip=call_clip)
    cfg = _cfg("--amp")
    model = _model(cfg)
    amp = AMPOptimizer.build_optimizer(cfg, list(model.parameters()))
    amp._grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    _update(amp, model, call_clip=call_clip)
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], want, rtol=1e-5, atol=1e-10)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)


def test_amp_overflow_skips_the_step(seen):
    from fairseq.optim.amp_optimizer import AMPOptimizer

    cfg = _cfg("--amp")
    model = _model(cfg)
    amp = AMPOptimizer.build_optimizer(cfg, list(model.parameters()))
    amp._grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    before = [p.detach().clone() for p in model.parameters()]
    amp.zero_grad()
    amp.backward(_loss(model))
    model.encoder.layers[0].fc1.weight.grad[0, 0] = float("inf")
    amp.multiply_grads(1 / 30)
    amp.clip_grad_norm(0.0)
    amp.step()
    assert seen == [] and amp.fp32_optimizer.optimizer.num_steps == 0
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert amp.scaler.get_scale() == 2.0**11


@pytest.mark.parametrize("flags", [("--memory-efficient-fp16",), ("--fp16", "--fp16-no-flatten-grads")])
def test_fp16_paths_give_the_transform_the_unscaled_gradient(seen, flags):
    from fairseq.optim import FP16Optimizer, MemoryEfficientFP16Optimizer

    cfg = _cfg(*flags)
    model = _model(cfg).half()
    params = list(model.parameters())
    wrapper = MemoryEfficientFP16Optimizer if "--memory-efficient-fp16" in flags else FP16Optimizer
    opt = wrapper.build_optimizer(cfg, params)
    assert opt.scaler.loss_scale == 128
    start = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    _update(opt, model)
    assert len(seen) == 1
    got = seen.pop()
    want, _ = _reference_gradients(seen, weights=start)  # the same update in fp32 from the same weights
    # fp16 forward/backward noise is a few percent; a loss scale left in (or divided out twice) is 128×
    rel = (got - want).flatten(1).norm(dim=1) / want.flatten(1).norm(dim=1)
    ratio = got.flatten(1).norm(dim=1) / want.flatten(1).norm(dim=1)
    assert rel.max() < 0.1 and ((ratio - 1).abs() < 0.05).all(), (rel, ratio)


def test_plain_fp16_with_flat_master_params_is_refused(monkeypatch):
    from fairseq.optim import FP16Optimizer

    cfg = _cfg("--fp16")
    model = _model(cfg)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # fairseq's flat path asks CUDA for it
    with pytest.raises(ValueError, match="--fp16-no-flatten-grads"):
        FP16Optimizer.build_optimizer(cfg, list(model.parameters()))


def test_master_copies_are_matched_by_position_and_value():
    cfg = _cfg()
    model = _model(cfg)
    copies = [torch.nn.Parameter(p.detach().float().clone()) for p in model.parameters()]
    tags = find_particle_tags(copies)
    assert len(tags) == 18
    copies[next(iter(sorted(tags)))].data.add_(1.0)  # not a copy of this model any more
    assert find_particle_tags(copies) == {}


def test_a_model_the_hook_never_saw_is_refused_not_trained_as_plain_adam():
    cfg = _cfg()
    model = _model(cfg, seed=123, tracked=False)  # a seed of its own: no live tracked model has its values
    assert model not in tracked_models()
    with pytest.raises(ValueError, match=r"no particles to update: no attention module was found in the model "
                                         r"being trained .*diverse_fairseq\.methods\.hooks\.track_model"):
        _build(cfg, list(model.parameters()))
    track_model(model)
    assert len(_build(cfg, list(model.parameters())).particle_tags) == 18


def test_a_torch_compiled_model_is_found_through_orig_mod():
    """``torch.compile`` wraps the model in an ``OptimizedModule`` whose ``_orig_mod`` is a submodule, with the
    same Parameter objects: tracking the wrapper is enough, by identity and (master copies) by position."""
    cfg = _cfg()
    model = _model(cfg, seed=124, tracked=False)
    compiled = track_model(torch.compile(model))  # never called, so nothing is compiled
    assert type(compiled).__name__ == "OptimizedModule" and compiled._orig_mod is model
    opt = _build(cfg, list(compiled.parameters()))
    assert len(opt.particle_tags) == 18
    assert {id(p) for p in opt.particle_params} == {id(w) for w, _ in particle_weights(model)}
    copies = [torch.nn.Parameter(p.detach().float().clone()) for p in compiled.parameters()]
    assert len(find_particle_tags(copies)) == 18


def test_state_dict_keeps_the_step_count():
    cfg = _cfg("--repulsive-method", "spos")
    model = _model(cfg)
    opt = _build(cfg, list(model.parameters()))
    _update(opt, model)
    _update(opt, model)
    state = opt.state_dict()
    fresh = _build(cfg, list(model.parameters()))
    fresh.load_state_dict(state)
    assert fresh.optimizer.num_steps == 2


def _particle_state(model):
    return [w.detach().clone() for w, _ in particle_weights(model)]


def test_sgld_step_is_the_formula_with_the_seeded_noise(monkeypatch):
    """The optimizer hands Adam ε (β g − √(2β/ε) ξ), ξ from the generator seeded by (--seed, step count)."""
    cfg = _cfg("--repulsive-method", "sgld", "--repulsive-beta", "0.01", "--seed", "3")  # default noise scale
    model = _model(cfg)
    opt = _build(cfg, list(model.parameters()))
    for _ in range(2):
        _update(opt, model)
    opt.zero_grad()
    opt.backward(_loss(model))
    (group,) = opt.optimizer.particle_groups
    grads = torch.stack([p.grad.detach().reshape(group.num_heads, group.dim) for p in group.params]).double()
    got = opt.particle_gradients()
    gen = torch.Generator().manual_seed(3 * 1_000_003 + 2)  # seed 3, two steps taken
    xi = torch.randn(grads.shape, generator=gen, dtype=torch.float32).double()
    want = naive_sgld(grads, 0.1, 0.01, xi, "grad_median")  # the default noise scale
    for k, p in enumerate(group.params):
        torch.testing.assert_close(got[id(p)].double(), want[k].view(p.shape), rtol=1e-5, atol=1e-7)


def test_sgld_noise_is_the_same_on_two_workers_with_the_same_seed_and_step():
    """Two replicas (same model, same gradients, same --seed) stay bitwise equal; another seed does not."""
    cfg = _cfg("--repulsive-method", "sgld")
    models = [_model(cfg, seed=0) for _ in range(3)]
    opts = [_build(cfg, list(m.parameters())) for m in models[:2]]
    other_cfg = _cfg("--repulsive-method", "sgld", "--seed", "2")
    opts.append(_build(other_cfg, list(models[2].parameters())))
    start = _particle_state(models[0])
    for _ in range(3):
        for opt, model in zip(opts, models):
            _update(opt, model)
    first, second, other = (_particle_state(m) for m in models)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert all(not torch.equal(a, b) for a, b in zip(first, start))  # the heads moved
    assert all(not torch.equal(a, b) for a, b in zip(first, other))  # another seed, other noise
    for a, b in zip(models[0].state_dict().values(), models[1].state_dict().values()):
        assert torch.equal(a, b)


def test_sgld_resume_continues_the_noise_sequence():
    """Save after two steps, load into a fresh optimizer: the third step is bitwise the uninterrupted one."""
    cfg = _cfg("--repulsive-method", "sgld")
    model = _model(cfg)
    opt = _build(cfg, list(model.parameters()))
    for _ in range(2):
        _update(opt, model)
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = copy.deepcopy(opt.state_dict())  # a checkpoint's copy: state_dict() holds the live tensors
    _update(opt, model)
    straight = _particle_state(model)

    model.load_state_dict(saved_model)
    fresh = _build(cfg, list(model.parameters()))
    fresh.load_state_dict(saved_opt)
    assert fresh.optimizer.num_steps == 2
    _update(fresh, model)
    assert all(torch.equal(a, b) for a, b in zip(_particle_state(model), straight))

    model.load_state_dict(saved_model)  # without the step count the noise starts over: a different step
    restarted = _build(cfg, list(model.parameters()))
    restarted_state = dict(saved_opt)
    restarted_state.pop("repulsive_adam")
    restarted.load_state_dict(restarted_state)
    _update(restarted, model)
    assert not any(torch.equal(a, b) for a, b in zip(_particle_state(model), straight))


@pytest.mark.parametrize("method,flags,message", [
    ("sgld", ("--repulsive-alpha", "0.5"), "--repulsive-alpha 0.5 would do nothing with --repulsive-method sgld"),
    ("sgld", ("--repulsive-bandwidth", "authors"),
     "--repulsive-bandwidth authors would do nothing with --repulsive-method sgld"),
    ("sgld", ("--repulsive-alpha", "0", "--repulsive-bandwidth", "2.5"),
     "--repulsive-alpha 0.0, --repulsive-bandwidth 2.5 would do nothing with --repulsive-method sgld"),
    ("svgd", ("--repulsive-beta", "0.01"), "--repulsive-beta 0.01 would do nothing with --repulsive-method svgd"),
    ("svgd", ("--repulsive-noise-scale", "unit"),
     "--repulsive-noise-scale unit would do nothing with --repulsive-method svgd"),
    ("sgld", ("--repulsive-beta", "0"), "--repulsive-method sgld needs --repulsive-beta > 0"),
    ("sgld", ("--repulsive-beta", "-0.5"), "--repulsive-method sgld needs --repulsive-beta > 0"),
    ("spos", ("--repulsive-beta", "-0.5"), "--repulsive-beta must be >= 0, got -0.5"),
])
def test_options_a_method_does_not_read_are_refused(method, flags, message):
    cfg = _cfg("--repulsive-method", method, *flags)
    model = _model(cfg)
    with pytest.raises(ValueError, match=re.escape(message)):
        _build(cfg, list(model.parameters()))


def test_options_a_method_does_not_read_are_accepted_at_their_defaults():
    cfg = _cfg("--repulsive-method", "sgld", "--repulsive-alpha", "0.01", "--repulsive-bandwidth", "median")
    model = _model(cfg)
    assert _build(cfg, list(model.parameters())).optimizer.rule.method == "sgld"


# ---------------------------------------------------------------------------- end to end (CLI)


def _head_distance(checkpoint, heads=4):
    """Mean distance between the per-head row blocks of every q/k/v weight in a checkpoint."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["model"]
    means = []
    for name, w in state.items():
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            means.append(_pairwise(w.float().reshape(heads, -1)).mean())
    assert len(means) == 18
    return torch.stack(means).mean().item()


@pytest.mark.slow
def test_repulsive_adam_spreads_heads_more_than_adam(tiny_data, tmp_path):
    distances = {}
    for optimizer in ("adam", "repulsive_adam"):
        save = tmp_path / optimizer
        fairseq_train(tiny_train_args(tiny_data, save, max_update=20, extra=["--optimizer", optimizer]))
        distances[optimizer] = _head_distance(save / "checkpoint_last.pt")
    assert distances["repulsive_adam"] > 1.05 * distances["adam"], distances


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--memory-efficient-fp16"], ["--fp16", "--fp16-no-flatten-grads"], ["--amp"]])
def test_precision_paths_train_on_cpu(tiny_data, tmp_path, flags):
    extra = ["--optimizer", "repulsive_adam", "--no-save", *flags]
    log = fairseq_train(tiny_train_args(tiny_data, tmp_path, max_update=3, extra=extra))
    assert "repulsive_adam: svgd on 18 particle sets" in log
    assert "num_updates 3" in log and " nan " not in log


# Two gloo ranks with SPOS hold identical parameters (the same noise on both): test_routing_model.py's two-process
# test, with all three methods in one run.


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spos", "sgld"])
def test_resume_continues_the_same_noisy_run(tiny_data, tmp_path, method):
    extra = ["--optimizer", "repulsive_adam", "--repulsive-method", method]
    fairseq_train(tiny_train_args(tiny_data, tmp_path / "straight", max_update=4, extra=extra))
    fairseq_train(tiny_train_args(tiny_data, tmp_path / "resumed", max_update=2, extra=extra))
    second = fairseq_train(tiny_train_args(tiny_data, tmp_path / "resumed", max_update=4, extra=extra))
    assert "loaded checkpoint" in second.lower()
    straight = torch.load(tmp_path / "straight" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    resumed = torch.load(tmp_path / "resumed" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert resumed["optimizer_history"][-1]["num_updates"] == 4
    assert resumed["last_optimizer_state"]["repulsive_adam"]["num_steps"] == 4
    for name, value in straight["model"].items():
        torch.testing.assert_close(resumed["model"][name], value, rtol=0, atol=1e-6, msg=name)


@pytest.mark.slow
def test_sgld_trains_a_tiny_model(tiny_data, tmp_path):
    from test_disagreement_e2e import parse_log

    log = fairseq_train(tiny_train_args(tiny_data, tmp_path, max_update=20, extra=[
        "--optimizer", "repulsive_adam", "--repulsive-method", "sgld", "--no-save"]))
    assert "repulsive_adam: sgld on 18 particle sets" in log
    losses = [r["loss"] for r in parse_log(log)]
    assert len(losses) == 20
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0, losses
