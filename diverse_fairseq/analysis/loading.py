"""Load a fairseq translation checkpoint (stock ``transformer`` or ``diverse_transformer``) and a binarized split
as a fixed list of collated batches. A stock ``transformer`` is rebuilt as the ``diverse_transformer`` with the
same weights (same parameter names, same outputs), whose attention heads can be observed."""

from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

import numpy as np
import torch
from fairseq import checkpoint_utils, utils
from fairseq.data import data_utils
from fairseq.dataclass.utils import overwrite_args_by_name
from fairseq.models.transformer import TransformerModel

import diverse_fairseq  # noqa: F401  (registrations, checkpoint allowlist)
from diverse_fairseq.methods.transformer import DiverseTransformerModel

from ..runs.checkpoint_file import check_dataset, read_checkpoint, stored_data_dir, stored_task

LoadedModel = NamedTuple("LoadedModel", [("model", torch.nn.Module), ("task", object), ("arch", str), ("data", Path)])


def load_checkpoint(checkpoint: str, data: Optional[str] = None, device: str = "cpu") -> LoadedModel:
    """The first model of ``checkpoint`` in eval mode on ``device``, with its task set up on ``data``."""
    path = Path(checkpoint)
    state = read_checkpoint(path)  # read once, used for the data dir and the model; clear errors for bad files
    args = state.get("args")
    task = stored_task(state)
    data_dir = stored_data_dir(state, path) if data is None else Path(data)
    if not data_dir.is_dir():
        raise SystemExit(f"error: data directory {data_dir} not found")
    if task["source_lang"] and task["target_lang"]:
        check_dataset(state, path, data_dir, task["source_lang"], task["target_lang"])
    if args is not None:  # argparse-era checkpoint
        args.data = str(data_dir)
    else:
        overwrite_args_by_name(state["cfg"], {"data": str(data_dir)})
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], state=state)
    model = as_diverse(models[0], cfg, task).to(device).eval()
    arch = getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", "?")
    return LoadedModel(model=model, task=task, arch=str(arch), data=data_dir)


def as_diverse(model: torch.nn.Module, cfg, task) -> torch.nn.Module:
    """``model`` if its heads can be observed; a stock fairseq ``TransformerModel`` rebuilt as the
    ``diverse_transformer`` with the same state dict (strict: every parameter and buffer matches); otherwise
    a clear error."""
    if isinstance(model, DiverseTransformerModel):
        return model
    if type(model) is not TransformerModel:
        raise SystemExit(f"error: cannot analyse a {type(model).__name__}: only fairseq's transformer and "
                         "diverse_transformer translation models are supported")
    diverse = DiverseTransformerModel.build_model(cfg.model, task)
    diverse.load_state_dict(model.state_dict(), strict=True)
    return diverse.to(next(model.parameters()).dtype)


def load_batches(task, subset: str, max_sentences: Optional[int], max_tokens: int = 4096,
                 device: str = "cpu") -> List[Dict]:
    """The first ``max_sentences`` sentences of ``subset`` (file order; all if None), collated into batches
    of similar length (at most ``max_tokens`` tokens), moved to ``device``. Deterministic."""
    task.load_dataset(subset, combine=False, epoch=1)
    dataset = task.dataset(subset)
    count = len(dataset) if max_sentences is None else min(max_sentences, len(dataset))
    if count == 0:
        raise SystemExit(f"error: subset {subset!r} is empty")
    indices = np.argsort([dataset.num_tokens(i) for i in range(count)], kind="stable")
    chunks = data_utils.batch_by_size(indices, dataset.num_tokens, max_tokens=max_tokens)
    return [_collate(dataset, chunk, device) for chunk in chunks]


def _collate(dataset, indices, device: str) -> Dict:
    sample = dataset.collater([dataset[int(i)] for i in indices])
    return utils.move_to_cuda(sample) if device == "cuda" else sample


def heatmap_sentence(task, subset: str, index: Optional[int], limit: Optional[int], device: str = "cpu"):
    """``(index, batch of one)``: sentence ``index`` of ``subset`` (``--sentence-id``), by default a legible one,
    the first of the first ``limit`` sentences (all if None) whose source and target lengths (with </s>) are
    both within [5, 20], else sentence 0."""
    dataset = task.dataset(subset)
    if index is None:
        index = next((i for i in range(min(limit or len(dataset), len(dataset)))
                      if 5 <= dataset.src_sizes[i] <= 20 and 5 <= dataset.tgt_sizes[i] <= 20), 0)
    if not 0 <= index < len(dataset):
        raise SystemExit(f"error: --sentence-id {index} out of range (subset {subset!r} has {len(dataset)} sentences)")
    return index, _collate(dataset, [index], device)
