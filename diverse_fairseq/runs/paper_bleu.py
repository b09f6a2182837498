"""BLEU computed as a paper's authors computed it, for a column beside the paper's number.

So far the EMNLP 2020 paper (An et al., repulsive attention): its text does not say how BLEU is computed, but the
authors' test scripts do (bangann/Repulsive-Attention, commit f480b5c, ``RepulsiveTransformer/rTransformer-scripts/
test/``):

- IWSLT14 De-En (``test-iwslt14.sh`` lines 21-35): the BLEU that ``fairseq-generate --remove-bpe`` prints, i.e.
  fairseq's scorer on the whitespace tokens of the lowercased, Moses-tokenized, BPE-removed hypotheses and targets
  (the dataset's own text: fairseq's IWSLT recipe lowercases and tokenizes). fairseq's scorer is plain corpus BLEU
  (4-grams, no smoothing, brevity penalty) over token ids; a reference word outside the dictionary is written
  ``<<unk>>`` (``escape_unk``) and so never matches a hypothesis ``<unk>``. The same number is sacrebleu's BLEU with
  ``tokenize='none'`` and ``smooth_method='none'`` on the hypothesis lines and the targets that fairseq-generate
  writes (``H-`` and ``T-`` lines): :func:`plain_bleu`.
- WMT14 En-De (``test-wmt14-base.sh`` lines 40-44): detokenize the hypothesis (Moses ``detokenizer.perl``), Moses-
  tokenize it again *without* ``-a`` (``tokenizer.perl -l de``, escaping on), split hyphens between two non-space
  characters as ``a ##AT##-##AT## b`` (``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``) and score with
  ``multi-bleu.perl`` against the reference processed the same way (``en-de.de.tok.atat``): :func:`wmt14_bleu`.
  multi-bleu is corpus BLEU on whitespace tokens without smoothing, i.e. sacrebleu with ``tokenize='none'``,
  ``smooth_method='none'``; no Perl is run. Our tokenized WMT BLEU (:mod:`diverse_fairseq.evaluate`) splits
  compounds of ``-a``-tokenized text and gives ``a @ ##AT##-##AT## @ b``; this one gives ``a ##AT##-##AT## b``.
  The authors' reference file is not in their repository; we process the raw newstest2014 reference with the
  hypothesis' steps (tokenize without ``-a``, split hyphens), as the hypothesis side of their script does.
"""

import re
from typing import Dict, List, Optional

#: the datasets whose paper tables have an authors' scoring, and what it is
PROTOCOLS = {
    "iwslt14_de_en": "fairseq-generate's BLEU (lowercased, tokenized, BPE removed), as the EMNLP 2020 authors' "
                     "test-iwslt14.sh",
    "wmt14_en_de_joined": "detokenized, Moses-tokenized without -a, hyphens split as ##AT##-##AT##, multi-bleu, as "
                          "the EMNLP 2020 authors' test-wmt14-base.sh",
}
_HYPHEN = re.compile(r"(\S)-(\S)")


def plain_bleu(hyps: List[str], refs: List[str]):
    """Corpus BLEU on whitespace tokens, no smoothing (fairseq's scorer, multi-bleu.perl): a sacrebleu score."""
    from sacrebleu.metrics import BLEU

    return BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(hyps, [refs])


def atat_split(line: str) -> str:
    """``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``: left to right, non-overlapping (``a-b-c`` gives
    ``a ##AT##-##AT## b-c``, as Perl does)."""
    return _HYPHEN.sub(r"\1 ##AT##-##AT## \2", line)


def wmt14_tokens(detokenized: str, lang: str) -> str:
    """A detokenized line as the authors' WMT14 script scores it (Moses without ``-a``, then :func:`atat_split`)."""
    from ..data.text import tokenize

    return atat_split(tokenize(detokenized, lang, aggressive_dash=False))


def wmt14_bleu(hyps_model: List[str], refs_detok: List[str], lang: str):
    """The authors' WMT14 BLEU of the model's BPE-removed (``-a``-tokenized) hypotheses and the raw references."""
    from ..data.text import detokenize

    hyps = [wmt14_tokens(detokenize(h, lang), lang) for h in hyps_model]
    refs = [wmt14_tokens(r, lang) for r in refs_detok]
    return plain_bleu(hyps, refs)


def authors_bleu(dataset: str, hyps_model: List[str], targets_model: Optional[List[str]], refs_detok: List[str],
                 lang: str) -> Dict[str, object]:
    """``{"paper_bleu", "paper_bleu_kind", "paper_bleu_detail"}`` for a dataset whose paper tables have an
    authors' scoring (:data:`PROTOCOLS`), else ``{}``. ``hyps_model``/``targets_model``: fairseq-generate's
    BPE-removed hypotheses and targets; ``refs_detok``: the raw references."""
    if dataset not in PROTOCOLS:
        return {}
    if dataset == "iwslt14_de_en" and targets_model is None:
        raise ValueError("the IWSLT14 authors' BLEU needs fairseq-generate's targets (its T- lines)")
    score = (plain_bleu(hyps_model, targets_model) if dataset == "iwslt14_de_en"
             else wmt14_bleu(hyps_model, refs_detok, lang))
    return {"paper_bleu": round(score.score, 2), "paper_bleu_kind": PROTOCOLS[dataset],
            "paper_bleu_detail": str(score)}
