"""Print the ``fairseq-interactive`` command that translates raw text with a checkpoint, segmenting it as its
dataset was (and, on stderr, what the command cannot do for this dataset). DATASET is a name under DATA_BIN or a
prepared dataset's folder; without it, the dataset the checkpoint was trained on. Its ``prepare.json`` says how the
training text was made, and the command repeats that on the input:

* ``BPE=subword-nmt`` (the default recipe): Moses tokenization (``--tokenizer moses``, with ``--moses-no-dash-splits``
  unless the recipe split hyphens) and then the dataset's BPE codes. Without the tokenizer, ``--bpe subword_nmt``
  alone segments ``file:`` as ``fi@@ le@@ :`` where training saw ``file :``.
* ``BPE=sentencepiece``: the dataset's sentencepiece model on the raw text, no tokenizer.

Both undo their segmentation on the output. Decoding uses the recipe's beam and length penalty, and the penalty form,
beam search and length limit the checkpoint was validated with (:func:`stored_decoding`: GNMT's penalty, THUMT's
search and |x| + 50 tokens for the THUMT papers' settings), as the evaluation does. A checkpoint of another dataset
is refused (:mod:`diverse_fairseq.runs.checkpoint_file`). See docs/translating.md.
"""

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Dict, List

from .evaluate import resolve_data
from .runs.checkpoint_file import check_dataset, read_checkpoint, stored_data_dir
from .runs.dataset_meta import DatasetMeta, load_dataset_meta
from .runs.hints import python_words, shown_command
from .runs.options import add_options, resolve, warn_misspelled
from .runs.paths import DataBin
from .runs.plan import task_args
from .user_dir import USER_DIR


def segmentation_options(data_dir: Path, meta: DatasetMeta) -> List[str]:
    """The tokenizer and BPE options that repeat the dataset's preparation on the source text."""
    model = Path(data_dir) / meta.bpe_models[meta.source_lang]
    if meta.bpe == "sentencepiece":
        return ["--bpe", "sentencepiece", "--sentencepiece-model", str(model)]
    if meta.bpe != "subword-nmt":
        raise SystemExit(f"error: {data_dir}/prepare.json names the segmentation {meta.bpe!r}; this command knows "
                         "subword-nmt and sentencepiece")
    # fairseq's Moses tokenizer escapes like ours; it splits hyphens unless told not to, which the recipes
    # other than WMT14 (aggressive_dash) do not do
    moses = ["--tokenizer", "moses"] + ([] if meta.aggressive_dash else ["--moses-no-dash-splits"])
    return moses + ["--bpe", "subword_nmt", "--bpe-codes", str(model)]


def stored_decoding(state: Dict) -> Dict[str, object]:
    """How the checkpoint's training decoded its validation set: ``length_penalty`` and ``beam_search`` (its task's
    ``--length-penalty`` and ``--beam-search``; ``fairseq`` for the plain ``translation`` task) and, where
    ``--eval-bleu-args`` gave them, ``max_len_a`` / ``max_len_b``. ``state`` is
    :func:`~diverse_fairseq.runs.checkpoint_file.read_checkpoint`'s, which fairseq has upgraded: an argparse-era
    checkpoint's ``args`` are in its ``cfg`` too."""
    task = state["cfg"]["task"]
    # valid JSON where --eval-bleu is on: fairseq's translation task parsed it when it built the model
    generation = json.loads(task.get("eval_bleu_args") or "{}") if task.get("eval_bleu") else {}
    return {"length_penalty": str(task.get("length_penalty") or "fairseq"),
            "beam_search": str(task.get("beam_search") or "fairseq"),
            **{k: generation[k] for k in ("max_len_a", "max_len_b") if k in generation}}


def build_command(checkpoint, data_dir, meta: DatasetMeta, decoding: Dict[str, object]) -> List[str]:
    """fairseq-interactive (``fairseq_cli.interactive`` run by this Python: the command works outside the virtual
    environment too) with the checkpoint, the dataset's dictionaries, its segmentation and the recipe's
    decoding settings, with ``decoding`` (:func:`stored_decoding`) over them."""
    d = {"max_len_a": meta.max_len_a, "max_len_b": meta.max_len_b, **decoding}
    return python_words("fairseq_cli.interactive", data_dir, "--path", checkpoint, "--user-dir", USER_DIR,
                        *task_args(str(d["length_penalty"]), str(d["beam_search"])), "--source-lang", meta.source_lang,
                        "--target-lang", meta.target_lang, *segmentation_options(data_dir, meta),
                        "--beam", meta.beam, "--lenpen", meta.lenpen,
                        "--max-len-a", d["max_len_a"], "--max-len-b", d["max_len_b"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m diverse_fairseq.interactive_command", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="checkpoint file (.pt)")
    p.add_argument("dataset", nargs="?", help="dataset name under --data-bin, or a prepared dataset folder "
                                              "(default: the one the checkpoint was trained on)")
    args = add_options(p, DataBin).parse_args(argv)
    warn_misspelled(os.environ, "interactive_command", file=sys.stderr)  # stdout: the command alone
    data_bin = resolve(DataBin, os.environ, args).data_bin
    checkpoint = Path(args.checkpoint)
    state = read_checkpoint(checkpoint)
    data_dir = resolve_data(args.dataset, data_bin) if args.dataset else stored_data_dir(state, checkpoint)
    meta = load_dataset_meta(data_dir)
    check_dataset(state, checkpoint, data_dir, meta.source_lang, meta.target_lang)
    # what the command does not repeat of the preparation, for the user to do on the input
    if meta.lowercase:
        print("note: the dataset was lowercased: give lowercase input (fairseq-interactive does not lowercase); "
              "the output is lowercase too", file=sys.stderr)
    if meta.source_lang == "zh" and meta.moses_tokenized:
        seg = meta.zh_seg or "jieba"  # prepare_data's default segmenter
        print(f"note: the Chinese source was segmented ({seg}) before Moses tokenization: give input segmented the "
              f"same way (words separated by spaces{', characters' if seg == 'char' else ''})", file=sys.stderr)
    print(shown_command(build_command(checkpoint, data_dir, meta, stored_decoding(state))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
