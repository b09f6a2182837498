"""THUMT's beam search (``--task translation_length_penalty --beam-search thumt``) against a slow, plain port of the
authors' ``utils/inference.py`` (Diversify-MHA, ``_beam_search_step`` and ``beam_search``, commit 677fe2a) written
here, on a fake model whose next-word log-probabilities are a fixed table indexed by a hash of the source and
the prefix: the same translations (the whole n-best list, with scores) for every source, over a few hundred random
sources of varied lengths, decoded in batches with several beam sizes, penalties and length limits.

The fake model decodes incrementally: its decoder keeps the prefix's hash in fairseq's incremental state and
updates it with the last word only, so a state the generator reorders wrongly gives other log-probabilities than
the reference computes from the whole prefix.
"""

import functools
import math
from argparse import Namespace

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import FairseqEncoder, FairseqEncoderDecoderModel, FairseqIncrementalDecoder

from diverse_fairseq.methods.length_penalty import (
    GnmtSequenceGenerator,
    TranslationLengthPenaltyConfig,
    TranslationLengthPenaltyTask,
)
from diverse_fairseq.methods.thumt_search import ThumtSequenceGenerator

WORDS = 12
STATES = 1009  # rows of the fake model's table (a prime): the prefix hash modulo this
#: the EOS logit's offset per source (by its hash): never ends (the length limit), ordinary, ends at once (empty)
EOS_SHIFTS = (-40.0, -3.0, 0.0, 0.0, 1.5, 6.0)
EOS_SLOPE = 0.75  # the EOS logit grows by this per word beyond the source length (exact in float32, as the shifts)


def dictionary():
    d = Dictionary()
    for i in range(WORDS):
        d.add_symbol(f"w{i}")
    return d


def table(vocab: int, d: Dictionary) -> torch.Tensor:
    g = torch.Generator().manual_seed(37)
    logits = torch.randn(STATES, vocab, generator=g) * 2.0
    logits[:, [d.bos(), d.pad()]] = -math.inf  # never chosen (fairseq masks the padding anyway)
    return logits


def next_hash(h, word):
    return (h * 31 + word * 7 + 1) % STATES


def eos_shift(h0, steps, src_words):
    """The EOS logit's shift for a source of hash ``h0`` and ``src_words`` words after ``steps`` words (exact)."""
    return EOS_SHIFTS[h0 % len(EOS_SHIFTS)] + EOS_SLOPE * (steps - src_words)


class HashEncoder(FairseqEncoder):
    """The source's hash and word count (padding and EOS excluded)."""

    def forward(self, src_tokens, src_lengths=None):
        d = self.dictionary
        words = src_tokens.ne(d.pad()) & src_tokens.ne(d.eos())
        h0 = torch.zeros(src_tokens.size(0), dtype=torch.long)
        for j in range(src_tokens.size(1)):
            h0 = torch.where(words[:, j], next_hash(h0, src_tokens[:, j]), h0)
        return {"h0": [h0], "words": [words.sum(1)]}

    def reorder_encoder_out(self, encoder_out, new_order):
        return {k: [v[0].index_select(0, new_order)] for k, v in encoder_out.items()}


class HashDecoder(FairseqIncrementalDecoder):
    """Next-word logits: the table's row of the prefix hash, the EOS logit shifted by :func:`eos_shift`;
    incrementally, the prefix hash is the state."""

    def __init__(self, d):
        super().__init__(d)
        self.logits = table(len(d), d)

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        h0, words = encoder_out["h0"][0], encoder_out["words"][0]
        steps = prev_output_tokens.size(1) - 1
        if incremental_state is not None:
            state = self.get_incremental_state(incremental_state, "prefix")
            h = h0 if state is None else next_hash(state["hash"], prev_output_tokens[:, -1])
            self.set_incremental_state(incremental_state, "prefix", {"hash": h})
        else:
            h = h0
            for j in range(1, prev_output_tokens.size(1)):
                h = next_hash(h, prev_output_tokens[:, j])
        out = self.logits[h]  # [N, V]: the table's row of each prefix hash
        shift = torch.tensor([eos_shift(a, steps, b) for a, b in zip(h0.tolist(), words.tolist())])
        out[:, self.dictionary.eos()] += shift
        return out[:, None, :], None

    def reorder_incremental_state(self, incremental_state, new_order):
        state = self.get_incremental_state(incremental_state, "prefix")
        if state is not None:
            self.set_incremental_state(incremental_state, "prefix", {"hash": state["hash"].index_select(0, new_order)})


def fake_model():
    d = dictionary()
    return FairseqEncoderDecoderModel(HashEncoder(d), HashDecoder(d)).eval(), d


def source_logprobs(model, d, source):
    """The reference's view of the model: ``prefix -> [V] log-probabilities`` for one source (a list of words),
    from the whole prefix."""
    h0 = 0
    for w in source:
        h0 = next_hash(h0, w)

    def logprobs(prefix):
        h = h0
        for w in prefix:
            h = next_hash(h, w)
        logits = model.decoder.logits[h].clone()
        logits[d.eos()] += eos_shift(h0, len(prefix), len(source))
        return torch.log_softmax(logits, dim=-1)
    return logprobs


# ------------------------------------------------------------------------------- the reference: THUMT, plainly
@functools.lru_cache(maxsize=None)
def penalty(form, alpha, n):
    """lp(n) in float32: GNMT's ((5 + n) / 6)^alpha or fairseq's n^alpha."""
    value = ((5.0 + n) / 6.0) ** alpha if form == "gnmt" else float(n) ** alpha
    return torch.tensor(value, dtype=torch.float32)


def thumt_reference(logprobs, beam, alpha, max_length, eos, form="gnmt"):
    """THUMT's search for one sentence, one hypothesis at a time: (n-best list of (tokens, score), best first;
    what happened). ``max_length``: THUMT's number of steps (source length with EOS + decode_length).

    At step t every live hypothesis (tokens, log P) is extended by every word; a candidate's score is
    log P / lp(t + 1). Of the 2·beam best candidates, those ending in EOS join the finished ones, which keep their
    beam best of all steps; the beam best others stay live, with log P = score · lp(t + 1) (THUMT's float32 round
    trip). The search stops once the worst finished score beats the best live log P over lp(max_length), or after
    max_length steps. Output: the finished ones, else (none finished) the live ones, without EOS."""
    live = [((), 0.0, 0.0)]  # (tokens, log P, score), best first; float32 values
    finished = []  # (score, tokens, rank among the step's candidates), best first
    happened = {"bound": False, "pool_replaced": False}
    for t in range(max_length):
        lp = penalty(form, alpha, t + 1)
        candidates = []  # (score, order, tokens); order: the position in THUMT's flattened [beam, V] scores
        for k, (tokens, log_p, _) in enumerate(live):
            scores = ((logprobs(tokens) + log_p) / lp).tolist()
            candidates += [(score, k * len(scores) + word, tokens + (word,)) for word, score in enumerate(scores)
                           if score != -math.inf]
        candidates.sort(key=lambda c: (-c[0], c[1]))
        best = candidates[: 2 * beam]
        ending = [(score, tokens, rank) for rank, (score, _, tokens) in enumerate(best) if tokens[-1] == eos]
        pool = sorted(finished + ending, key=lambda f: -f[0])[:beam]  # stable: the earlier first on a tie
        happened["pool_replaced"] |= len(finished) == beam and pool != finished
        finished = pool
        going = [(score, tokens) for score, _, tokens in best if tokens[-1] != eos][:beam]
        log_ps = (torch.tensor([score for score, _ in going], dtype=torch.float32) * lp).tolist()
        live = [(tokens, log_p, score) for (score, tokens), log_p in zip(going, log_ps)]
        worst = min((score for score, _, _ in finished), default=None)
        if worst is not None and worst > (torch.tensor(live[0][1]) / penalty(form, alpha, max_length)).item():
            happened["bound"] = t + 1 < max_length
            break
    if finished:
        happened["eos_beyond_beam"] = finished[0][2] >= beam  # the output was not among the step's first beam
        return [(list(tokens), score) for score, tokens, _ in finished], happened
    return [(list(tokens), score) for tokens, _, score in live], happened


def collate(sources, d):
    """Left-padded sources with their EOS, as fairseq's LanguagePairDataset collates them."""
    width = max(len(s) for s in sources) + 1
    src = torch.full((len(sources), width), d.pad(), dtype=torch.long)
    for i, s in enumerate(sources):
        src[i, width - len(s) - 1:] = torch.tensor([*s, d.eos()])
    return {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([len(s) + 1 for s in sources])}}


# ------------------------------------------------------------------------------------------- the comparison
#: (beam, alpha, max_len_b, penalty form): THUMT's own (beam 4, alpha 0.6) and others; the length limit is
#: max_len_a · |x| + max_len_b tokens before an EOS with max_len_a = 1, i.e. max_len_b + 1 more than THUMT's
#: decode_length counts (its source length has the EOS)
CONFIGS = [(4, 0.6, 5, "gnmt"), (4, 0.6, 2, "gnmt"), (1, 0.6, 5, "gnmt"), (3, 2.0, 6, "gnmt"), (5, 0.0, 3, "gnmt"),
           (2, 1.0, 4, "fairseq")]
SOURCES = 50  # per configuration: 300 in all
THUMT_DECODING = 2  # the first two configurations decode as the papers (beam 4, GNMT's penalty, alpha 0.6)


def sources(seed, d):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 11, (SOURCES,), generator=g).tolist()
    return [torch.randint(d.nspecial, len(d), (n,), generator=g).tolist() for n in lengths]


def task(length_penalty, beam_search):
    d = dictionary()
    return TranslationLengthPenaltyTask(
        TranslationLengthPenaltyConfig(length_penalty=length_penalty, beam_search=beam_search), d, d)


def generator_of(model, beam, alpha, max_len_b, form, beam_search="thumt", **gen):
    return task(form, beam_search).build_generator(
        [model], Namespace(beam=beam, lenpen=alpha, max_len_a=1, max_len_b=max_len_b, **gen))


def decode(generator, model, d, batches):
    """The generator's n-best lists [(tokens, score)] for each source of ``batches`` (lists of sources)."""
    out = []
    for srcs in batches:
        with torch.no_grad():
            hypos = generator.generate([model], collate(srcs, d))
        out += [[(h["tokens"].tolist(), h["score"].item()) for h in n_best] for n_best in hypos]
    return out


@pytest.fixture(scope="module")
def compared():
    """Per configuration: (sources, the generator's n-best lists, the reference's, what happened in each)."""
    model, d = fake_model()
    results = []
    for c, (beam, alpha, max_len_b, form) in enumerate(CONFIGS):
        srcs = sources(c, d)
        generator = generator_of(model, beam, alpha, max_len_b, form)
        assert isinstance(generator, ThumtSequenceGenerator)
        ours = decode(generator, model, d, [srcs[i: i + 16] for i in range(0, len(srcs), 16)])
        refs = [thumt_reference(source_logprobs(model, d, s), beam, alpha, len(s) + 1 + max_len_b + 1, d.eos(), form)
                for s in srcs]
        results.append((srcs, ours, [r for r, _ in refs], [h for _, h in refs]))
    return model, d, results


def test_thumt_search_gives_the_reference_ports_translations(compared):
    """Every source's whole n-best list (tokens and score) as the plain port of THUMT's search gives it, and the
    cases where THUMT's search is not fairseq's all occur among them: the output an EOS candidate beyond the first
    beam of its step, a later finished hypothesis pushing out an earlier one, the stop by THUMT's bound before the
    length limit, the limit reached with no EOS (the output has none), an empty output."""
    _, d, results = compared
    counts = dict(eos_beyond_beam=0, pool_replaced=0, bound=0, no_eos=0, empty=0)
    for (beam, _, max_len_b, _), (srcs, ours, refs, happened) in zip(CONFIGS, results):
        for src, mine, ref, how in zip(srcs, ours, refs, happened):
            assert [tokens for tokens, _ in mine] == [tokens for tokens, _ in ref], (beam, src)
            assert [score for _, score in mine] == pytest.approx([score for _, score in ref], rel=1e-6, abs=1e-6)
            assert len(mine) <= beam
            if mine[0][0][-1] != d.eos():  # at the limit: |x| + 1 (its EOS) + max_len_b + 1 words (THUMT's steps)
                assert all(len(tokens) == len(src) + max_len_b + 2 for tokens, _ in mine)
            counts["eos_beyond_beam"] += how.get("eos_beyond_beam", False)
            counts["pool_replaced"] += how["pool_replaced"]
            counts["bound"] += how["bound"]
            counts["no_eos"] += mine[0][0][-1] != d.eos()
            counts["empty"] += mine[0][0] == [d.eos()]
    assert all(counts.values()), counts
    print(f"cases among {len(CONFIGS) * SOURCES} sources: {counts}")


def test_fairseqs_search_translates_otherwise(compared):
    """fairseq's own search with GNMT's penalty (GnmtSequenceGenerator, the same length limit: each source in a
    batch of sources of its length) on the same model and sources, decoded as the papers (beam 4, alpha 0.6):
    how many best translations differ, and why (docs/methods.md, "Differences from the authors' code", gives
    these numbers: update it with them): 5 outputs are empty (fairseq's --min-len 1 forbids that), 20 reach the
    length limit without an EOS (fairseq forces one there), 8 are another search's choice, all 8 with a
    higher score under THUMT's search and all 8 an EOS candidate beyond the first beam of its step."""
    model, d, results = compared
    differ = dict(empty=0, no_eos=0, search=0, thumt_scores_higher=0, eos_beyond_beam=0)
    for (beam, alpha, max_len_b, form), (srcs, ours, _, happened) in zip(CONFIGS[:THUMT_DECODING], results):
        by_length = {}
        for i, s in enumerate(srcs):
            by_length.setdefault(len(s), []).append(i)
        generator = generator_of(model, beam, alpha, max_len_b, form, beam_search="fairseq")
        assert isinstance(generator, GnmtSequenceGenerator)
        hypos = decode(generator, model, d, [[srcs[i] for i in indices] for indices in by_length.values()])
        theirs = dict(zip((i for indices in by_length.values() for i in indices), hypos))
        for i, n_best in enumerate(ours):
            (mine, score), (other, other_score) = n_best[0], theirs[i][0]
            if mine == other:
                continue
            kind = "empty" if mine == [d.eos()] else "no_eos" if mine[-1] != d.eos() else "search"
            differ[kind] += 1
            differ["thumt_scores_higher"] += kind == "search" and score > other_score
            differ["eos_beyond_beam"] += kind == "search" and happened[i].get("eos_beyond_beam", False)
    print(f"fairseq's search translates otherwise among {THUMT_DECODING * SOURCES} sources: {differ}")
    assert differ == dict(empty=5, no_eos=20, search=8, thumt_scores_higher=8, eos_beyond_beam=8)


# ------------------------------------------------------------------------------------- a model of the plugin
ROUTED = ["--routing-encoder-layers", "0", "--routing-decoder-layers", "1", "--routing-encoder-decoder-layers", "0",
          "--routing-iterations", "2"]


def test_a_routed_model_decodes_incrementally_as_the_reference_from_whole_prefixes():
    """A routing-by-agreement Transformer of the plugin (random weights) through fairseq's incremental decoding
    (its attention caches reordered by the generator): the reference's translations, whose every step runs the
    model on the whole prefix."""
    from _disagreement_utils import batch, build, tiny_task

    from diverse_fairseq.methods.transformer import DiverseTransformerModel

    words = tiny_task()
    model = build(DiverseTransformerModel, "diverse_transformer", words, extra=ROUTED).eval()
    d = words.target_dictionary
    sample = batch(words, bsz=3)
    generator = TranslationLengthPenaltyTask(TranslationLengthPenaltyConfig(length_penalty="gnmt",
                                                                            beam_search="thumt"), d, d) \
        .build_generator([model], Namespace(beam=3, lenpen=0.6, max_len_a=1, max_len_b=2))
    with torch.no_grad():
        hypos = generator.generate([model], sample)
        for i, n_best in enumerate(hypos):
            src = sample["net_input"]["src_tokens"][i]
            src = src[src.ne(d.pad())][None]  # [1, |x|] with its EOS

            def logprobs(prefix, src=src):
                prev = torch.tensor([[d.eos(), *prefix]])
                out = model(src, torch.tensor([src.size(1)]), prev)
                return model.get_normalized_probs(out, log_probs=True)[0, -1]

            ref, _ = thumt_reference(logprobs, 3, 0.6, src.size(1) + 2 + 1, d.eos())
            assert [h["tokens"].tolist() for h in n_best] == [tokens for tokens, _ in ref]
            assert [h["score"].item() for h in n_best] == pytest.approx([score for _, score in ref], abs=1e-5)


def test_the_task_builds_thumts_search_for_validation_bleu():
    """fairseq-train's --eval-bleu decodes with the generator that the task's build_model builds from
    --eval-bleu-args: THUMT's search under --beam-search thumt, with those arguments."""
    from _disagreement_utils import model_args, tiny_task

    d = tiny_task().target_dictionary
    cfg = TranslationLengthPenaltyConfig(length_penalty="gnmt", beam_search="thumt", eval_bleu=True,
                                         eval_bleu_args='{"beam": 4, "lenpen": 0.6, "max_len_a": 1, "max_len_b": 49}',
                                         eval_bleu_detok="space")
    task = TranslationLengthPenaltyTask(cfg, d, d)
    task.build_model(model_args("diverse_transformer", ROUTED))
    generator = task.sequence_generator
    assert isinstance(generator, ThumtSequenceGenerator) and generator.penalty_form == "gnmt"
    assert (generator.beam_size, generator.alpha, generator.max_len_a, generator.max_len_b) == (4, 0.6, 1, 49)


@pytest.mark.parametrize("options, refused", [
    (dict(sampling=True), "Sampling"), (dict(diverse_beam_groups=2), "DiverseBeamSearch"),
    (dict(match_source_len=True), "--match-source-len"), (dict(no_repeat_ngram_size=2), "--no-repeat-ngram-size"),
    (dict(print_alignment="hard"), "--print-alignment"), (dict(prefix_size=1), "--prefix-size"),
], ids=["sampling", "diverse-beam", "match-source-len", "no-repeat-ngram", "print-alignment", "prefix"])
def test_what_thumts_search_does_not_have_is_refused(options, refused):
    model, d = fake_model()
    prefix = options.pop("prefix_size", None)
    with pytest.raises(ValueError, match=f"--beam-search thumt is THUMT's beam search and has no .*{refused}.*"
                                         r"--beam-search fairseq"):
        generator = generator_of(model, 2, 0.6, 3, "gnmt", **options)
        generator.generate([model], collate([[5, 6]], d), prefix_tokens=torch.tensor([[5]]) if prefix else None)
