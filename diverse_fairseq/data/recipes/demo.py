"""The demo corpus (English→German software messages, committed in ``data/demo/``): no download.

Its text is used as it is (sentencepiece on the raw text by default, since messages hold placeholders
such as ``%s`` that Moses tokenization would split), so that decoding with
``--post-process sentencepiece`` gives raw text that sacrebleu scores against the raw reference.
``BPE=subword-nmt`` gives the classic Moses-tokenized pipeline instead.
"""

import hashlib
from pathlib import Path

from ..text import iter_lines
from .base import Context, Recipe, write_parallel

REPO = Path(__file__).resolve().parents[3]
DEFAULT_DIR = REPO / "data" / "demo"


def _source_file(directory: Path, split: str, lang: str) -> Path:
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(
        f"demo corpus file {split}.{lang} (or {split}.{lang}.gz) not found in {directory}. Build the corpus "
        f"with `bash scripts/build_demo_corpus.sh`, or point --demo-dir / DEMO_DIR at a directory with "
        f"train, valid and test files for en and de."
    )


def _files(ctx: Context):
    directory = Path(ctx.options.get("demo_dir") or DEFAULT_DIR)
    return {(split, lang): _source_file(directory, split, lang)
            for split in ("train", "valid", "test") for lang in ("en", "de")}


def check(ctx: Context):
    _files(ctx)


def collect_key(ctx: Context):
    """The corpus' content hash: a rebuilt corpus is prepared again."""
    files = _files(ctx)
    digest = hashlib.sha256()
    for key in sorted(files):
        digest.update(files[key].read_bytes())
    return {"corpus_sha256": digest.hexdigest()}


def collect(ctx: Context):
    files = _files(ctx)
    for split in ("train", "valid", "test"):
        write_parallel(ctx, split, {lang: list(iter_lines(files[split, lang])) for lang in ("en", "de")})
    return {}


RECIPE = Recipe(
    name="demo", src="en", tgt="de",
    description="software messages en→de from Debian gettext catalogs (data/demo)",
    archives=[],
    bpe="sentencepiece",
    bpe_size=4000,
    joint_bpe=True,
    joined_dictionary=True,
    non_printing=True,
    max_len_a=1.5,  # messages are short: an undertrained model must not loop for 200 tokens
    max_len_b=10,
    collect=collect,
    check=check,
    collect_key=collect_key,
    notes="minutes on a laptop CPU; a few MB of disk",
)
