"""The demo corpus (English→German software messages, committed in ``data/demo/``): no download.

Its text is used as it is (sentencepiece on the raw text by default, since messages hold placeholders such as ``%s``
that Moses tokenization would split), so that decoding with ``--post-process sentencepiece`` gives raw text that
sacrebleu scores against the raw reference. ``BPE=subword-nmt`` gives the classic Moses-tokenized pipeline instead.
"""

import hashlib
from pathlib import Path

from .base import Context, Recipe, corpus_files, write_folder

DEFAULT_DIR = Path(__file__).resolve().parents[3] / "data" / "demo"


def _files(ctx: Context):
    return corpus_files(Path(ctx.options.get("demo_dir") or DEFAULT_DIR), ("en", "de"),
                        "Build the demo corpus with `bash scripts/build_demo_corpus.sh`, or point --demo-dir / "
                        "DEMO_DIR at a folder with train, valid and test files for en and de.")


def collect_key(ctx: Context):
    """The corpus' content hash: a rebuilt corpus is prepared again."""
    files = _files(ctx)
    return {"corpus_sha256": hashlib.sha256(b"".join(files[key].read_bytes() for key in sorted(files))).hexdigest()}


RECIPE = Recipe(
    name="demo", src="en", tgt="de",
    description="software messages en→de from Debian gettext catalogs (data/demo)",
    bpe="sentencepiece", bpe_size=4000, joint_bpe=True, joined_dictionary=True, non_printing=True,
    max_len_a=1.5, max_len_b=10,  # messages are short: an undertrained model must not loop for 200 tokens
    collect=lambda ctx: write_folder(ctx, _files(ctx), ctx.recipe.name), collect_key=collect_key,
    check=_files,  # every corpus file is there
)
