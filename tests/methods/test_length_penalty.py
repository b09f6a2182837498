"""GNMT's length penalty (``--task translation_length_penalty --length-penalty gnmt``) and THUMT's length limit.

A fake model with fixed next-token log-probabilities decodes one source sentence, so each hypothesis' score can be
computed by hand: its log-probability (the sum of its positional scores) divided by the penalty of its length
(EOS included).
"""

import math
from argparse import Namespace

import pytest
import torch
from conftest import lines
from fairseq.data import Dictionary
from fairseq.models import FairseqDecoder, FairseqEncoder, FairseqEncoderDecoderModel
from fairseq.sequence_generator import SequenceGenerator

from diverse_fairseq.methods.length_penalty import (
    GnmtSequenceGenerator,
    TranslationLengthPenaltyConfig,
    TranslationLengthPenaltyTask,
    gnmt_length_penalty,
)
from diverse_fairseq.methods.thumt_search import ThumtSequenceGenerator

ALPHA = 0.6
# the first word: "a" then EOS (|y| = 2), or "b" then "b" then EOS (|y| = 3); P(b b EOS) < P(a EOS), by a margin
# that fairseq's |y|^0.6 makes up for and GNMT's ((5 + |y|)/6)^0.6 does not
P_A, P_B = 0.53, 0.47
JUNK = -30.0  # the logit of every other word: e^-30 of the mass each


def dictionary():
    d = Dictionary()
    for word in ("a", "b", "c", "d"):
        d.add_symbol(word)
    return d


class FixedEncoder(FairseqEncoder):
    def forward(self, src_tokens, src_lengths=None):
        return {"src_tokens": [src_tokens]}

    def reorder_encoder_out(self, encoder_out, new_order):
        return {"src_tokens": [encoder_out["src_tokens"][0].index_select(0, new_order)]}


class FixedDecoder(FairseqDecoder):
    """Next-token logits fixed by the prefix: after BOS, "a" or "b" (log P_A, log P_B); after one "b", "b";
    after anything else, EOS; every other word JUNK. ``eos_logit`` replaces EOS's logit everywhere (to test the
    length limit with a model that never ends)."""

    def __init__(self, d: Dictionary, eos_logit=None):
        super().__init__(d)
        self.a, self.b, self.eos_logit = d.index("a"), d.index("b"), eos_logit

    def next_logits(self, prefix):
        logits = torch.full((len(self.dictionary),), JUNK)
        words = prefix[1:].tolist()  # prefix[0] is the BOS (fairseq's EOS)
        if not words:
            logits[self.a], logits[self.b] = math.log(P_A), math.log(P_B)
        elif words == [self.b]:
            logits[self.b] = 0.0
        else:
            logits[self.dictionary.eos()] = 0.0
        if self.eos_logit is not None:
            logits[self.dictionary.eos()] = self.eos_logit
        return logits

    def forward(self, prev_output_tokens, encoder_out=None, **kwargs):
        rows = [self.next_logits(p) for p in prev_output_tokens]
        return torch.stack(rows).unsqueeze(1).expand(-1, prev_output_tokens.size(1), -1).clone(), None


def fixed_model(eos_logit=None):
    d = dictionary()
    return FairseqEncoderDecoderModel(FixedEncoder(d), FixedDecoder(d, eos_logit)).eval(), d


def task(length_penalty, beam_search="fairseq"):
    d = dictionary()
    cfg = TranslationLengthPenaltyConfig(length_penalty=length_penalty, beam_search=beam_search)
    return TranslationLengthPenaltyTask(cfg, d, d)


def decode(length_penalty, src_len=3, beam=2, beam_search="fairseq", **gen):
    """The hypotheses of one source sentence of ``src_len`` words, best first."""
    model, d = fixed_model(gen.pop("eos_logit", None))
    generator = task(length_penalty, beam_search).build_generator([model], Namespace(beam=beam, lenpen=ALPHA, **gen))
    src = torch.cat([torch.full((1, src_len), d.index("c")), torch.tensor([[d.eos()]])], dim=1)
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([src_len + 1])}}
    with torch.no_grad():
        return generator.generate([model], sample)[0], d


def words(hypo, d):
    return d.string(hypo["tokens"])


def test_gnmt_penalty_formula():
    assert gnmt_length_penalty(1, ALPHA) == 1.0  # (5 + 1) / 6
    assert gnmt_length_penalty(7, ALPHA) == pytest.approx(2 ** ALPHA)
    assert gnmt_length_penalty(7, 0.0) == 1.0


def test_task_builds_the_generator_of_its_option():
    model, _ = fixed_model()
    args = Namespace(beam=2, lenpen=ALPHA)
    gnmt = task("gnmt").build_generator([model], args)
    assert isinstance(gnmt, GnmtSequenceGenerator) and gnmt.gnmt_alpha == ALPHA
    fairseq = task("fairseq").build_generator([model], args)
    assert type(fairseq) is SequenceGenerator and fairseq.len_penalty == ALPHA
    for penalty in ("gnmt", "fairseq"):
        thumt = task(penalty, "thumt").build_generator([model], args)
        assert type(thumt) is ThumtSequenceGenerator and (thumt.penalty_form, thumt.alpha) == (penalty, ALPHA)


@pytest.mark.parametrize("length_penalty", ["gnmt", "fairseq"])
def test_scores_equal_a_hand_computed_reference(length_penalty):
    """Every finished hypothesis' score is its log-probability over the penalty of its length, EOS included."""
    hypos, _ = decode(length_penalty, beam=4)
    assert len(hypos) == 4
    for hypo in hypos:
        length = len(hypo["tokens"])  # the words and the EOS
        assert hypo["tokens"][-1].item() == dictionary().eos()
        expected_penalty = ((5 + length) / 6) ** ALPHA if length_penalty == "gnmt" else length ** ALPHA
        log_prob = sum(hypo["positional_scores"].tolist())
        assert hypo["score"].item() == pytest.approx(log_prob / expected_penalty, rel=1e-5)
    assert [h["score"].item() for h in hypos] == sorted((h["score"].item() for h in hypos), reverse=True)


def test_gnmt_changes_the_ranking_of_a_short_and_a_long_hypothesis():
    """P(a EOS) = 0.53 > P(b b EOS) = 0.47. fairseq's |y|^0.6 divides the long one's log-probability by
    (3/2)^0.6 = 1.28 more than the short one's, and ranks it first; GNMT's ((5 + |y|)/6)^0.6 only by
    (8/7)^0.6 = 1.08, and keeps the more probable short one first."""
    by_hand = {
        "fairseq": (math.log(P_A) / 2 ** ALPHA, math.log(P_B) / 3 ** ALPHA),
        "gnmt": (math.log(P_A) / (7 / 6) ** ALPHA, math.log(P_B) / (8 / 6) ** ALPHA),
    }
    assert by_hand["fairseq"][1] > by_hand["fairseq"][0] and by_hand["gnmt"][0] > by_hand["gnmt"][1]
    fairseq, d = decode("fairseq")
    gnmt, _ = decode("gnmt")
    assert [words(h, d) for h in fairseq[:2]] == ["b b", "a"]
    assert [words(h, d) for h in gnmt[:2]] == ["a", "b b"]
    assert [h["score"].item() for h in gnmt[:2]] == pytest.approx(by_hand["gnmt"], rel=1e-5)
    assert [h["score"].item() for h in fairseq[:2]] == pytest.approx(by_hand["fairseq"][::-1], rel=1e-5)


def test_unnormalized_scores_stay_unnormalized():
    hypos, _ = decode("gnmt", unnormalized=True)
    for hypo in hypos:
        assert hypo["score"].item() == pytest.approx(sum(hypo["positional_scores"].tolist()), rel=1e-5)


@pytest.mark.parametrize("src_len", [1, 7])
def test_thumt_length_limit_is_source_length_plus_50(src_len):
    """THUMT (utils/inference.py) decodes at most |x| + 50 steps, |x| the source's length with its EOS: a hypothesis
    that ends has at most |x| + 49 words before its EOS; fairseq's --max-len-a 1 --max-len-b 49 gives the same
    limit, since its source length counts the EOS too (the THUMT settings' values,
    diverse_fairseq.runs.settings.THUMT_MAX_LEN). A model that never ends hits it: fairseq's search ends the
    hypothesis with a forced EOS after |x| + 49 words, THUMT's returns it without an EOS, |x| + 50 words."""
    from diverse_fairseq.runs.settings import THUMT_MAX_LEN

    x = src_len + 1
    hypos, d = decode("gnmt", src_len=src_len, eos_logit=-100.0, **THUMT_MAX_LEN)
    assert len(hypos[0]["tokens"]) - 1 == x + 49 and hypos[0]["tokens"][-1] == d.eos()
    hypos, d = decode("gnmt", src_len=src_len, eos_logit=-100.0, beam_search="thumt", **THUMT_MAX_LEN)
    assert len(hypos[0]["tokens"]) == x + 50 and d.eos() not in hypos[0]["tokens"]
    assert hypos[0]["score"].item() == pytest.approx(sum(hypos[0]["positional_scores"].tolist())
                                                     / gnmt_length_penalty(x + 50, ALPHA), rel=1e-5)


def hypotheses(out):
    """{id: (score, positional scores)} of fairseq-generate's or fairseq-interactive's H- and P- lines."""
    scores = {line.split("\t")[0][2:]: float(line.split("\t")[1]) for line in out.splitlines() if line.startswith("H-")}
    positional = {line.split("\t")[0][2:]: [float(x) for x in line.split("\t")[1].split()]
                  for line in out.splitlines() if line.startswith("P-")}
    assert scores.keys() == positional.keys()
    return {key: (score, positional[key]) for key, score in scores.items()}


def test_fairseq_train_generate_and_interactive_decode_with_thumts_search(tiny_data, tiny_raw, tiny_args, tmp_path):
    """Through fairseq-train, fairseq-generate and fairseq-interactive with --user-dir (their ``main``, in this
    process), with THUMT's search (``--beam-search thumt``): fairseq-train's validation BLEU (--eval-bleu) decodes
    through the task, and fairseq-generate and fairseq-interactive score every hypothesis (H, base 2) as the sum
    of its positional scores (P) over GNMT's penalty of its length (EOS included where it ends with one).
    (fairseq's search with GNMT's penalty, and a routing model through THUMT's search: the tests above, and
    test_thumt_search.py.)"""
    from fairseq_in_process import fairseq_generate, fairseq_interactive, fairseq_train

    from diverse_fairseq.user_dir import USER_DIR

    gnmt = ["--task", "translation_length_penalty", "--length-penalty", "gnmt"]
    train = [a for a in tiny_args(tiny_data, tmp_path / "ck", max_update=1) if a not in ("--task", "translation")]
    log = fairseq_train([*train, *gnmt, "--beam-search", "thumt", "--eval-bleu", "--eval-bleu-args",
                         '{"beam": 2, "lenpen": 0.6, "max_len_a": 1, "max_len_b": 4}', "--eval-bleu-detok", "space",
                         "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"])
    # the model of one update ends every validation sentence at once (an empty output, which THUMT's search allows):
    # BLEU 0, where fairseq would log no BLEU and stop on the missing --best-checkpoint-metric
    assert "| valid on 'valid' subset |" in log and "| bleu 0 " in log
    decoding = ["--path", tmp_path / "ck" / "checkpoint_best.pt", "--user-dir", USER_DIR, *gnmt, "--cpu", "--beam",
                "2", "--lenpen", "0.6", "--max-len-a", "1", "--max-len-b", "4", "--beam-search", "thumt",
                "--min-len", "3"]  # no EOS before the fourth token: --min-len applies to THUMT's search above 1
    found = hypotheses(fairseq_generate([tiny_data, *decoding, "--gen-subset", "test", "--batch-size", "64",
                                         "--required-batch-size-multiple", "1"]))
    (tmp_path / "input.en").write_text("\n".join(lines(tiny_raw / "test.en")[:3]) + "\n", encoding="utf-8")
    out = fairseq_interactive([tiny_data, *decoding, "--source-lang", "en", "--target-lang", "de",
                               "--input", tmp_path / "input.en"])
    interactive = hypotheses(out)
    assert len(found) == 40 and len(interactive) == 3
    for score, p in [*found.values(), *interactive.values()]:
        assert score == pytest.approx(sum(p) / gnmt_length_penalty(len(p), ALPHA), abs=2e-3) and len(p) >= 4
