"""label_smoothed_cross_entropy_with_disagreement, in process: the loss, the taps it sets, its checks."""

import gc

import pytest
import torch
from _disagreement_utils import batch, build, tiny_task
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.logging import metrics
from fairseq.models.transformer import TransformerModel
from test_disagreement_functions import naive_cosine, naive_overlap

from diverse_fairseq.methods.disagreement.criterion import LabelSmoothedCrossEntropyWithDisagreementCriterion
from diverse_fairseq.methods.sites import attention_sites, observe
from diverse_fairseq.methods.transformer import DiverseTransformerModel

pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")


@pytest.fixture(scope="module")
def task():
    return tiny_task()


def criterion(task, **kw):
    return LabelSmoothedCrossEntropyWithDisagreementCriterion(task, sentence_avg=False, label_smoothing=0.1, **kw)


def reference_similarity(heads, sites, sample, pad, terms, types, weighting="sides"):
    """sim_total from the recorded heads with plain loops: masked token mean, layer mean, then per term the
    encoder side (enc_self) plus the decoder side: the mean of the selected decoder-side types (``sides``), or
    the plain sum over the types (``sum``)."""
    src_pad = sample["net_input"]["src_tokens"].eq(pad)
    tgt_pad = sample["target"].eq(pad)
    total, per_key = 0.0, {}
    for attention_type in types:
        mods = [heads(s) for s in sites if s.attention_type == attention_type]
        for term in terms:
            vals = []
            for m in mods:
                if term == "sub":
                    vals.append(naive_cosine(m["v"].detach(), tgt_pad if attention_type == "dec_self" else src_pad))
                elif term == "out":
                    vals.append(naive_cosine(m["o"].detach(), src_pad if attention_type == "enc_self" else tgt_pad))
                else:
                    vals.append(naive_overlap(m["a"].detach(), src_pad if attention_type == "enc_self" else tgt_pad))
            per_key[f"{term}_{attention_type}"] = sum(vals) / len(vals)
    for term in terms:
        encoder = [per_key[f"{term}_{t}"] for t in types if t == "enc_self"]
        decoder = [per_key[f"{term}_{t}"] for t in types if t != "enc_self"]
        total += sum(encoder)
        if decoder:
            total += sum(decoder) / (len(decoder) if weighting == "sides" else 1)
    return total, per_key


@pytest.mark.parametrize(
    "terms,types,weighting",
    [("out", "enc_self,dec_self,enc_dec", "sides"), ("sub,pos,out", "enc_self,dec_self,enc_dec", "sides"),
     ("pos", "enc_dec", "sides"), ("sub", "dec_self,enc_self", "sides"), ("out", "enc_self,dec_self,enc_dec", "sum"),
     ("sub,out", "enc_dec,dec_self", "sum")],
)
def test_loss_is_ce_plus_lambda_sample_size_similarity(task, terms, types, weighting):
    model = build(DiverseTransformerModel, "diverse_transformer", task).train()
    sample = batch(task)
    crit = criterion(task, disagreement_lambda=0.7, disagreement_terms=terms, disagreement_attention=types,
                     disagreement_weighting=weighting)
    loss, sample_size, log = crit(model, sample)
    # nothing stays on the modules; record the heads again for the reference with a plain forward
    sites = attention_sites(model)
    assert all(s.module.observer is None for s in sites)
    with observe(sites, crit.taps) as seen:
        net_output = model(**sample["net_input"])
    ce, _ = LabelSmoothedCrossEntropyCriterion(task, False, 0.1).compute_loss(model, net_output, sample)
    ref_total, ref_keys = reference_similarity(seen.heads, sites, sample, task.target_dictionary.pad(),
                                               terms.split(","), types.split(","), weighting)
    assert sample_size == sample["ntokens"]
    assert loss.item() == pytest.approx(ce.item() + 0.7 * sample_size * ref_total, rel=1e-5)
    for key, value in ref_keys.items():
        assert log[f"sim_{key}"].item() / sample_size == pytest.approx(value, rel=1e-5, abs=1e-6)
    assert {k for k in log if k.startswith("sim_")} == {f"sim_{k}" for k in ref_keys} | {"sim_total"}


def test_default_weighting_is_encoder_plus_decoder_mean(task):
    """The authors' weighting by default: at the first update, the added loss is
    λ·sample_size·(enc_self + (dec_self + enc_dec)/2), read back from the logged per-type values; ``sum``
    adds the three with weight 1."""
    model = build(DiverseTransformerModel, "diverse_transformer", task).train()
    sample = batch(task)
    ce, _, _ = LabelSmoothedCrossEntropyCriterion(task, False, 0.1)(model, sample)
    added = {}
    for weighting in ("sides", "sum"):
        kw = {} if weighting == "sides" else {"disagreement_weighting": "sum"}
        loss, sample_size, log = criterion(task, **kw)(model, sample)  # the default: out on all three types
        enc, dec, ed = (log[f"sim_out_{t}"].item() / sample_size for t in ("enc_self", "dec_self", "enc_dec"))
        added[weighting] = (loss - ce).item() / sample_size
        expected = enc + (dec + ed) / 2 if weighting == "sides" else enc + dec + ed
        assert added[weighting] == pytest.approx(expected, rel=1e-4)
        assert log["sim_total"].item() / sample_size == pytest.approx(expected, rel=1e-5)
    assert added["sum"] - added["sides"] == pytest.approx((dec + ed) / 2, rel=1e-3)


def test_unknown_weighting_is_refused(task):
    with pytest.raises(ValueError, match="--disagreement-weighting must be one of sides, sum"):
        criterion(task, disagreement_weighting="mean")


def test_taps_only_what_the_terms_need(task):
    model = build(DiverseTransformerModel, "diverse_transformer", task)
    crit = criterion(task, disagreement_terms="sub,out", disagreement_attention="enc_self,enc_dec",
                     disagreement_layers="1")
    taps = {}  # what each attention module records during the criterion's forward
    for site in attention_sites(model):
        site.module.register_forward_pre_hook(
            lambda mod, args, key=site.key: taps.__setitem__(key, mod.observer.taps if mod.observer else frozenset()))
    crit(model, batch(task))
    for key, recorded in taps.items():
        selected = key[0] in ("enc_self", "enc_dec") and key[1] == 1
        assert recorded == (frozenset({"v", "o"}) if selected else frozenset()), key
    criterion(task, disagreement_terms="pos")(model, batch(task))
    assert len(taps) == 6 and all(recorded == frozenset({"a"}) for recorded in taps.values())


def test_lambda_zero_logs_without_regularizing(task):
    model = build(DiverseTransformerModel, "diverse_transformer", task).train()
    sample = batch(task)
    loss0, _, log0 = criterion(task, disagreement_lambda=0.0)(model, sample)
    ce, _, _ = LabelSmoothedCrossEntropyCriterion(task, False, 0.1)(model, sample)
    assert (loss0 - ce).abs().item() <= 1e-4
    assert log0["sim_out_enc_self"] > 0
    # with λ > 0 the attention parameters get an extra gradient
    q = model.encoder.layers[0].self_attn.v_proj.weight
    g0 = torch.autograd.grad(loss0, q)[0]
    loss1, _, _ = criterion(task, disagreement_lambda=1.0)(model, sample)
    g1 = torch.autograd.grad(loss1, q)[0]
    assert (g1 - g0).abs().max() > 1e-4


def test_logged_similarity_is_a_sample_size_weighted_mean():
    logs = [
        {"loss": torch.tensor(10.0), "nll_loss": torch.tensor(9.0), "ntokens": 10, "nsentences": 2,
         "sample_size": 10, "sim_out_enc_self": torch.tensor(0.5 * 10), "sim_total": torch.tensor(0.5 * 10)},
        {"loss": torch.tensor(30.0), "nll_loss": torch.tensor(27.0), "ntokens": 30, "nsentences": 5,
         "sample_size": 30, "sim_out_enc_self": torch.tensor(0.1 * 30), "sim_total": torch.tensor(0.1 * 30)},
    ]
    with metrics.aggregate() as agg:
        LabelSmoothedCrossEntropyWithDisagreementCriterion.reduce_metrics(logs)
    assert agg.get_smoothed_values()["sim_out_enc_self"] == pytest.approx(0.2)
    assert agg.get_smoothed_values()["sim_total"] == pytest.approx(0.2)


@pytest.mark.parametrize(
    "kw,flag",
    [
        (dict(disagreement_lambda=-1.0), "--disagreement-lambda"),
        (dict(disagreement_lambda=float("nan")), "--disagreement-lambda"),
        (dict(disagreement_terms="out,diff"), "--disagreement-terms"),
        (dict(disagreement_terms=""), "--disagreement-terms"),
        (dict(disagreement_attention="enc_self,cross"), "--disagreement-attention"),
        (dict(disagreement_layers="0,x"), "--disagreement-layers"),
        (dict(disagreement_layers="0,,1"), "--disagreement-layers"),
        (dict(disagreement_layers="none"), "--disagreement-layers none would regularize nothing"),
    ],
)
def test_bad_flags_fail_at_construction(task, kw, flag):
    with pytest.raises(ValueError, match=flag):
        criterion(task, **kw)


def test_layer_out_of_range_is_named(task):
    model = build(DiverseTransformerModel, "diverse_transformer", task)
    with pytest.raises(ValueError, match="--disagreement-layers 5: layer index 5 is out of range for 2 layers of "
                                         "enc_self attention"):
        criterion(task, disagreement_layers="5").regularized_sites(model)


@pytest.mark.parametrize("value,expected", [
    (None, [0, 1]), ("all", [0, 1]), ("ALL", [0, 1]), ("0", [0]), ("-1", [1]), ("1,0", [0, 1]), ([1], [1]),
])
def test_layer_selection(task, value, expected):
    """The shared layer syntax (methods.options): all, 0-based indices, negative ones from the last layer."""
    model = build(DiverseTransformerModel, "diverse_transformer", task)
    crit = criterion(task, disagreement_layers=value)
    sites = crit.regularized_sites(model)
    assert {t: [s.layer for s in sites if s.attention_type == t] for t in crit.attention_types} == \
        {t: expected for t in ("enc_self", "dec_self", "enc_dec")}


def test_disagreement_flags_without_the_criterion_are_rejected_by_fairseq(capsys):
    """``--disagreement-*`` are registered by the criterion's config only: with label_smoothed_cross_entropy
    fairseq's parser refuses them as unrecognized arguments (so they can never be silently ignored)."""
    from conftest import USER_DIR
    from fairseq import options

    argv = ["unused-data", "--user-dir", USER_DIR, "--task", "translation", "--arch", "diverse_transformer",
            "--criterion", "label_smoothed_cross_entropy", "--disagreement-lambda", "0.5"]
    with pytest.raises(SystemExit):
        options.parse_args_and_arch(options.get_training_parser(), argv)
    assert "unrecognized arguments: --disagreement-lambda 0.5" in capsys.readouterr().err


def test_refuses_a_model_without_heads(task):
    model = build(TransformerModel, "transformer", task)
    with pytest.raises(ValueError, match="needs a model whose attention modules expose their heads"):
        criterion(task)(model, batch(task))


def test_refuses_a_module_with_one_head(task):
    """The one check of the head count for training: where the criterion meets the model."""
    model = build(DiverseTransformerModel, "diverse_transformer", task, extra=["--decoder-attention-heads", "1"])
    with pytest.raises(ValueError, match=r"dec_self attention of layer 0 has 1 head; disagreement needs at least 2"):
        criterion(task).regularized_sites(model)
    assert criterion(task, disagreement_attention="enc_self").regularized_sites(model)  # 4 encoder heads: fine


def test_sites_follow_the_model_not_its_id(task):
    """The criterion remembers its model by a weak reference: it does not keep the model alive, and a new model
    (which may reuse a freed model's id) gets its own sites."""
    crit = criterion(task)
    first = build(DiverseTransformerModel, "diverse_transformer", task)
    assert crit.regularized_sites(first) is crit.regularized_sites(first)  # selected once per model
    del first
    gc.collect()
    assert crit._prepared_for() is None
    second = build(DiverseTransformerModel, "diverse_transformer", task)
    modules = set(map(id, second.modules()))
    assert all(id(site.module) in modules for site in crit.regularized_sites(second))


def test_refuses_checkpoint_activations(task):
    model = build(DiverseTransformerModel, "diverse_transformer", task, extra=["--checkpoint-activations"])
    with pytest.raises(ValueError, match="--checkpoint-activations"):
        criterion(task)(model, batch(task))
