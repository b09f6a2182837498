"""Learn and apply subword segmentation: subword-nmt BPE or sentencepiece (BPE model type).

``size`` is the number of merge operations for subword-nmt and the vocabulary size for sentencepiece.
Joint models are learned on the concatenation of both languages' training text.
"""

import functools
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

from .lines import count_lines, map_file
from .progress import heartbeat

KINDS = ("subword-nmt", "sentencepiece")
# What fairseq-generate/-interactive need to undo the segmentation (``--post-process``).
POST_PROCESS = {"subword-nmt": "subword_nmt", "sentencepiece": "sentencepiece"}
# sentencepiece learns from at most this many sentences. Larger corpora are sampled by _seeded_sample (with
# SPM_SEED): sentencepiece's own sampling draws a new seed in every process (0.2.3 ignores
# set_random_generator_seed there), so the same command would learn a different model each time
SPM_INPUT_SENTENCES = 10_000_000
SPM_SEED = 1


def model_files(kind: str, out_dir: Path, langs: Sequence[str], joint: bool) -> Dict[str, Path]:
    """The model file used for each language."""
    out_dir = Path(out_dir)
    name = (lambda lang: "codes" if joint else f"codes.{lang}") if kind == "subword-nmt" else \
        (lambda lang: "spm.model" if joint else f"spm.{lang}.model")
    return {lang: out_dir / name(lang) for lang in langs}


def learn(kind: str, train_files: Dict[str, Path], out_dir: Path, size: int, joint: bool, workers: int = 1,
          log=print) -> Dict[str, Path]:
    """Learn the segmentation model(s) from ``train_files`` ({lang: file}); returns {lang: model file}."""
    if kind not in KINDS:
        raise ValueError(f"unknown BPE kind {kind!r}: use one of {', '.join(KINDS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    models = model_files(kind, out_dir, list(train_files), joint)
    groups = [(list(train_files), list(train_files.values()))] if joint else \
        [([lang], [path]) for lang, path in train_files.items()]
    for langs, files in groups:
        target = models[langs[0]]
        log(f"  learning {kind} ({size} {'merges' if kind == 'subword-nmt' else 'vocabulary'}) on "
            f"{' + '.join(Path(f).name for f in files)} -> {target.name}")
        with heartbeat(f"learn {kind} {target.name}", log=log):
            if kind == "subword-nmt":
                _learn_subword_nmt(files, target, size, workers, log=log)
            else:
                _learn_sentencepiece(files, target, size, workers, zh="zh" in langs, log=log)
    return models


def _learn_subword_nmt(files: List[Path], target: Path, size: int, workers: int, log=print):
    """subword-nmt's ``learn_bpe`` in its own process, with tqdm's progress bar off through tqdm's own
    ``TQDM_DISABLE`` (tqdm reads its ``TQDM_*`` variables when it is imported, so only a fresh process can be
    told; subword-nmt has no option for its bar). Warns when fewer merges than ``size`` could be learned."""
    joined = target.with_name(target.name + ".input")
    with open(joined, "wb") as out:
        for f in files:
            with open(f, "rb") as src:
                shutil.copyfileobj(src, out)
    tmp = target.with_name(target.name + ".tmp")
    names = ", ".join(Path(f).name for f in files)
    cmd = [sys.executable, "-m", "subword_nmt.learn_bpe", "--input", str(joined), "--output", str(tmp),
           "--symbols", str(size), "--num-workers", str(max(1, workers))]
    try:
        proc = subprocess.run(cmd, env=dict(os.environ, TQDM_DISABLE="1"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, errors="replace")
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines()
            if not (lines and lines[-1].startswith("ValueError")):
                raise RuntimeError(f"subword-nmt learn_bpe failed on {names} (exit {proc.returncode}):\n"
                                   + "\n".join(lines[-20:]))
            # max() of no pair statistics: no symbol pair occurs at all (e.g. Chinese in single characters)
            tmp.write_text("#version: 0.2\n", encoding="utf-8")
        learned = count_merges(tmp)
        tmp.replace(target)
    finally:
        joined.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    if learned == 0:
        log(f"  warning: no BPE merges can be learned from {names}: every word is a single symbol; the text is "
            f"used unsegmented")
    elif learned < size:
        log(f"  warning: subword-nmt learned {learned:,} of the {size:,} BPE merges asked for: after that no symbol "
            f"pair occurs twice in {names}, so every word that occurs at least twice is already one symbol and "
            f"the corpus supports no more merges. Lower BPE_SIZE (--bpe-size) to {learned:,} or less, e.g. "
            f"make data DATASET=custom ... BPE_SIZE=N")
    return learned


def count_merges(codes: Path) -> int:
    """The merge operations in a subword-nmt codes file (its lines but the ``#version`` header)."""
    with open(codes, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip() and not line.startswith("#version"))


def _learn_sentencepiece(files: List[Path], target: Path, size: int, workers: int, zh: bool, log=print) -> int:
    """Train the sentencepiece model; warn when its vocabulary is smaller than ``size`` (``hard_vocab_limit=False``
    makes sentencepiece stop, without an error, where the corpus has no more pieces to offer)."""
    import sentencepiece as spm

    prefix = str(target)[: -len(".model")]
    tmp_prefix = prefix + ".tmp"
    sample = target.with_name(target.name + ".sample")
    names = ", ".join(Path(f).name for f in files)
    try:
        if _seeded_sample(files, SPM_INPUT_SENTENCES, sample):
            files = [sample]
        _train_spm(spm, files, tmp_prefix, size, workers, zh)
    except RuntimeError as e:
        if "Vocabulary size is smaller than required_chars" in str(e):
            raise SystemExit(f"error: a sentencepiece vocabulary of {size} is smaller than the number of "
                             f"characters it must cover ({e}); raise BPE_SIZE / --bpe-size") from None
        raise
    finally:
        sample.unlink(missing_ok=True)
    Path(tmp_prefix + ".model").replace(target)
    Path(tmp_prefix + ".vocab").replace(prefix + ".vocab")
    made = spm.SentencePieceProcessor(model_file=str(target)).get_piece_size()
    if made < size:
        log(f"  warning: sentencepiece made a vocabulary of {made:,} of the {size:,} entries asked for: "
            f"the corpus ({names}) supports no more pieces. Lower BPE_SIZE (--bpe-size) to {made:,} or less, e.g. "
            f"make data DATASET=custom ... BPE_SIZE=N")
    return made


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


def _train_spm(spm, files, tmp_prefix, size, workers, zh):
    spm.SentencePieceTrainer.train(
        input=",".join(str(f) for f in files),
        model_prefix=tmp_prefix,
        vocab_size=size,
        model_type="bpe",
        # keep the raw text (placeholders, full stops, casing) exactly, so decoding restores it
        normalization_rule_name="nmt_nfkc" if zh else "identity",
        character_coverage=0.9995 if zh else 1.0,
        input_sentence_size=SPM_INPUT_SENTENCES,
        shuffle_input_sentence=True,
        hard_vocab_limit=False,  # small corpora: do not fail when fewer pieces exist
        num_threads=max(1, workers),
        minloglevel=2,
    )


_APPLIERS = {}


def _apply_line(kind: str, model: str, line: str) -> str:
    applier = _APPLIERS.get((kind, model))
    if applier is None:
        if kind == "subword-nmt":
            from subword_nmt.apply_bpe import BPE

            with open(model, encoding="utf-8") as codes:
                merges = [line for line in codes if line.strip() and not line.startswith("#version")]
                codes.seek(0)
                bpe = BPE(codes) if merges else None
            # no merges (see _learn_subword_nmt): the text stays as it is
            applier = (lambda s: bpe.process_line(s).strip()) if bpe else (lambda s: s.strip())  # noqa: E731
        else:
            import sentencepiece as spm

            sp = spm.SentencePieceProcessor(model_file=model)
            applier = lambda s: " ".join(sp.encode(s, out_type=str))  # noqa: E731
        _APPLIERS[(kind, model)] = applier
    return applier(line)


def segment(kind: str, model: Path, line: str) -> str:
    """One line segmented with ``model`` (as :func:`apply` segments each line of a file)."""
    return _apply_line(kind, str(model), line)


def apply(kind: str, model: Path, src: Path, dst: Path, workers: int = 1) -> int:
    """Segment every line of ``src`` into ``dst`` with ``model``."""
    fn = functools.partial(_apply_line, kind, str(model))
    return map_file(fn, src, dst, workers=workers, desc=f"{kind} {Path(src).name}")
