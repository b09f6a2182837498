"""THUMT's beam search as a fairseq generator: ``--task translation_length_penalty --beam-search thumt``.

The EMNLP 2018, NAACL 2019 and journal papers decoded with the authors' THUMT fork (Diversify-MHA
``utils/inference.py``, ``_beam_search_step`` and ``beam_search``, lines 117-263 at commit 677fe2a; THUMT's own
``thumt/utils/inference.py`` of 2018 is the same search). It scores a hypothesis ``y`` by GNMT's normalised score
(Wu et al. 2016, "Google's Neural Machine Translation System", Eq. 14, without the coverage penalty)::

    score(y) = log P(y | x) / lp(|y|),    lp(n) = ((5 + n) / 6) ** alpha      (|y| counts the EOS)

and searches differently from fairseq's ``SequenceGenerator``. At step ``t`` (0-based; the candidates have
``t + 1`` tokens), for each sentence:

1. every live hypothesis is extended by every word; the ``2·beam`` best candidates by ``score`` are kept
   (:meth:`ThumtSequenceGenerator.step`);
2. those of the ``2·beam`` that end in EOS are finished hypotheses (fairseq finishes only an EOS among the first
   ``beam``), and join a pool of the ``beam`` best finished hypotheses of all steps so far: a hypothesis finished
   later, longer and better normalised, can push out one finished earlier (fairseq keeps the first ``beam`` to
   finish and ends the sentence);
3. the ``beam`` best of the candidates that do not end in EOS stay live; THUMT keeps their log-probability as
   ``score · lp(t + 1)`` (a float32 round trip through the division), and so does this port;
4. the sentence ends when its bound holds (``_is_finished``): the pool holds a finished hypothesis and its worst
   finished score beats the best live hypothesis' log-probability divided by the penalty of the longest
   length allowed, ``lp(max_length)``, or when ``max_length`` steps are done;
5. the output is the pool, best first; a sentence with no finished hypothesis at ``max_length`` returns its live
   hypotheses, best first, without an EOS (``max_length`` tokens);
6. an EOS is a candidate from the first step: the output may be empty. fairseq's ``--min-len`` (default 1, which
   forbids the EOS at the first step) applies only above 1.

``max_length`` is THUMT's ``source length + decode_length`` (the source length counting its EOS, as fairseq's
``src_lengths`` do): with fairseq's options ``min(max_len_a · |x| + max_len_b, max_len - 1) + 1`` steps, so
``--max-len-a 1 --max-len-b 49`` gives THUMT's ``decode_length=50``. THUMT takes the longest source of a batch for
every sentence of it; this port takes each sentence's own, so that a translation does not depend on its batch (it
is THUMT's translation of the sentence decoded alone). Where THUMT's batch goes on after one sentence's bound
holds, that sentence's output cannot change (every later finished hypothesis scores below its worst finished
one), so ending each sentence at its own bound gives the same translations.

With ``--length-penalty fairseq`` the same search divides by fairseq's ``n ** alpha`` instead; ``--unnormalized``
divides by 1. Penalties are computed in float32, as THUMT computes them.

The search runs batched on tensors (no Python loop over hypotheses in a step) with fairseq's incremental decoding:
the encoder runs once, the decoder steps with each model's incremental state, reordered with
``reorder_incremental_state`` / ``reorder_encoder_out`` as fairseq's own generator does, so every fairseq
encoder-decoder model decodes with it (routing-by-agreement included), also as an ensemble. Finished sentences
leave the batch. Not supported, and refused with the option to drop: ``--prefix-size``, ``--constraints``,
``--sampling``, ``--diverse-beam-groups``, ``--diversity-rate``, ``--match-source-len``, ``--no-repeat-ngram-size``,
``--lm-path`` and ``--print-alignment`` (:class:`~diverse_fairseq.methods.length_penalty.TranslationLengthPenaltyTask`
refuses the last).
"""

import math
from typing import Dict, List, Optional

import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator
from torch import Tensor

#: the options that make fairseq's task build another search than its plain beam search
OTHER_SEARCHES = "--sampling, --diverse-beam-groups, --diversity-rate, --match-source-len, --constraints"


def unsupported(options: str) -> ValueError:
    """The error for fairseq options that THUMT's search does not have."""
    return ValueError(f"--beam-search thumt is THUMT's beam search and has no {options}: drop it, or decode with "
                      f"fairseq's search (--beam-search fairseq)")


def length_penalties(form: str, alpha: float, longest: int, device=None) -> Tensor:
    """``lp(n)`` for ``n = 0 .. longest`` as a float32 tensor: GNMT's ``((5 + n) / 6) ** alpha`` (``form`` "gnmt",
    computed in float32 as THUMT's ``tf.pow``) or fairseq's ``n ** alpha`` ("fairseq")."""
    n = torch.arange(longest + 1, dtype=torch.float32, device=device)
    if form == "gnmt":
        return ((5.0 + n) / 6.0).pow(alpha)
    if form == "fairseq":
        return n.pow(alpha)
    raise ValueError(f"length penalty {form!r}: use 'gnmt' or 'fairseq'")


class ThumtSequenceGenerator(SequenceGenerator):
    """fairseq's ``SequenceGenerator`` with THUMT's beam search (this module's docstring); ``length_penalty`` is
    the penalty's form ("gnmt" or "fairseq"), ``len_penalty`` (``--lenpen``) its ``alpha``.

    Hypotheses as fairseq returns them (``tokens``, ``score``, ``positional_scores``, empty ``attention`` and
    ``alignment``), at most ``beam`` per sentence, best first: the finished ones (tokens ending in EOS), or, where
    none finished, the live ones at the length limit (no EOS)."""

    def __init__(self, models, tgt_dict, length_penalty: str = "gnmt", **kwargs):
        super().__init__(models, tgt_dict, **kwargs)
        refused = [flag for flag, on in (("--match-source-len", self.match_source_len),
                                         ("--no-repeat-ngram-size", self.repeat_ngram_blocker is not None),
                                         ("--lm-path", self.lm_model is not None)) if on]
        if type(self.search) is not search.BeamSearch:
            refused.append(f"{type(self.search).__name__} (one of {OTHER_SEARCHES})")
        if refused:
            raise unsupported(", ".join(refused))
        length_penalties(length_penalty, 0.0, 0)  # an unknown form: ValueError
        self.penalty_form = length_penalty
        self.alpha = float(self.len_penalty) if self.normalize_scores else 0.0

    def _generate(self, sample: Dict[str, Dict[str, Tensor]], prefix_tokens: Optional[Tensor] = None,
                  constraints: Optional[Tensor] = None, bos_token: Optional[int] = None):
        if prefix_tokens is not None or constraints is not None:
            raise unsupported("--prefix-size" if prefix_tokens is not None else "--constraints")
        net_input = sample["net_input"]
        src_tokens = net_input["src_tokens"]
        device = src_tokens.device
        # |x| with its EOS, as THUMT's source_length (fairseq's src_lengths count it too)
        src_lengths = net_input["src_lengths"] if "src_lengths" in net_input else src_tokens.ne(self.pad).sum(1)
        bsz, beam = src_tokens.size(0), self.beam_size
        # THUMT's max_length per sentence: fairseq's length limit (tokens before an EOS) + 1
        limit = (src_lengths.double() * self.max_len_a + self.max_len_b).long().clamp(0, int(self.max_len) - 1)
        max_steps = limit + 1  # [B]
        longest = int(max_steps.max())
        lp = length_penalties(self.penalty_form, self.alpha, longest, device)  # [longest + 1]

        encoder_outs = self.model.forward_encoder(net_input)
        encoder_outs = self.model.reorder_encoder_out(
            encoder_outs, torch.arange(bsz, device=device).repeat_interleave(beam))
        incremental_states: List[Dict[str, Dict[str, Optional[Tensor]]]] = [
            {} for _ in range(self.model.models_size)]

        # live hypotheses, [B·beam, ...] rows by sentence: tokens after the BOS column, each token's log-probability
        tokens = torch.full((bsz * beam, longest + 1), self.pad, dtype=torch.long, device=device)
        tokens[:, 0] = self.eos if bos_token is None else bos_token
        token_lprobs = torch.zeros(bsz * beam, longest, device=device)
        alive_lprob = torch.full((bsz, beam), -math.inf, device=device)  # log P, THUMT's alive_log_probs
        alive_lprob[:, 0] = 0.0  # one live hypothesis (the BOS) at the start
        alive_score = torch.zeros(bsz, beam, device=device)
        # the pool of finished hypotheses, [B, beam, ...], best first; unfilled places score -inf, flag False
        fin_score = torch.full((bsz, beam), -math.inf, device=device)
        fin_flag = torch.zeros(bsz, beam, dtype=torch.bool, device=device)
        fin_tokens = torch.full((bsz, beam, longest), self.pad, dtype=torch.long, device=device)
        fin_lprobs = torch.zeros(bsz, beam, longest, device=device)
        fin_len = torch.zeros(bsz, beam, dtype=torch.long, device=device)
        max_lp = lp[max_steps]  # [B] the penalty of the longest length, for the bound
        sentence = torch.arange(bsz, device=device)  # each row's index in the batch given
        finalized: List[List[Dict[str, Tensor]]] = [[] for _ in range(bsz)]
        reorder: Optional[Tensor] = None

        for t in range(longest):
            if reorder is not None:
                self.model.reorder_incremental_state(incremental_states, reorder)
                encoder_outs = self.model.reorder_encoder_out(encoder_outs, reorder)
            lprobs, _ = self.model.forward_decoder(tokens[:, : t + 1], encoder_outs, incremental_states,
                                                   self.temperature)  # [B·beam, V]
            lprobs = self._mask(lprobs, t)
            n = alive_lprob.size(0)
            rows, words, word_lprob, top_score, top_eos = self.step(lprobs, alive_lprob, lp[t + 1])

            # the pool: its beam best of the old pool and this step's EOS candidates (stable: ties keep the old)
            pool_score = torch.cat([fin_score, top_score.masked_fill(~top_eos, -math.inf)], 1)  # [B, 3·beam]
            fin_score, pick = pool_score.sort(dim=1, descending=True, stable=True)
            fin_score, pick = fin_score[:, :beam], pick[:, :beam]
            fin_flag = torch.cat([fin_flag, top_eos], 1).gather(1, pick)
            # the candidates' tokens: their live row's tokens, then the word (an EOS for the finished)
            cand_rows = rows.view(n, -1)  # [B, 2·beam] rows of the extended hypotheses
            cand_tokens = tokens[cand_rows.view(-1), 1:].view(n, 2 * beam, longest).clone()
            cand_tokens[:, :, t] = words.view(n, -1)
            cand_lprobs = token_lprobs[cand_rows.view(-1)].view(n, 2 * beam, longest).clone()
            cand_lprobs[:, :, t] = word_lprob.view(n, -1)
            fin_tokens = torch.cat([fin_tokens, cand_tokens], 1).gather(1, pick[:, :, None].expand(-1, -1, longest))
            fin_lprobs = torch.cat([fin_lprobs, cand_lprobs], 1).gather(1, pick[:, :, None].expand(-1, -1, longest))
            fin_len = torch.cat([fin_len, torch.full_like(top_eos, t + 1, dtype=torch.long)], 1).gather(1, pick)

            # the live hypotheses: the beam best candidates that do not end in EOS, their rows and words
            live_score, live = top_score.masked_fill(top_eos, -math.inf).sort(dim=1, descending=True, stable=True)
            live_score, live = live_score[:, :beam], live[:, :beam]  # [B, beam]
            live_rows = cand_rows.gather(1, live).view(-1)  # [B·beam] the rows they extend
            tokens = tokens.index_select(0, live_rows)
            tokens[:, t + 1] = words.view(n, -1).gather(1, live).view(-1)
            token_lprobs = token_lprobs.index_select(0, live_rows)
            token_lprobs[:, t] = word_lprob.view(n, -1).gather(1, live).view(-1)
            alive_score = live_score
            alive_lprob = live_score * lp[t + 1]  # THUMT's alive_log_probs = alive_scores * length_penalty

            # THUMT's _is_finished, per sentence: the worst finished beats the best live at the longest length
            worst_finished = fin_score.masked_fill(~fin_flag, math.inf).min(1).values
            bound = fin_flag.any(1) & (worst_finished > alive_lprob[:, 0] / max_lp)
            done = bound | (max_steps <= t + 1)
            if bool(done.any()):
                for i in done.nonzero().view(-1).tolist():
                    finalized[int(sentence[i])] = self._hypotheses(
                        i, fin_flag, fin_score, fin_tokens, fin_lprobs, fin_len, alive_score, tokens, token_lprobs,
                        t + 1)
                keep = ~done
                if not bool(keep.any()):
                    break
                alive_lprob, alive_score, max_steps, max_lp, sentence = (
                    x[keep] for x in (alive_lprob, alive_score, max_steps, max_lp, sentence))
                fin_score, fin_flag, fin_tokens, fin_lprobs, fin_len = (
                    x[keep] for x in (fin_score, fin_flag, fin_tokens, fin_lprobs, fin_len))
                tokens = tokens.view(n, beam, -1)[keep].view(-1, tokens.size(1))
                token_lprobs = token_lprobs.view(n, beam, -1)[keep].view(-1, token_lprobs.size(1))
                live_rows = live_rows.view(n, beam)[keep].view(-1)
            reorder = live_rows
        return finalized

    def _mask(self, lprobs: Tensor, t: int) -> Tensor:
        """The words a step may choose, as fairseq's generator masks them: never a NaN or the padding, the
        ``--unkpen``, ``--tokens-to-suppress``; an EOS before step ``--min-len`` only where that is above 1."""
        lprobs[lprobs != lprobs] = -math.inf
        lprobs[:, self.pad] = -math.inf
        lprobs[:, self.unk] -= self.unk_penalty
        if self.token_indices_to_suppress is not None:
            lprobs[:, self.token_indices_to_suppress] = -math.inf
        if self.min_len > 1 and t < self.min_len:
            lprobs[:, self.eos] = -math.inf
        return lprobs

    def step(self, lprobs: Tensor, alive_lprob: Tensor, penalty: Tensor):
        """One step of THUMT's search (``_beam_search_step``) for ``B`` sentences of ``beam`` live hypotheses:
        ``lprobs`` [B·beam, V] the next word's log-probabilities, ``alive_lprob`` [B, beam] the live hypotheses'
        log P, ``penalty`` lp(t + 1). Returns the ``2·beam`` best candidates by score, best first: [B·2·beam] the
        row of the live hypothesis each extends, its word and the word's log-probability, and [B, 2·beam] its score
        and whether it ends in EOS (an impossible candidate, score -inf, never does)."""
        n, beam = alive_lprob.shape
        vocab = lprobs.size(1)
        cand = (alive_lprob.view(-1, 1) + lprobs).view(n, beam * vocab)  # [B, beam·V] log P of each candidate
        top_score, top = (cand / penalty).topk(2 * beam, dim=1)  # [B, 2·beam]
        beams, words = top // vocab, top % vocab
        rows = (torch.arange(n, device=lprobs.device)[:, None] * beam + beams).view(-1)
        word_lprob = lprobs.view(n, beam * vocab).gather(1, top).view(-1)
        top_eos = words.eq(self.eos) & top_score.ne(-math.inf)
        return rows, words.view(-1), word_lprob, top_score, top_eos

    def _hypotheses(self, i: int, fin_flag, fin_score, fin_tokens, fin_lprobs, fin_len, alive_score, tokens,
                    token_lprobs, length: int) -> List[Dict[str, Tensor]]:
        """Sentence ``i``'s output, best first: its finished hypotheses, else its live ones of ``length`` tokens."""
        empty = torch.empty(0)
        if bool(fin_flag[i].any()):
            return [{"tokens": fin_tokens[i, j, : fin_len[i, j]].clone(), "score": fin_score[i, j],
                     "attention": empty, "alignment": empty,
                     "positional_scores": fin_lprobs[i, j, : fin_len[i, j]].clone()}
                    for j in fin_flag[i].nonzero().view(-1).tolist()]
        beam = alive_score.size(1)
        return [{"tokens": tokens[i * beam + j, 1: length + 1].clone(), "score": alive_score[i, j],
                 "attention": empty, "alignment": empty,
                 "positional_scores": token_lprobs[i * beam + j, :length].clone()}
                for j in range(beam) if alive_score[i, j] > -math.inf]
