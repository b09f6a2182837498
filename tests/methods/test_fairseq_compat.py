"""The properties that fairseq's own tests check for its Transformer (inference dropout, TorchScript export and
scripted generation, generation, checkpoints), checked for our classes against stock fairseq.

fairseq's test files for these need its ``tests/utils.py``, which its sdist does not ship; the self-contained ones
run with our classes swapped in, in test_fairseq_suite.py.
"""

import pytest
import torch
from _disagreement_utils import batch, build, model_args, tiny_task
from fairseq import checkpoint_utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models.transformer import TransformerModel
from fairseq.modules.fairseq_dropout import FairseqDropout
from fairseq.sequence_generator import SequenceGenerator
from omegaconf import OmegaConf

from diverse_fairseq.methods.transformer import DiverseTransformerModel

ROUTED = ["--routing-encoder-layers", "0", "--routing-decoder-layers", "1", "--routing-encoder-decoder-layers", "0",
          "--routing-iterations", "2"]
#: fairseq's names of the dropout modules of its legacy Transformer: encoder, its layers, attention
RETAINED = ["TransformerEncoder", "TransformerEncoderLayerBase", "MultiheadAttention"]


@pytest.fixture(scope="module")
def task():
    return tiny_task()


def dropout_flags(model):
    """{dropout module path: (its module_name, whether it applies at inference)}"""
    return {name: (m.module_name, m.apply_during_inference) for name, m in model.named_modules()
            if isinstance(m, FairseqDropout)}


def test_dropout_modules_have_fairseqs_names(task):
    stock = build(TransformerModel, "transformer", task)
    ours = build(DiverseTransformerModel, "diverse_transformer", task, extra=ROUTED)
    names = {name: flags[0] for name, flags in dropout_flags(ours).items()}
    assert names == {name: flags[0] for name, flags in dropout_flags(stock).items()}
    assert set(names.values()) == {"TransformerEncoder", "TransformerDecoder", "TransformerEncoderLayerBase",
                                   "TransformerDecoderLayerBase", "MultiheadAttention"}


def test_retain_dropout_modules_with_fairseqs_names_keeps_those_dropouts(task):
    """``--retain-dropout --retain-dropout-modules`` with fairseq's names: the same dropout modules stay on as in
    stock fairseq (fairseq's test_inference_dropout.py::test_retain_modules, with the attention added)."""
    flags = []
    for cls, arch in ((TransformerModel, "transformer"), (DiverseTransformerModel, "diverse_transformer")):
        args = model_args(arch)  # (the generation options, as fairseq-generate sets them)
        args.retain_dropout, args.retain_dropout_modules = True, RETAINED
        torch.manual_seed(0)
        model = cls.build_model(args, task)
        model.prepare_for_inference_(convert_namespace_to_omegaconf(args))
        flags.append(dropout_flags(model))
    stock, ours = flags
    assert ours == stock
    kept = {name for name, (_, on) in ours.items() if on}
    assert "encoder.dropout_module" in kept and "encoder.layers.1.dropout_module" in kept
    assert "decoder.layers.0.encoder_attn.dropout_module" in kept  # MultiheadAttention covers the decoder's too
    assert not {"decoder.dropout_module", "decoder.layers.0.dropout_module"} & kept


def generate(generator, model, sample):
    with torch.no_grad():
        out = generator.generate([model], sample)
    return [(h[0]["tokens"].tolist(), h[0]["positional_scores"]) for h in out]


def assert_same_hypotheses(a, b, atol=0.0):
    assert [tokens for tokens, _ in a] == [tokens for tokens, _ in b]
    for (_, x), (_, y) in zip(a, b):
        torch.testing.assert_close(x, y, atol=atol, rtol=0)


def test_generation_without_a_method_equals_stock_with_the_same_weights(task):
    stock = build(TransformerModel, "transformer", task, seed=1).eval()
    ours = build(DiverseTransformerModel, "diverse_transformer", task, seed=2).eval()
    ours.load_state_dict(stock.state_dict())
    sample = batch(task)
    hyps = [generate(SequenceGenerator([m], task.target_dictionary, beam_size=3, max_len_b=8), m, sample)
            for m in (stock, ours)]
    assert_same_hypotheses(*hyps)


@pytest.mark.parametrize("extra", [[], ROUTED], ids=["plain", "routed"])
def test_scripted_model_and_generator_match_eager(task, extra, tmp_path):
    """``torch.jit.script`` (fairseq's export and scripted ``SequenceGenerator``): the scripted model gives the eager
    outputs (up to float rounding, as for stock: its eager path uses a fused kernel) and the same hypotheses."""
    model = build(DiverseTransformerModel, "diverse_transformer", task, extra=extra).eval()
    sample = batch(task)
    net_input = sample["net_input"]
    scripted = torch.jit.script(model)
    with torch.no_grad():
        eager_out = model(**net_input)[0]
        scripted_out = scripted(net_input["src_tokens"], net_input["src_lengths"], net_input["prev_output_tokens"])[0]
    torch.testing.assert_close(scripted_out, eager_out, atol=1e-5, rtol=0)
    eager = generate(SequenceGenerator([model], task.target_dictionary, beam_size=2, max_len_b=6), model, sample)
    generator = torch.jit.script(SequenceGenerator([model], task.target_dictionary, beam_size=2, max_len_b=6))
    with torch.no_grad():
        out = generator._generate({"net_input": {k: net_input[k] for k in ("src_tokens", "src_lengths")}})
    assert_same_hypotheses(eager, [(h[0]["tokens"].tolist(), h[0]["positional_scores"]) for h in out], atol=1e-5)
    if not extra:  # the routing core is Python (an autograd Function): only the plain model saves
        scripted.save(str(tmp_path / "model.pt"))
        loaded = torch.jit.load(str(tmp_path / "model.pt"))
        with torch.no_grad():
            torch.testing.assert_close(loaded(net_input["src_tokens"], net_input["src_lengths"],
                                              net_input["prev_output_tokens"])[0], scripted_out, atol=0, rtol=0)


@pytest.mark.parametrize("extra", [[], ROUTED], ids=["plain", "routed"])
def test_checkpoint_round_trip_through_fairseqs_checkpoint_utils(task, extra, tmp_path):
    args = model_args("diverse_transformer", extra)
    torch.manual_seed(0)
    model = DiverseTransformerModel.build_model(args, task).eval()
    path = str(tmp_path / "checkpoint.pt")
    # the checkpoint layout fairseq's trainer writes: the state dict and the configuration as plain containers
    cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
    history = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam", "lr_scheduler_state": {},
                "num_updates": 7}]
    checkpoint_utils.torch_persistent_save({"model": model.state_dict(), "cfg": cfg, "optimizer_history": history,
                                            "extra_state": {}, "last_optimizer_state": None}, path)
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    assert state["optimizer_history"][-1]["num_updates"] == 7
    torch.manual_seed(1)
    loaded = DiverseTransformerModel.build_model(args, task).eval()
    loaded.load_state_dict(state["model"], model_cfg=state["cfg"].model)
    sample = batch(task)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**sample["net_input"])[0], model(**sample["net_input"])[0], atol=0, rtol=0)
