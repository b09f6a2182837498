"""The demo corpora (software messages from Debian gettext catalogs, committed in the repository): no download.
``demo`` is English→German (``data/demo``), ``demo_fr`` English→French (``data/demo_fr``), both built by
``scripts/build_demo_corpus.sh [LANG]`` from the same pinned packages and prepared the same way.

Their text is used as it is (sentencepiece on the raw text by default, since messages hold placeholders such as ``%s``
that Moses tokenization would split), so that decoding with ``--post-process sentencepiece`` gives raw text that
sacrebleu scores against the raw reference. ``BPE=subword-nmt`` gives the classic Moses-tokenized pipeline instead.
"""

import hashlib
from pathlib import Path

from .base import Context, Recipe, corpus_files, write_folder

DATA_DIR = Path(__file__).resolve().parents[3] / "data"


def _recipe(name: str, tgt: str, build_command: str) -> Recipe:
    """The demo recipe of the corpus ``data/<name>`` (English→``tgt``), rebuilt by ``build_command``."""

    def files(ctx: Context):
        return corpus_files(Path(ctx.options.get("demo_dir") or DATA_DIR / name), ("en", tgt),
                            f"Build the demo corpus with `{build_command}`, or point --demo-dir / "
                            f"DEMO_DIR at a folder with train, valid and test files for en and {tgt}.")

    def collect_key(ctx: Context):
        """The corpus' content hash: a rebuilt corpus is prepared again."""
        found = files(ctx)
        return {"corpus_sha256": hashlib.sha256(b"".join(found[key].read_bytes() for key in sorted(found))).hexdigest()}

    return Recipe(
        name=name, src="en", tgt=tgt,
        description=f"software messages en→{tgt} from Debian gettext catalogs (data/{name})",
        bpe="sentencepiece", bpe_size=4000, joint_bpe=True, joined_dictionary=True, non_printing=True,
        max_len_a=1.5, max_len_b=10,  # messages are short: an undertrained model must not loop for 200 tokens
        collect=lambda ctx: write_folder(ctx, files(ctx), ctx.recipe.name), collect_key=collect_key,
        check=files,  # every corpus file is there
    )


RECIPE = _recipe("demo", "de", "bash scripts/build_demo_corpus.sh")
FRENCH = _recipe("demo_fr", "fr", "bash scripts/build_demo_corpus.sh fr")
#: the corpora that ship with the repository: the demo table prepares them itself
SHIPPED = (RECIPE.name, FRENCH.name)
