"""Learn and apply subword segmentation: subword-nmt BPE or sentencepiece (BPE model type). ``size`` is the number of
merge operations for subword-nmt and the vocabulary size for sentencepiece. Joint models are learned on both
languages' training text together."""

import contextlib
import functools
import io
import itertools
import random
from collections import Counter
from pathlib import Path
from typing import Callable, Container, Dict, Iterable, List, Optional, Sequence

from .progress import heartbeat
from .text import count_lines, iter_lines, map_file

KINDS = ("subword-nmt", "sentencepiece")
# sentencepiece learns from at most this many sentences. Larger corpora are sampled by _seeded_sample (with
# SPM_SEED): sentencepiece's own sampling draws a new seed in every process (0.2.3 ignores
# set_random_generator_seed there), so the same command would learn a different model each time
SPM_INPUT_SENTENCES = 10_000_000
SPM_SEED = 1
# why a model can have fewer merges (subword-nmt) or pieces (sentencepiece) than asked for
TOO_FEW = {"subword-nmt": "subword-nmt learned {made:,} of the {size:,} BPE merges asked for: after that no symbol "
                          "pair occurs twice in {names}, so every word that occurs at least twice is already one "
                          "symbol and the corpus supports no more merges",
           "sentencepiece": "sentencepiece made a vocabulary of {made:,} of the {size:,} entries asked for: the "
                            "corpus ({names}) supports no more pieces"}


def model_files(kind: str, out_dir: Path, langs: Sequence[str], joint: bool) -> Dict[str, Path]:
    """The model file used for each language: ``codes[.LANG]`` (subword-nmt), ``spm[.LANG].model`` (sentencepiece)."""
    stem, suffix = ("codes", "") if kind == "subword-nmt" else ("spm", ".model")
    return {lang: Path(out_dir) / (stem + ("" if joint else f".{lang}") + suffix) for lang in langs}


def learn(kind: str, train_files: Dict[str, Path], out_dir: Path, size: int, joint: bool, workers: int = 1,
          log=print, again: Callable[[int], str] = lambda size: f"BPE_SIZE={size}") -> Dict[str, Path]:
    """Learn the segmentation model(s) from ``train_files`` ({lang: file}); returns {lang: model file}. Warns, naming
    BPE_SIZE and the command that prepares the data again with the size the corpus supports (``again(size)``),
    where the corpus supports fewer merges or pieces than ``size``."""
    if kind not in KINDS:
        raise ValueError(f"unknown BPE kind {kind!r}: use one of {', '.join(KINDS)}")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    models = model_files(kind, out_dir, list(train_files), joint)
    groups = [(list(train_files), list(train_files.values()))] if joint else \
        [([lang], [path]) for lang, path in train_files.items()]
    for langs, files in groups:
        target = models[langs[0]]
        log(f"  learning {kind} ({size} {'merges' if kind == 'subword-nmt' else 'vocabulary'}) on "
            f"{' + '.join(Path(f).name for f in files)} -> {target.name}")
        with heartbeat(f"learn {kind} {target.name}", log=log):
            if kind == "subword-nmt":
                made = _learn_subword_nmt(files, target, size, workers)
            else:
                made = _learn_sentencepiece(files, target, size, workers, zh="zh" in langs)
        names = ", ".join(Path(f).name for f in files)
        if made == 0:  # subword-nmt only: sentencepiece keeps at least the characters
            log(f"  warning: no BPE merges can be learned from {names}: every word is a single symbol; the text is "
                f"used unsegmented")
        elif made < size:
            log(f"  warning: {TOO_FEW[kind].format(made=made, size=size, names=names)}. Lower BPE_SIZE (--bpe-size) "
                f"to {made:,} or less ({made:,} gives the same model; the <unk> rates printed after binarisation say "
                f"whether a smaller size is needed): {again(made)}")
    return models


def _learn_subword_nmt(files: List[Path], target: Path, size: int, workers: int) -> int:
    """subword-nmt's ``learn_bpe`` on the word counts of ``files`` together (the sum of its ``get_vocabulary`` of each,
    as of their concatenation), its messages and tqdm's progress bar kept off the console. Returns the number of
    merges learned."""
    from subword_nmt.learn_bpe import get_vocabulary, learn_bpe

    vocab = Counter()
    for f in files:
        with open(f, encoding="utf-8", newline="\n") as inp:  # workers reopen it by name
            vocab.update(get_vocabulary(inp, num_workers=max(1, workers)))
    tmp = target.with_name(target.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as out, contextlib.redirect_stderr(io.StringIO()):
            try:
                learn_bpe([f"{word} {n}" for word, n in vocab.items()], out, size, is_dict=True)
            except ValueError as e:  # max() of no pair statistics: no symbol pair occurs at all (e.g. Chinese
                if "empty" not in str(e):  # in single characters); the codes keep their header alone
                    raise
        learned = count_merges(tmp)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return learned


def count_merges(codes: Path) -> int:
    """The merge operations in a subword-nmt codes file (its lines but the ``#version`` header)."""
    with open(codes, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip() and not line.startswith("#version"))


def _learn_sentencepiece(files: List[Path], target: Path, size: int, workers: int, zh: bool) -> int:
    """Train the sentencepiece model; returns its vocabulary size (``hard_vocab_limit=False`` makes sentencepiece
    stop, without an error, where the corpus has no more pieces to offer)."""
    import sentencepiece as spm

    prefix = str(target)[: -len(".model")]
    sample = target.with_name(target.name + ".sample")
    try:
        spm.SentencePieceTrainer.train(
            input=",".join(str(f) for f in ([sample] if _seeded_sample(files, SPM_INPUT_SENTENCES, sample) else files)),
            model_prefix=prefix + ".tmp", vocab_size=size, model_type="bpe",
            # keep the raw text (placeholders, full stops, casing) exactly, so decoding restores it
            normalization_rule_name="nmt_nfkc" if zh else "identity", character_coverage=0.9995 if zh else 1.0,
            input_sentence_size=SPM_INPUT_SENTENCES, shuffle_input_sentence=True,
            hard_vocab_limit=False,  # small corpora: do not fail when fewer pieces exist
            num_threads=max(1, workers), minloglevel=2)
    except RuntimeError as e:
        if "Vocabulary size is smaller than required_chars" in str(e):
            raise SystemExit(f"error: a sentencepiece vocabulary of {size} is smaller than the number of "
                             f"characters it must cover ({e}); raise BPE_SIZE / --bpe-size") from None
        raise
    finally:
        sample.unlink(missing_ok=True)
    Path(prefix + ".tmp.model").replace(target)
    Path(prefix + ".tmp.vocab").replace(prefix + ".vocab")
    return spm.SentencePieceProcessor(model_file=str(target)).get_piece_size()


def _seeded_sample(files: List[Path], limit: int, out: Path) -> bool:
    """Write exactly ``limit`` of the lines of ``files`` to ``out``, each line equally likely, in corpus order
    (Knuth's selection sampling, Algorithm S, with ``random.Random(SPM_SEED)``). Returns False, writing
    nothing, when the files hold no more than ``limit`` lines."""
    left = sum(count_lines(f) for f in files)
    if left <= limit:
        return False
    rng, need = random.Random(SPM_SEED), limit
    with open(out, "wb") as dst:
        for f in files:
            with open(f, "rb") as src:
                for line in src:
                    if left > 0 and rng.random() * left < need:
                        dst.write(line if line.endswith(b"\n") else line + b"\n")
                        need -= 1
                    left -= 1
    return True


@functools.cache
def _segmenter(kind: str, model: str, version: tuple):
    """The segmenter of the model file ``model`` as it is now (``version``: its modification time and size, so that
    a model learned again at the same path, e.g. with another BPE_SIZE in the same process, is read again)."""
    if kind == "sentencepiece":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=model)
        return lambda s: " ".join(sp.encode(s, out_type=str))
    if count_merges(model) == 0:  # no merges (see _learn_subword_nmt): the text stays as it is
        return str.strip
    from subword_nmt.apply_bpe import BPE

    with open(model, encoding="utf-8") as codes:
        bpe = BPE(codes)
    return lambda s: bpe.process_line(s).strip()


def _version(model) -> tuple:
    st = Path(model).stat()
    return st.st_mtime_ns, st.st_size


def segment(kind: str, model: Path, line: str, version: Optional[tuple] = None) -> str:
    """One line segmented with ``model`` (as :func:`apply` segments each line of a file)."""
    return _segmenter(kind, str(model), version or _version(model))(line)


def apply(kind: str, model: Path, src: Path, dst: Path, workers: int = 1) -> int:
    """Segment every line of ``src`` into ``dst`` with ``model``."""
    return map_file(functools.partial(segment, kind, str(model), version=_version(model)), src, dst, workers=workers,
                    desc=f"{kind} {Path(src).name}")


# ------------------------------------------------------------------------------------------ <unk> after binarisation
UNK_WARN_PCT = 1.0  # preparation warns when more of the valid or test tokens than this are <unk>


def unk_percent(lines: Iterable[str], known: Container[str], unk_word: str = "<unk>") -> float:
    """The % of tokens fairseq-preprocess replaces by ``<unk>``, as it reports it: words (split on white space) not
    in the dictionary (``known``), out of all words plus one end-of-sentence per line."""
    tokens = replaced = 0
    for line in lines:
        words = line.split()
        tokens += len(words) + 1
        replaced += sum(1 for w in words if w not in known and w != unk_word)
    return 100.0 * replaced / tokens if tokens else 0.0


def fitting_merges(codes: Path, train: Sequence[Path], heldout: Sequence[Path], limit: float = UNK_WARN_PCT,
                   sample: int = 200_000) -> Optional[int]:
    """The largest number of ``codes``' merges (all it learned, then halved) with which at most ``limit`` % of the
    ``heldout`` tokens would be ``<unk>``: symbols that the (first ``sample`` lines of the) ``train`` files,
    segmented with as many merges, never produce. None when no number of merges gets there (the held-out text has
    characters the training text lacks, or the codes hold no merges)."""
    from subword_nmt.apply_bpe import BPE

    train_lines = list(itertools.islice(itertools.chain(*map(iter_lines, train)), sample))
    held = [line for f in heldout for line in iter_lines(f)]
    merges = count_merges(codes)
    while merges > 0:
        with open(codes, encoding="utf-8") as f:
            bpe = BPE(f, merges=merges)
        known = {s for line in train_lines for s in bpe.process_line(line).split()}
        if unk_percent((bpe.process_line(line) for line in held), known) <= limit:
            return merges
        merges //= 2
    return None
