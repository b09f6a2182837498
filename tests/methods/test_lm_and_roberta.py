"""The three methods beyond translation: transformer_lm (language_modeling) and RoBERTa (sentence_prediction).

In-process tests build tiny models from fairseq's own option parsing and train them a few steps on fixed
synthetic batches; the two ``slow`` tests run fairseq-train (its ``main``, in this process) on a corpus binarized
here."""

import itertools
import pickle

import pytest
import torch
import torch.nn.functional as F
from conftest import USER_DIR
from fairseq import options, tasks
from fairseq.criterions.cross_entropy import CrossEntropyCriterion
from fairseq.criterions.sentence_prediction import SentencePredictionConfig, SentencePredictionCriterion
from fairseq.data import data_utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq_in_process import fairseq_preprocess, fairseq_train
from test_disagreement_e2e import parse_log

from diverse_fairseq.methods.attention import DiverseMultiheadAttention
from diverse_fairseq.methods.language_models import take_tensors
from diverse_fairseq.methods.sites import attention_sites, observe

WORDS = [f"w{i}" for i in range(30)]
TINY = {
    "lm": ["--task", "language_modeling", "--tokens-per-sample", "32", "--decoder-layers", "2",
           "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "4"],
    "roberta": ["--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2",
                "--max-positions", "32", "--encoder-layers", "2", "--encoder-embed-dim", "32",
                "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--attention-dropout", "0.0"],
}
ARCH = {"lm": ("transformer_lm", "diverse_transformer_lm"), "roberta": ("roberta", "diverse_roberta")}
CRITERION = {"lm": ("cross_entropy", "cross_entropy_with_disagreement"),
             "roberta": ("sentence_prediction", "sentence_prediction_with_disagreement")}
SELF = {"lm": "dec_self", "roberta": "enc_self"}  # the one attention type of each family
FAMILIES = ("lm", "roberta")


@pytest.fixture(scope="module")
def dicts(tmp_path_factory):
    """Data folders holding only the dictionaries (all that setting up the tasks reads)."""
    root = tmp_path_factory.mktemp("dicts")
    words = "".join(f"{w} 1\n" for w in WORDS)
    for sub, text in (("lm", words), ("cls/input0", words), ("cls/label", "neg 1\npos 1\n")):
        (root / sub).mkdir(parents=True)
        (root / sub / "dict.txt").write_text(text)
    return root


#: command line -> its fairseq configuration, pickled: fairseq composes it with hydra (~0.6 s of CPU each time) and
#: several tests build the same models. Each caller unpickles a copy of its own, as fresh as a new composition (a
#: deepcopy would not do: the model config holds the Namespace that building the model adds its defaults to)
_CONFIGS = {}


def setup(dicts, family, arch, *extra):
    data = dicts / ("lm" if family == "lm" else "cls")
    argv = [str(data), "--user-dir", USER_DIR, "--cpu", "--arch", arch, *TINY[family], "--dropout", "0.0", *extra]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)  # parsed every time (it may refuse)
    if tuple(argv) not in _CONFIGS:
        _CONFIGS[tuple(argv)] = pickle.dumps(convert_namespace_to_omegaconf(args))
    cfg = pickle.loads(_CONFIGS[tuple(argv)])
    return cfg, tasks.setup_task(cfg.task)


def build(dicts, family, arch, *extra, seed=0):
    cfg, task = setup(dicts, family, arch, *extra)
    torch.manual_seed(seed)
    return cfg, task, task.build_model(cfg.model)


def batch(family, task, bsz=6, seed=0):
    """A right-padded batch of sentences of different lengths (LM: input and shifted target; RoBERTa:
    <s> sentence </s> with the parity of its first word as label)."""
    d = task.source_dictionary
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(d.nspecial, len(d), (4 + (3 * i) % 8,), generator=g) for i in range(bsz)]
    if family == "lm":
        return {"net_input": {"src_tokens": data_utils.collate_tokens([s[:-1] for s in seqs], d.pad()),
                              "src_lengths": torch.tensor([len(s) - 1 for s in seqs])},
                "target": data_utils.collate_tokens([s[1:] for s in seqs], d.pad()),
                "ntokens": sum(len(s) - 1 for s in seqs), "nsentences": bsz}
    src = [torch.cat([torch.tensor([d.bos()]), s, torch.tensor([d.eos()])]) for s in seqs]
    return {"net_input": {"src_tokens": data_utils.collate_tokens(src, d.pad()),
                          "src_lengths": torch.tensor([len(s) for s in src])},
            "target": torch.stack([s[0] % 2 for s in seqs]), "ntokens": sum(map(len, src)), "nsentences": bsz}


def logits(family, model, sample):
    head = {"classification_head_name": "sentence_classification_head"} if family == "roberta" else {}
    return model(**sample["net_input"], **head)[0]


# ------------------------------------------------------------------------------ the models


@pytest.mark.parametrize("family", FAMILIES)
def test_sites_are_the_self_attention_of_the_one_stack(dicts, family):
    for arch in ARCH[family]:
        _, _, model = build(dicts, family, arch)
        sites = attention_sites(model)
        assert [(s.attention_type, s.layer) for s in sites] == [(SELF[family], 0), (SELF[family], 1)]
        assert all(isinstance(s.module, DiverseMultiheadAttention) == arch.startswith("diverse") for s in sites)


@pytest.mark.parametrize("family", FAMILIES)
def test_diverse_variant_is_the_stock_model(dicts, family):
    """Same seed: the same parameters (names and values); a stock state dict loads strictly; same outputs."""
    _, task, stock = build(dicts, family, ARCH[family][0])
    _, _, diverse = build(dicts, family, ARCH[family][1])
    a, b = stock.state_dict(), diverse.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    _, _, other = build(dicts, family, ARCH[family][1], seed=1)
    other.load_state_dict(a, strict=True)
    sample = batch(family, task)
    for m in (stock, diverse, other):
        m.eval()
    with torch.no_grad():
        ref = logits(family, stock, sample)
        assert torch.equal(logits(family, diverse, sample), ref)
        assert torch.allclose(logits(family, other, sample), ref, atol=1e-6)


LM_VARIANTS = {
    "plain": [],
    "tied_learned_pos": ["--share-decoder-input-output-embed", "--decoder-learned-pos"],
    "adaptive": ["--adaptive-input", "--adaptive-input-cutoff", "10,20", "--adaptive-softmax-cutoff", "10,20",
                 "--tie-adaptive-weights", "--decoder-input-dim", "32", "--decoder-output-dim", "32"],
}


@pytest.mark.parametrize("variant", LM_VARIANTS)
def test_diverse_lm_is_built_once_from_the_stock_tensors(dicts, variant):
    """The diverse LM makes exactly the stock model's random draws (its decoder is built on the meta device and
    takes the stock decoder's tensors instead of being a second model), equals it parameter for parameter, keeps
    its ties, has no tensor left on the meta device and gives the same outputs."""
    models, rng = [], []
    for arch in ARCH["lm"]:
        _, task, model = build(dicts, "lm", arch, *LM_VARIANTS[variant])
        models.append(model.eval())
        rng.append(torch.get_rng_state())
    stock, diverse = models
    assert torch.equal(*rng)
    a, b = stock.state_dict(), diverse.state_dict()
    assert list(a) == list(b)
    # _float_tensor: fairseq's uninitialised one-element marker of dtype and device, in the adaptive modules
    assert all(torch.equal(a[k], b[k]) for k in a if not k.endswith("._float_tensor"))

    def tied(m):
        return {n for n, _ in m.named_parameters(remove_duplicate=False)} - {n for n, _ in m.named_parameters()}
    assert tied(diverse) == tied(stock)
    assert not any(t.is_meta for t in [*diverse.parameters(), *diverse.buffers()])
    sample = batch("lm", task)
    with torch.no_grad():
        assert torch.equal(logits("lm", diverse, sample), logits("lm", stock, sample))


def test_take_tensors_refuses_a_module_of_another_structure():
    with torch.device("meta"):
        target = torch.nn.Sequential(torch.nn.Linear(3, 4))
    with pytest.raises(ValueError, match="does not match"):
        take_tensors(target, torch.nn.Sequential(torch.nn.Linear(3, 4, bias=False)))
    with pytest.raises(ValueError, match="does not match"):
        take_tensors(target, torch.nn.Sequential(torch.nn.Conv1d(3, 4, 1), torch.nn.ReLU()))


# ------------------------------------------------------------------------------ disagreement


def _slow_similarity(x, keep, term):
    """Mean over kept (b, t) of (1/H²) Σ_i Σ_j sim(head i, head j): EMNLP 2018 Eqs. 1-3 as loops."""
    vals = []
    for b, t in itertools.product(range(x.shape[0]), range(x.shape[2])):
        if keep[b, t]:
            pair = (lambda u, v: (u * v).sum()) if term == "pos" else (lambda u, v: F.cosine_similarity(u, v, dim=0))
            vals.append(sum(pair(x[b, i, t], x[b, j, t]) for i in range(x.shape[1]) for j in range(x.shape[1])))
    return torch.stack(vals).mean() / x.shape[1] ** 2


@pytest.mark.parametrize("family", FAMILIES)
def test_disagreement_loss_and_gradients_match_a_slow_reference(dicts, family):
    lam = 0.5
    name = CRITERION[family][1]
    cfg, task, model = build(dicts, family, ARCH[family][1], "--criterion", name, "--disagreement-terms",
                             "sub,pos,out", "--disagreement-lambda", str(lam))
    criterion = task.build_criterion(cfg.criterion)
    sample = batch(family, task)
    loss, size, log = criterion(model, sample)
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)

    plain = (CrossEntropyCriterion(task, False) if family == "lm"
             else SentencePredictionCriterion(SentencePredictionConfig(), task))
    sites = attention_sites(model)
    with observe(sites, "vao") as seen:
        ref, ref_size, _ = plain(model, sample)
    tokens = sample["target"] if family == "lm" else sample["net_input"]["src_tokens"]
    keep = tokens.ne(task.source_dictionary.pad())
    sims = {term: torch.stack([_slow_similarity(seen.heads(s)[tap], keep, term) for s in sites]).mean()
            for term, tap in (("sub", "v"), ("pos", "a"), ("out", "o"))}
    ref = ref + lam * ref_size * sum(sims.values())
    ref_grads = torch.autograd.grad(ref, list(model.parameters()), allow_unused=True)

    assert size == ref_size == (sample["ntokens"] if family == "lm" else 6)
    assert torch.allclose(loss, ref, rtol=1e-5)
    for term in sims:
        assert torch.allclose(log[f"sim_{term}_{SELF[family]}"] / size, sims[term], atol=1e-5)
    for g, r in zip(grads, ref_grads):
        assert (g is None) == (r is None) and (g is None or torch.allclose(g, r, atol=1e-5, rtol=1e-4))


def _train(family, model, criterion, sample, steps=15, lr=0.01):
    """Adam on one fixed batch; the logging outputs of the first and the last forward."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    logs = []
    for _ in range(steps):
        opt.zero_grad()
        loss, _, log = criterion(model, sample)
        loss.backward()
        opt.step()
        logs.append(log)
    return logs[0], logs[-1]


@pytest.mark.parametrize("family", FAMILIES)
def test_disagreement_spreads_the_heads_and_the_loss_falls(dicts, family):
    runs = {}
    for lam in ("0", "1"):  # λ = 0 only logs the similarity
        cfg, task, model = build(dicts, family, ARCH[family][1], "--criterion", CRITERION[family][1],
                                 "--disagreement-lambda", lam)
        runs[lam] = _train(family, model, task.build_criterion(cfg.criterion), batch(family, task))
    key = f"sim_out_{SELF[family]}"
    (first0, last0), (first1, last1) = runs["0"], runs["1"]
    assert torch.equal(first0[key], first1[key])  # same start
    assert last1[key] < 0.5 * last0[key]
    assert last1["loss"] < first1["loss"] and last0["loss"] < first0["loss"]


@pytest.mark.parametrize("family", FAMILIES)
def test_disagreement_needs_observable_heads_and_an_attention_type_the_model_has(dicts, family):
    cfg, task, model = build(dicts, family, ARCH[family][0], "--criterion", CRITERION[family][1])
    with pytest.raises(ValueError, match="diverse_transformer_lm\\*, diverse_roberta\\*"):
        task.build_criterion(cfg.criterion)(model, batch(family, task))
    other = "enc_self" if family == "lm" else "dec_self"
    cfg, task, model = build(dicts, family, ARCH[family][1], "--criterion", CRITERION[family][1],
                             "--disagreement-attention", other)
    with pytest.raises(ValueError, match=f"--disagreement-attention {other}: .* \\(it has {SELF[family]}\\)"):
        task.build_criterion(cfg.criterion)(model, batch(family, task))


# ------------------------------------------------------------------------------ routing


@pytest.mark.parametrize("family", FAMILIES)
def test_routing_is_installed_trains_and_keeps_causality_and_padding(dicts, family):
    flag = "--routing-decoder-layers" if family == "lm" else "--routing-encoder-layers"
    cfg, task, model = build(dicts, family, ARCH[family][1], flag, "0", "--routing-type", "simple",
                             "--criterion", CRITERION[family][0])
    routed = [s.key for s in attention_sites(model) if s.module.aggregator is not None]
    assert (routed == [(SELF[family], 0)]
            and not any(True for _ in attention_sites(model)[0].module.out_proj.parameters()))
    sample = batch(family, task)
    first, last = _train(family, model, task.build_criterion(cfg.criterion), sample, steps=10)
    assert last["loss"] < first["loss"]
    model.eval()
    src = sample["net_input"]["src_tokens"][:1, :6].clone()  # a sentence without padding
    with torch.no_grad():
        if family == "lm":  # routing acts per position: changing the last token leaves the others' outputs
            out = model(src)[0]
            src[0, -1] = (src[0, -1] + 1 - task.source_dictionary.nspecial) % 30 + task.source_dictionary.nspecial
            assert torch.allclose(model(src)[0][:, :-1], out[:, :-1], atol=1e-6)
        else:  # padded positions are not routed and not attended: appending padding changes nothing
            out = model(src, features_only=True)[0]
            padded = F.pad(src, (0, 3), value=task.source_dictionary.pad())
            assert torch.allclose(model(padded, features_only=True)[0][:, :6], out, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_stock_checkpoint_loads_into_a_routed_model(dicts, family, caplog):
    """Fine-tuning a pre-trained stock model with routing: fairseq's strict load succeeds, every parameter the
    two models share is the checkpoint's, the routed layer's out_proj is dropped with a warning naming it and
    its aggregator keeps its initialisation; the routed model's own checkpoint loads back unchanged."""
    flag = "--routing-decoder-layers" if family == "lm" else "--routing-encoder-layers"
    _, _, stock = build(dicts, family, ARCH[family][0], seed=1)
    _, _, routed = build(dicts, family, ARCH[family][1], flag, "0", "--routing-type", "em")
    name = next(n for n, m in routed.named_modules() if m is attention_sites(routed)[0].module)
    before = {k: v.clone() for k, v in routed.state_dict().items()}
    checkpoint = stock.state_dict()
    with caplog.at_level("WARNING"):
        routed.load_state_dict(dict(checkpoint), strict=True)
    after = routed.state_dict()
    dropped = [k for k in checkpoint if k not in after]
    assert dropped and all(k.startswith(f"{name}.out_proj.") for k in dropped)
    assert all(torch.equal(after[k], checkpoint[k]) for k in checkpoint if k in after)
    new = [k for k in after if k not in checkpoint]
    assert new and all(k.startswith(f"{name}.aggregator.") for k in new)
    assert all(torch.equal(after[k], before[k]) for k in new)
    assert f"{name}: the checkpoint has no routing aggregator" in caplog.text
    own = {k: v.clone() for k, v in after.items()}
    routed.load_state_dict(dict(own), strict=True)
    assert all(torch.equal(routed.state_dict()[k], own[k]) for k in own)


@pytest.mark.parametrize("family", FAMILIES)
def test_bad_routing_flags_are_refused(dicts, family):
    own, foreign = (("--routing-decoder-layers", "--routing-encoder-layers") if family == "lm"
                    else ("--routing-encoder-layers", "--routing-decoder-layers"))
    with pytest.raises(SystemExit):  # the stack the model lacks has no flag
        setup(dicts, family, ARCH[family][1], foreign, "0")
    with pytest.raises(ValueError, match=f"{own} 2: layer index 2 is out of range for 2 layers"):
        build(dicts, family, ARCH[family][1], own, "2")
    with pytest.raises(ValueError, match=f"--routing-type simple would do nothing.*{own} 0,1, or drop"):
        build(dicts, family, ARCH[family][1], "--routing-type", "simple")


# ------------------------------------------------------------------------------ repulsive attention


def _pairwise(x):  # [M, D] -> distances of the M(M-1)/2 pairs
    i, j = torch.triu_indices(x.shape[0], x.shape[0], 1)
    return (x[i] - x[j]).norm(dim=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_repulsive_optimizer_moves_the_heads_of_stock_models_apart(dicts, family):
    from fairseq import optim

    cfg, task, model = build(dicts, family, ARCH[family][0], "--optimizer", "repulsive_adam", "--lr", "0.005",
                             "--repulsive-alpha", "0.5")
    opt = optim.build_optimizer(cfg.optimizer, list(model.parameters()))
    assert sorted((t.attention_type, t.layer_idx, t.projection) for t in opt.particle_tags) == sorted(
        itertools.product([SELF[family]], [0, 1], "qkv"))
    before = [p.detach().clone().view(4, -1) for p in opt.particle_params]
    opt.zero_grad()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # no loss gradient: the SVGD direction is the repulsion alone
    for b, a in zip(before, (p.detach().view(4, -1) for p in opt.particle_params)):
        assert (_pairwise(a) > _pairwise(b)).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_repulsive_attention_type_the_model_lacks_is_refused(dicts, family):
    from fairseq import optim

    other = "enc_self" if family == "lm" else "dec_self,enc_dec"
    cfg, task, model = build(dicts, family, ARCH[family][0], "--optimizer", "repulsive_adam", "--lr", "0.005",
                             "--repulsive-attention", other)
    with pytest.raises(ValueError, match=f"the model has no {other} attention \\(it has {SELF[family]}"):
        optim.build_optimizer(cfg.optimizer, list(model.parameters()))


# ------------------------------------------------------------------------------ fairseq-train, end to end


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """A tiny LM corpus and a two-class sentence corpus (label: parity of the first word), binarized."""
    import random

    root = tmp_path_factory.mktemp("lm_cls")
    rng = random.Random(0)

    def sentence():
        start = rng.randrange(30)
        return " ".join(WORDS[(start + 3 * k) % 30] for k in range(rng.randint(4, 12)))

    for split, n in (("train", 300), ("valid", 40)):
        (root / f"lm.{split}").write_text("".join(sentence() + "\n" for _ in range(n)))
        rows = [sentence() for _ in range(n)]
        (root / f"cls.{split}.input0").write_text("".join(r + "\n" for r in rows))
        (root / f"cls.{split}.label").write_text("".join(("pos" if int(r.split()[0][1:]) % 2 else "neg") + "\n"
                                                          for r in rows))
    for prefix, dest in (("lm", "lm-bin"), ("cls.{}.input0", "cls-bin/input0"), ("cls.{}.label", "cls-bin/label")):
        pref = {s: root / (prefix.format(s) if "{}" in prefix else f"{prefix}.{s}") for s in ("train", "valid")}
        fairseq_preprocess(["--only-source", "--trainpref", pref["train"], "--validpref", pref["valid"],
                            "--destdir", root / dest, "--workers", "1"])
    return root


E2E = {
    "lm": ["--sample-break-mode", "complete", "--criterion", "cross_entropy_with_disagreement",
           "--routing-decoder-layers", "0"],
    "roberta": ["--criterion", "sentence_prediction_with_disagreement", "--routing-encoder-layers", "0",
                "--init-token", "0", "--separator-token", "2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_fairseq_train_with_all_three_methods(corpora, tmp_path, family):
    data = corpora / ("lm-bin" if family == "lm" else "cls-bin")
    log = fairseq_train([
        data, "--user-dir", USER_DIR, "--cpu", "--arch", ARCH[family][1], *TINY[family], *E2E[family],
        "--dropout", "0.0", "--optimizer", "repulsive_adam", "--lr", "0.005", "--max-tokens", "512",
        "--max-update", "30", "--save-dir", tmp_path, "--no-save", "--log-format", "simple",
        "--log-interval", "5", "--seed", "1", "--num-workers", "0"])
    rows = parse_log(log)
    key = f"sim_out_{SELF[family]}"
    assert rows[-1]["num_updates"] == 30 and key in rows[0]
    assert rows[-1]["loss"] < rows[0]["loss"] and rows[-1][key] < rows[0][key]
