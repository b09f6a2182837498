"""Read a fairseq checkpoint file with one clear error per way it can be wrong, and check it against a dataset.

torch's own errors do not say what is wrong: an empty file gives a bare ``EOFError``, a file that is not a
checkpoint the advice to load it with ``weights_only=False`` (which would run whatever code the file holds), a
checkpoint of another dataset a ``size mismatch`` dump.
"""

import pickle
import struct
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary

ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default format is a zip archive; the legacy one starts with b"\x80"


class UnreadableCheckpoint(SystemExit):
    """The SystemExit of :func:`read_checkpoint` for a file it cannot read; ``what`` says why without the advice
    (``truncated (1,024 bytes; its zip archive has no end)``), for callers that give their own."""

    def __init__(self, path: Path, what: str, advice: str):
        super().__init__(f"error: {path} is {what}{advice}")
        self.what = what


def _truncated(path: Path, size: int, why: str) -> SystemExit:
    return UnreadableCheckpoint(path, f"truncated ({size:,} bytes; {why})", ": its save or copy did not finish; use "
                                f"another checkpoint of the run (checkpoint_best.pt, checkpoint_last.pt or "
                                f"checkpointN.pt in {path.parent}) or copy the file again")


def _not_a_checkpoint(path: Path, why: str) -> SystemExit:
    return UnreadableCheckpoint(path, f"not a checkpoint ({why})", "; give a .pt file written by fairseq-train, e.g. "
                                "checkpoint_best.pt of a save dir")


def read_checkpoint(path) -> Dict:
    """The state of checkpoint ``path`` as :func:`fairseq.checkpoint_utils.load_checkpoint_to_cpu` returns it
    (loaded by torch's ``weights_only`` loader, upgraded to the current format); SystemExit saying whether
    the file is missing, truncated or not a checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"error: checkpoint {path} not found" + (" (it is a folder: name a .pt file in it)"
                                                                  if path.is_dir() else ""))
    size = path.stat().st_size
    if size == 0:
        raise _truncated(path, 0, "the file is empty")
    with open(path, "rb") as f:
        magic = f.read(len(ZIP_MAGIC))
    torch_file = magic.startswith((ZIP_MAGIC, b"\x80"))
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    except pickle.UnpicklingError as e:
        detail = next((line.strip() for line in str(e).splitlines() if "GLOBAL" in line), "")
        if torch_file and ("Unsupported global" in str(e) or "weights_only" in str(e)):
            raise _not_a_checkpoint(path, "it holds Python objects that fairseq checkpoints do not, which loading "
                                          "would have to execute" + (f": {detail}" if detail else "")) from None
        raise _not_a_checkpoint(path, "torch cannot read it") from None
    except EOFError:
        raise (_truncated(path, size, "it ends in the middle of the data") if torch_file
               else _not_a_checkpoint(path, "torch cannot read it")) from None
    except RuntimeError as e:
        if magic.startswith(ZIP_MAGIC) and ("zip archive" in str(e) or "PytorchStreamReader" in str(e)):
            raise _truncated(path, size, "its zip archive has no end") from None
        raise _not_a_checkpoint(path, f"torch cannot read it: {str(e).splitlines()[0][:200]}") from None
    except (KeyError, ValueError, TypeError, AttributeError, IndexError, struct.error) as e:
        what = "a torch file without fairseq's checkpoint fields" if torch_file else "torch cannot read it"
        raise _not_a_checkpoint(path, f"{what}: {type(e).__name__} {e}") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict) or state.get("cfg") is None:
        raise _not_a_checkpoint(path, "a torch file without fairseq's model weights and configuration")
    return state


def stored_task(state: Dict) -> Dict[str, Optional[str]]:
    """The ``data``, ``source_lang`` and ``target_lang`` that the checkpoint's training was given (its configuration's
    task: :func:`read_checkpoint` has upgraded an argparse-era checkpoint's ``args`` to one)."""
    return {key: state["cfg"]["task"].get(key) for key in ("data", "source_lang", "target_lang")}


def stored_data_dir(state: Dict, checkpoint) -> Path:
    """The checkpoint's training data directory, tried as stored, then relative to the checkpoint's ancestors
    (a run moved together with its data)."""
    stored, give = stored_task(state)["data"], ("give the data directory explicitly (--data DIR for the analysis, "
                                                 "DATASET for the interactive command)")
    if not stored:
        raise SystemExit(f"error: {checkpoint} names no data directory; {give}")
    first = str(stored).split(":")[0]
    path = Path(first)
    if path.is_dir() or path.is_absolute():
        return path
    for ancestor in Path(checkpoint).resolve().parents:
        if (ancestor / path).is_dir():
            return ancestor / path
    raise SystemExit(f"error: data directory {first!r} stored in {checkpoint} not found (relative to the current "
                     f"directory or the checkpoint's ancestors); {give}")


def check_dataset(state: Dict, checkpoint, data_dir, src: str, tgt: str):
    """SystemExit unless the checkpoint translates ``src`` → ``tgt`` with the dictionaries of ``data_dir``
    (``dict.SRC.txt``, ``dict.TGT.txt``): one embedding row per symbol on each side."""
    data_dir = Path(data_dir)
    stored = stored_task(state)
    trained_on = f" (it was trained on {stored['data']})" if stored.get("data") else ""
    langs = (stored.get("source_lang"), stored.get("target_lang"))
    if all(langs) and langs != (src, tgt):
        raise SystemExit(f"error: {checkpoint} translates {langs[0]}→{langs[1]}, but {data_dir} is a {src}→{tgt} "
                         f"dataset{trained_on}: evaluate it on a dataset of its language pair")
    for side, lang in (("encoder", src), ("decoder", tgt)):
        weight = state["model"].get(f"{side}.embed_tokens.weight")
        if weight is None:
            continue  # a model without this table (e.g. adaptive input) is left to fairseq
        dict_file = data_dir / f"dict.{lang}.txt"
        if not dict_file.is_file():
            raise SystemExit(f"error: {data_dir} has no {dict_file.name}: it is not a prepared {src}→{tgt} dataset")
        size = len(Dictionary.load(str(dict_file)))
        if weight.shape[0] != size:
            raise SystemExit(
                f"error: {checkpoint} was trained on a dictionary of {weight.shape[0]:,} symbols ({lang}, {side}), "
                f"this dataset has {size:,} ({dict_file}){trained_on}. A model only reads the dataset it was "
                f"trained on (the same preparation: BPE model and dictionary): give that dataset")


def trained_updates(checkpoint: Path) -> Optional[int]:
    """The number of updates a fairseq checkpoint was saved at (what fairseq resumes from), or ``None`` when the
    file cannot be read as a checkpoint. Memory-mapped: a fraction of a second even for a big model."""
    try:
        state = torch.load(str(checkpoint), map_location="cpu", weights_only=True, mmap=True)
        return int(state["optimizer_history"][-1]["num_updates"])
    except Exception:  # noqa: BLE001 - a truncated or foreign file: the caller lets fairseq decide
        return None


def finished(save_dir: Path, max_update: Optional[int]) -> Optional[int]:
    """The number of updates of ``save_dir/checkpoint_last.pt`` when it has reached ``max_update`` (None or 0: no
    limit), else ``None``: fairseq would resume a finished run and train one more update before its stop check."""
    last = Path(save_dir) / "checkpoint_last.pt"
    if not max_update or not last.exists():
        return None
    updates = trained_updates(last)
    return updates if updates is not None and updates >= max_update else None


def damage(path: Path) -> Optional[str]:
    """Why checkpoint ``path`` cannot be read (``missing``, ``truncated (...)``, ``not a checkpoint (...)``), or None
    when it can. The quick look (:func:`trained_updates`) first; the whole file is read only when that fails."""
    path = Path(path)
    if not path.is_file():
        return "missing"
    if trained_updates(path) is not None:
        return None
    try:
        read_checkpoint(path)
        return None  # readable after all (e.g. an average without optimizer history)
    except UnreadableCheckpoint as e:
        return e.what


def latest_intact(save_dir: Path) -> Optional[Tuple[int, Path]]:
    """``(updates, path)`` of the intact checkpoint of ``save_dir`` other than ``checkpoint_last.pt`` with the most
    updates (``checkpoint_best.pt`` among equals), averages and ``crash.pt`` left out; None when there is none."""
    intact = [(updates, c.name == "checkpoint_best.pt", c) for c in Path(save_dir).glob("checkpoint*.pt")
              if c.name != "checkpoint_last.pt" and not c.name.startswith(("checkpoint_avg", "crash"))
              and (updates := trained_updates(c)) is not None]
    return max(intact)[::2] if intact else None


def refuse_damaged_last(save_dir, rerun: str = "run the same command again") -> None:
    """SystemExit, before training, when ``save_dir/checkpoint_last.pt`` cannot be read, naming the fix (copy the
    intact checkpoint with the most updates to it, or move it aside to start afresh; ``rerun`` says what to run
    afterwards). fairseq itself would say "resuming", crash in torch's zip reader and leave the file as it is, so
    the same command would fail again."""
    save_dir = Path(save_dir)
    last = save_dir / "checkpoint_last.pt"
    what = damage(last) if last.is_file() else None
    if what is None:
        return
    move, intact = f"mv {last} {last}.damaged", latest_intact(save_dir)
    if intact:
        updates, best = intact
        fix = (f"resume from {best.name} (update {updates}, intact): {move} && cp {best} {last}, then {rerun} to "
               f"resume; or, to train afresh in {save_dir}, only {move}")
    else:
        fix = f"no other checkpoint there is intact: move it aside ({move}) and {rerun} to train afresh"
    raise SystemExit(f"error: {last} is {what}, so fairseq-train cannot resume from it (its save or copy did not "
                     f"finish); {fix}")
