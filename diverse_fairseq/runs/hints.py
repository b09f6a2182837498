"""The commands that the workflow's messages tell a user to run, each built here so that it runs as printed: from
the current directory, with the dataset's own names and folders, and with this project's Python (the virtual
environment's interpreter, which a shell outside that environment would not find as ``python``).
``tests/runs/test_hints.py`` runs each one.
"""

import os
import re
import shlex
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from . import paths

#: a dataset folder of ``scripts/prepare_data.sh custom``'s default name: custom_SRC_TGT
_CUSTOM = re.compile(r"custom_([A-Za-z][A-Za-z0-9-]*)_([A-Za-z][A-Za-z0-9-]*)")
#: what stands for the user's corpus folder in the command (the folder is not known to the one printing it)
CORPUS_PLACEHOLDER = "/path/to/corpus"


def shown_path(path) -> str:
    """``path`` as a shell word that names it from the current directory: relative where it lies below it
    (``.venv/bin/python``, ``scripts/train.sh``), else absolute."""
    path = Path(path)
    absolute = path if path.is_absolute() else Path.cwd() / path
    try:
        return shlex.quote(str(absolute.relative_to(Path.cwd())))
    except ValueError:
        return shlex.quote(str(absolute))


def shown_command(words: Sequence) -> str:
    """``words`` as a shell line, its program named from the current directory (:func:`shown_path`)."""
    return " ".join([shown_path(words[0]), *(shlex.quote(str(w)) for w in words[1:])])


def python_words(module: str, *args) -> List[str]:
    """``<this Python> -m module args``: the interpreter running now (the project's, where the scripts started
    it), named by its path, so that the command works outside the virtual environment too."""
    return [sys.executable, "-m", module, *map(str, args)]


def python_command(module: str, *args) -> str:
    """:func:`python_words` as a shell line."""
    return shown_command(python_words(module, *args))


def script_command(script: str, *args, variables: Optional[dict] = None) -> str:
    """``VAR=value ... scripts/<script> args`` (the repository's script, named from the current directory)."""
    prefix = "".join(f"{k}={shlex.quote(str(v))} " for k, v in (variables or {}).items())
    return prefix + " ".join([shown_path(paths.REPO / "scripts" / script), *(shlex.quote(str(a)) for a in args)])


def _data_bin_variable(data_bin) -> dict:
    """``{"DATA_BIN": data_bin}`` unless it is the default folder (which the scripts use when it is unset)."""
    same = Path(data_bin).resolve() == Path(paths.DATA_BIN).resolve()
    return {} if same else {"DATA_BIN": data_bin}


def prepare_command(data_dir) -> str:
    """The command that prepares the dataset folder ``data_dir`` (``DATA_BIN/<name>``): a recipe's
    ``scripts/prepare_data.sh NAME``; for any other name the user's own corpus,
    ``SRC=xx TGT=yy CORPUS_DIR=/path/to/corpus scripts/prepare_data.sh custom`` with the languages of a
    ``custom_SRC_TGT`` name (placeholders and ``DATASET_NAME`` for another name). ``DATA_BIN`` is given where it is
    not the default."""
    return _prepare(Path(data_dir))[0]


def prepare_hint(data_dir) -> str:
    """:func:`prepare_command` for a message: for the user's own corpus, also what the placeholders stand for."""
    command, languages = _prepare(Path(data_dir))
    if not languages:
        return command
    src, tgt = languages
    codes = " and SRC_LANG, TGT_LANG by the language codes (the files' suffixes)" if src == "SRC_LANG" else ""
    files = " ".join(f"{split}.{lang}" for split in ("train", "valid", "test") for lang in (src, tgt))
    return f"{command} (replace {CORPUS_PLACEHOLDER} by your corpus folder{codes}: it holds {files})"


def _prepare(data_dir: Path):
    """(:func:`prepare_command`, the custom corpus' (source, target) language or None for a recipe)."""
    from ..data.recipes import RECIPES  # only where a hint is printed: the recipes import the data pipeline

    name, variables = data_dir.name, _data_bin_variable(data_dir.parent)
    if name in RECIPES:
        return script_command("prepare_data.sh", name, variables=variables), None
    custom = _CUSTOM.fullmatch(name)
    src, tgt = custom.groups() if custom else ("SRC_LANG", "TGT_LANG")
    variables.update(SRC=src, TGT=tgt, CORPUS_DIR=CORPUS_PLACEHOLDER, **({} if custom else {"DATASET_NAME": name}))
    return script_command("prepare_data.sh", "custom", variables=variables), (src, tgt)


def evaluate_command(checkpoint, dataset: str, data_bin) -> str:
    """``scripts/evaluate.sh CHECKPOINT DATASET`` (with ``DATA_BIN`` where it is not the default)."""
    return script_command("evaluate.sh", checkpoint, dataset, variables=_data_bin_variable(data_bin))


def translate_command(checkpoint, data_dir) -> str:
    """The command that prints the fairseq-interactive command for ``checkpoint`` on ``data_dir``."""
    return python_command("diverse_fairseq.interactive_command", checkpoint, data_dir)


def pip_command(*requirements: str) -> str:
    """``<this Python> -m pip install ...``: into the environment that runs the project."""
    return python_command("pip", "install", *requirements)


def repository_extra(extra: str) -> str:
    """The project's own requirement with an extra, ``.[tensorboard]`` (from the repository root)."""
    return f"{os.path.relpath(paths.REPO)}[{extra}]"
