"""Routing-by-agreement cores (NAACL 2019 Algorithms 1-2, docs/methods.md#routing-by-agreement-aggregation) and the
aggregation module.

The fast cores are checked against slow references that loop over heads, output capsules and
iterations exactly as Algorithms 1 and 2 are written (float64, no log-space tricks).
"""

import math
import shutil

import pytest
import torch
import torch.nn.functional as F

from diverse_fairseq.methods.routing.aggregation import RoutingAggregation
from diverse_fairseq.methods.routing.algorithms import em_routing, get_routing_function, simple_routing, squash

LOG_2PI = math.log(2 * math.pi)


# --------------------------------------------------------------------------------------------------
# slow references
# --------------------------------------------------------------------------------------------------


def ref_simple_routing(votes, iterations, coupling_over="outputs"):
    """Algorithm 1, line by line. ``coupling_over="heads"`` is the authors' code variant (softmax
    over h), used only to show that the implementation does not do that."""
    batch, (H, N, C) = votes.shape[:-3], votes.shape[-3:]
    V = votes.detach().double().reshape(-1, H, N, C)  # [M, H, N, C]
    M = V.shape[0]
    B = [[torch.zeros(M, dtype=torch.float64) for _ in range(N)] for _ in range(H)]  # line 2
    omega = None
    for _ in range(iterations):  # line 3
        if coupling_over == "outputs":  # line 4: C_{h,n} = exp(B_{h,n}) / Σ_n' exp(B_{h,n'})
            Cw = [[torch.exp(B[h][n]) / sum(torch.exp(B[h][k]) for k in range(N)) for n in range(N)]
                  for h in range(H)]
        else:
            Cw = [[torch.exp(B[h][n]) / sum(torch.exp(B[k][n]) for k in range(H)) for n in range(N)]
                  for h in range(H)]
        omega = []
        for n in range(N):  # line 5, Eq. 7 and Eq. 8
            num = sum(Cw[h][n][:, None] * V[:, h, n] for h in range(H))
            den = sum(Cw[h][n] for h in range(H))
            s = num / den[:, None]
            norm = s.norm(dim=-1, keepdim=True)
            omega.append(norm**2 / (1 + norm**2) * s / norm)
        for h in range(H):  # line 6
            for n in range(N):
                B[h][n] = B[h][n] + (omega[n] * V[:, h, n]).sum(-1)
    return torch.stack(omega, dim=1).reshape(*batch, N, C)


def ref_em_routing(votes, beta_a, beta_mu, iterations, lambdas=None, eps=1e-6):
    """Algorithm 2 with the M-step and E-step of docs/methods.md#em-routing, line by line (Eq. 12 as a plain ratio)."""
    batch, (H, N, C) = votes.shape[:-3], votes.shape[-3:]
    V = votes.detach().double().reshape(-1, H, N, C)
    M = V.shape[0]
    ba = torch.as_tensor(beta_a, dtype=torch.float64).detach().expand(N)
    bm = torch.as_tensor(beta_mu, dtype=torch.float64).detach().expand(N)
    lambdas = lambdas if lambdas is not None else list(range(1, iterations + 1))
    Cw = [[torch.full((M,), 1.0 / N, dtype=torch.float64) for _ in range(N)] for _ in range(H)]
    for t in range(iterations):
        mu, var, A = [], [], []
        for n in range(N):  # M-step
            R = sum(Cw[h][n] for h in range(H))
            m = sum(Cw[h][n][:, None] * V[:, h, n] for h in range(H)) / R[:, None]
            s2 = sum(Cw[h][n][:, None] * (V[:, h, n] - m) ** 2 for h in range(H)) / R[:, None] + eps
            chi = (0.5 * torch.log(s2) + (1 + LOG_2PI) / 2).sum(-1) * R
            A.append(torch.sigmoid(lambdas[t] * (ba[n] - bm[n] * R - chi)))
            mu.append(m)
            var.append(s2)
        if t < iterations - 1:  # E-step
            for h in range(H):
                P = []
                for n in range(N):
                    d2 = (V[:, h, n] - mu[n]) ** 2
                    log_p = (-d2 / (2 * var[n]) - 0.5 * torch.log(2 * math.pi * var[n])).sum(-1)
                    P.append(torch.exp(log_p))
                den = sum(A[k] * P[k] for k in range(N))
                for n in range(N):
                    Cw[h][n] = A[n] * P[n] / den
    out = torch.stack([A[n][:, None] * mu[n] for n in range(N)], dim=1)
    return out.reshape(*batch, N, C)


SHAPES = [  # [..., H, N, C]
    (4, 8, 1),
    (2, 3, 4, 8, 1),
    (5, 3, 6, 2),
    (2, 2, 2, 5, 3),
    (3, 1, 1, 6, 4),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("iterations", [1, 3])
def test_simple_routing_matches_algorithm_1(shape, iterations):
    g = torch.Generator().manual_seed(hash((shape, iterations)) % 2**31)
    votes = torch.randn(shape, generator=g, dtype=torch.float64)
    out = simple_routing(votes, iterations)
    assert out.shape == shape[:-3] + shape[-2:] and out.dtype == torch.float64
    torch.testing.assert_close(out, ref_simple_routing(votes, iterations), rtol=1e-9, atol=1e-9)
    out32 = simple_routing(votes.float(), iterations)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), ref_simple_routing(votes, iterations), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_em_routing_matches_algorithm_2(shape, iterations):
    g = torch.Generator().manual_seed(hash((shape, iterations, 1)) % 2**31)
    N = shape[-2]
    votes = torch.randn(shape, generator=g, dtype=torch.float64)
    beta_a = torch.randn(N, generator=g, dtype=torch.float64)
    beta_mu = torch.randn(N, generator=g, dtype=torch.float64)
    out = em_routing(votes, beta_a, beta_mu, iterations)
    assert out.shape == shape[:-3] + shape[-2:] and out.dtype == torch.float64
    ref = ref_em_routing(votes, beta_a, beta_mu, iterations)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    out32 = em_routing(votes.float(), beta_a.float(), beta_mu.float(), iterations)
    torch.testing.assert_close(out32.double(), ref, rtol=1e-4, atol=1e-5)


def test_em_routing_scalar_betas_temperatures_and_eps():
    g = torch.Generator().manual_seed(3)
    votes = torch.randn(2, 5, 4, 7, 2, generator=g, dtype=torch.float64)
    out = em_routing(votes, 0.3, -0.2, 3, inverse_temperatures=[0.5, 1.5, 4.0], eps=1e-4)
    ref = ref_em_routing(votes, 0.3, -0.2, 3, lambdas=[0.5, 1.5, 4.0], eps=1e-4)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)


def test_inverse_temperature_default_is_1_to_T():
    g = torch.Generator().manual_seed(4)
    votes = torch.randn(6, 4, 8, 1, generator=g)
    beta_a, beta_mu = torch.randn(8, generator=g), torch.randn(8, generator=g)
    default = em_routing(votes, beta_a, beta_mu, 3)
    explicit = em_routing(votes, beta_a, beta_mu, 3, inverse_temperatures=[1, 2, 3])
    torch.testing.assert_close(default, explicit, rtol=0, atol=0)
    constant = em_routing(votes, beta_a, beta_mu, 3, inverse_temperatures=[1, 1, 1])
    assert (default - constant).abs().max() > 1e-3  # the schedule is actually used
    with pytest.raises(ValueError, match="inverse_temperatures"):
        em_routing(votes, beta_a, beta_mu, 3, inverse_temperatures=[1, 2])


def test_simple_routing_softmax_is_over_output_capsules():
    g = torch.Generator().manual_seed(5)
    votes = torch.randn(16, 3, 5, 2, generator=g, dtype=torch.float64)
    out = simple_routing(votes, 3)
    over_outputs = ref_simple_routing(votes, 3, coupling_over="outputs")
    over_heads = ref_simple_routing(votes, 3, coupling_over="heads")
    torch.testing.assert_close(out, over_outputs, rtol=1e-9, atol=1e-9)
    assert (out - over_heads).abs().max() > 1e-2


def test_squash_is_safe_at_zero():
    s = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    out = squash(s)
    out.sum().backward()
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isfinite(s.grad).all()
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)  # ‖x‖ = 5
    torch.testing.assert_close(squash(x), 25 / 26 * x / 5)


def test_gradcheck_simple_routing():
    votes = torch.randn(2, 3, 4, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: simple_routing(v, 3), (votes,))


def test_gradcheck_em_routing():
    g = torch.Generator().manual_seed(6)
    votes = torch.randn(2, 3, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    beta_a = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    beta_mu = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, a, m: em_routing(v, a, m, 3), (votes, beta_a, beta_mu))


# --------------------------------------------------------------------------------------------------
# degenerate votes, reduced precision
# --------------------------------------------------------------------------------------------------


def _degenerate_votes(kind):
    g = torch.Generator().manual_seed(7)
    if kind == "identical":  # all heads cast the same vote for every output capsule
        return torch.randn(6, 1, 16, 1, generator=g).expand(6, 4, 16, 1).contiguous()
    if kind == "zero":
        return torch.zeros(6, 4, 16, 1)
    if kind == "large":
        return 1e4 * torch.randn(6, 4, 16, 1, generator=g)
    if kind == "large_wide":
        return 1e4 * torch.randn(6, 4, 8, 3, generator=g)
    raise AssertionError(kind)


def _run_core(core, votes, betas):
    if core == "simple":
        return simple_routing(votes, 3)
    return em_routing(votes, betas[0], betas[1], 3)


@pytest.mark.parametrize("core", ["simple", "em"])
@pytest.mark.parametrize("kind", ["identical", "zero", "large", "large_wide"])
@pytest.mark.parametrize("precision", ["float32", "bfloat16_input", "autocast_bf16"])
def test_degenerate_votes_give_finite_outputs_and_gradients(core, kind, precision):
    base = _degenerate_votes(kind)
    N = base.shape[-2]
    leaf = base.clone().requires_grad_(True)
    betas = (torch.zeros(N, requires_grad=True), torch.ones(N, requires_grad=True))
    if precision == "autocast_bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            votes = torch.matmul(leaf, torch.eye(leaf.shape[-1]))  # autocast runs matmul in bf16
            assert votes.dtype == torch.bfloat16
            out = _run_core(core, votes, betas)
    else:
        votes = leaf.to(torch.bfloat16) if precision == "bfloat16_input" else leaf
        out = _run_core(core, votes, betas)
    assert out.dtype == votes.dtype and out.shape == base.shape[:-3] + base.shape[-2:]
    assert torch.isfinite(out).all()
    (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    assert torch.isfinite(leaf.grad).all()
    if core == "em":
        assert all(torch.isfinite(b.grad).all() for b in betas)

    v = votes.detach().float()
    if kind == "zero":
        assert torch.equal(out.float(), torch.zeros_like(out.float()))
    if kind == "identical":  # every weighting of identical votes is that vote: μ_n = s_n = V_n
        if core == "simple":
            torch.testing.assert_close(out.float(), squash(v[:, 0]), rtol=1e-2, atol=1e-3)
        else:  # Ω_n = A_n V_n with 0 < A_n < 1: same sign, smaller magnitude
            ratio = out.float() / v[:, 0]
            assert ((ratio > 0) & (ratio < 1)).all()


@pytest.mark.parametrize("core", ["simple", "em"])
def test_half_precision_input_is_routed_in_float32(core):
    g = torch.Generator().manual_seed(8)
    votes = torch.randn(32, 4, 16, 1, generator=g).to(torch.bfloat16)
    betas = (torch.randn(16, generator=g), torch.randn(16, generator=g))
    low = _run_core(core, votes, betas)
    high = _run_core(core, votes.float(), betas)
    assert low.dtype == torch.bfloat16
    assert torch.equal(low, high.to(torch.bfloat16))


def test_routing_asserts_its_options():
    """The options are validated by routing_plan (tests/methods/routing/test_routing_model.py); the cores only
    assert them."""
    votes = torch.randn(2, 3, 4, 1)
    for it in (0, -1, 1.5, True):
        with pytest.raises(AssertionError, match="routing iterations must be an integer >= 1"):
            simple_routing(votes, it)
        with pytest.raises(AssertionError, match="routing iterations must be an integer >= 1"):
            em_routing(votes, 0.0, 0.0, it)
    with pytest.raises(AssertionError, match="unknown routing type 'dynamic'"):
        get_routing_function("dynamic")
    with pytest.raises(AssertionError, match="eps must be > 0"):
        em_routing(votes, 0.0, 0.0, 3, eps=0.0)


# --------------------------------------------------------------------------------------------------
# the aggregation module
# --------------------------------------------------------------------------------------------------


def _n_params(module):
    return sum(p.numel() for p in module.parameters())


def test_parameter_count_matches_spec():
    simple = RoutingAggregation(512, 8, routing="simple", num_capsules=512)
    em = RoutingAggregation(512, 8, routing="em")  # N defaults to E
    assert _n_params(simple) == 2_364_928  # docs/methods.md#votes
    assert em.num_capsules == 512
    assert _n_params(em) == 2_364_928 + 2 * 512  # + β_A, β_μ per output capsule


def test_aggregator_options_are_validated():
    with pytest.raises(AssertionError, match="must be >= 1 and divide embed_dim"):
        RoutingAggregation(32, 4, routing="em", num_capsules=5)
    with pytest.raises(AssertionError, match="unknown routing type"):
        RoutingAggregation(32, 4, routing="dynamic")
    with pytest.raises(AssertionError, match="iterations"):
        RoutingAggregation(32, 4, routing="simple", iterations=0)
    with pytest.raises(ValueError, match="eps"):
        RoutingAggregation(32, 4, routing="em", eps=1e-2)
    agg = RoutingAggregation(32, 4, routing="simple", num_capsules=8, iterations=2)
    assert (agg.routing, agg.num_capsules, agg.capsule_dim, agg.iterations) == ("simple", 8, 4, 2)


@pytest.mark.parametrize("routing,num_capsules", [("simple", None), ("em", None), ("em", 8), ("simple", 4)])
def test_aggregator_forward_composes_vote_network_and_routing(routing, num_capsules):
    torch.manual_seed(9)
    E, H = 32, 4
    agg = RoutingAggregation(E, H, routing=routing, num_capsules=num_capsules).double()
    if routing == "em":
        with torch.no_grad():
            agg.beta_a.normal_()
            agg.beta_mu.normal_()
    x = torch.randn(7, 3, E, dtype=torch.float64)  # [T, B, E]
    out = agg(x)
    assert out.shape == x.shape

    N = num_capsules or E
    u = F.relu(F.linear(F.layer_norm(x, (E,), agg.layer_norm.weight, agg.layer_norm.bias),
                        agg.fc1.weight, agg.fc1.bias))
    votes = F.linear(u, agg.fc2.weight, agg.fc2.bias).view(7, 3, H, N, E // N)
    if routing == "em":
        expected = ref_em_routing(votes, agg.beta_a, agg.beta_mu, 3, eps=agg.eps)
    else:
        expected = ref_simple_routing(votes, 3)
    torch.testing.assert_close(out, expected.reshape(7, 3, E), rtol=1e-8, atol=1e-9)

    out.pow(2).sum().backward()  # every parameter is used (unused ones break pytorch_ddp)
    for name, p in agg.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_aggregator_under_autocast_bf16():
    torch.manual_seed(10)
    agg = RoutingAggregation(32, 4, routing="em")
    x = torch.randn(5, 2, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = agg(x)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), agg(x), rtol=0.1, atol=0.05)
    out.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in agg.parameters())


# --------------------------------------------------------------------------------------------------
# optional torch.compile path
# --------------------------------------------------------------------------------------------------


def test_compile_switch(monkeypatch):
    """One switch, the ``compile`` argument (``--routing-compile``); the environment is not read."""
    monkeypatch.setenv("DIVERSE_FAIRSEQ_COMPILE_ROUTING", "1")  # the removed variable: no effect
    assert get_routing_function("em") is em_routing
    assert get_routing_function("simple") is simple_routing
    assert RoutingAggregation(16, 2, routing="em")._route is em_routing
    assert get_routing_function("em", compile=True) is not em_routing
    assert RoutingAggregation(16, 2, routing="em", compile=True)._route is get_routing_function("em", compile=True)


def test_em_routing_traces_as_one_graph():
    """Dynamo + AOT autograd capture em_routing without graph breaks and reproduce it (no C++ build)."""
    g = torch.Generator().manual_seed(12)
    votes = torch.randn(5, 4, 6, 2, generator=g, requires_grad=True)
    beta_a = torch.randn(6, generator=g, requires_grad=True)
    beta_mu = torch.randn(6, generator=g, requires_grad=True)
    traced = torch.compile(em_routing, backend="aot_eager", fullgraph=True)
    out = traced(votes, beta_a, beta_mu, 3, None, 1e-6)
    grads = torch.autograd.grad(out.pow(2).sum(), (votes, beta_a, beta_mu))
    ref = em_routing(votes, beta_a, beta_mu, 3, None, 1e-6)
    ref_grads = torch.autograd.grad(ref.pow(2).sum(), (votes, beta_a, beta_mu))
    torch.testing.assert_close(out, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)


def _compiler_available():
    if not hasattr(torch, "compile"):
        return "torch.compile is not available in this torch build"
    if shutil.which("g++") is None and shutil.which("c++") is None and shutil.which("clang++") is None:
        return "no C++ compiler on PATH for TorchInductor's CPU backend"
    return None


@pytest.mark.slow  # a cold TorchInductor build takes ~30-60 s per core on a small CPU machine
@pytest.mark.parametrize("core", ["em", "simple"])
def test_compiled_routing_matches_eager(core):
    """EM with two iterations already runs every branch of its loop (the uniform M-step, the E-step, the weighted
    M-step); a third only repeats them in the unrolled graph, a third more of TorchInductor's cold build. Simple
    routing needs three: its agreement update adds to earlier logits only from the second update on."""
    reason = _compiler_available()
    if reason:
        pytest.skip(reason)
    fn = get_routing_function(core, compile=True)
    eager = em_routing if core == "em" else simple_routing
    assert fn is not eager
    g = torch.Generator().manual_seed(11)
    votes = torch.randn(12, 4, 16, 1, generator=g, requires_grad=True)
    beta_a = torch.randn(16, generator=g, requires_grad=True)
    beta_mu = torch.randn(16, generator=g, requires_grad=True)
    args = (votes, beta_a, beta_mu, 2, None, 1e-6) if core == "em" else (votes, 3)
    inputs = (votes, beta_a, beta_mu) if core == "em" else (votes,)
    try:
        out = fn(*args)
    except Exception as exc:  # noqa: BLE001  (compiler toolchain problems surface as many types)
        pytest.skip(f"torch.compile failed on this machine: {type(exc).__name__}: {str(exc)[:200]}")
    grads = torch.autograd.grad(out.pow(2).sum(), inputs)
    ref = eager(*args)
    ref_grads = torch.autograd.grad(ref.pow(2).sum(), inputs)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
