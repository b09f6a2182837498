"""Linguistic probing of a translation encoder: the ten tasks of Conneau et al. (2018) on frozen features.

NAACL 2019 §5.1 (Table 1) and the journal's §4.2 (Table 7) classify a sentence representation, "the mean of
the top encoding layer", with an MLP. Here the encoder is a trained translation model's, frozen:

1. each SentEval sentence (Moses-tokenized) is prepared as the model's training data was (``prepare.json``
   of the checkpoint's data directory: Moses detokenization, then the data's tokenization and lowercasing,
   then its subword-nmt BPE or sentencepiece model) and looked up in the source dictionary (+ ``</s>``);
2. :func:`sentence_features`: the encoder runs on batches of similar length without gradients, and each
   sentence's feature is the mean of the top encoder layer's outputs (after the final layer norm of a
   pre-norm encoder: what the decoder attends to) over its non-padding positions, ``</s>`` included;
3. :func:`train_classifier`: an MLP (SentEval's: linear, dropout, sigmoid, linear) is trained with Adam on
   the ``tr`` features, the epoch with the best ``va`` accuracy is kept (early stopping after ``patience``
   epochs without improvement), and its ``te`` accuracy is reported. Deterministic for a seed.

``python -m diverse_fairseq.probing CHECKPOINT [--tasks SentLen,WC,...] [--data-dir DIR] [--download]``.
"""

import copy
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..data import senteval
from ..data.verify import hash_file


@dataclass
class ProbeSettings:
    """The classifier and its training (SentEval's probing defaults where it has them)."""

    hidden: int = 200  # 0: logistic regression
    dropout: float = 0.1
    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 64
    max_epochs: int = 200
    patience: int = 5  # epochs without a better validation accuracy before stopping
    seed: int = 1


def source_segmenter(data_dir: Path, log=print) -> Callable[[str], str]:
    """A function that turns a SentEval sentence into the model's source segmentation, from ``prepare.json``.

    Without ``prepare.json`` (data not made by this toolkit), or without a segmentation model recorded in it for the
    source language, the sentences are used as they are."""
    from ..data.bpe import segment
    from ..data.text import detokenize, tokenize
    from ..runs.dataset_meta import load_dataset_meta

    meta_path = Path(data_dir) / "prepare.json"
    if not meta_path.is_file():
        log(f"  note: {data_dir} has no prepare.json: the sentences are looked up in the dictionary as they are")
        return lambda s: s
    meta = load_dataset_meta(data_dir)
    src = meta.source_lang
    if src != "en":
        raise SystemExit(f"error: the probing tasks are English sentences, but this model translates from "
                         f"{src!r} ({meta_path})")
    if src not in meta.bpe_models:
        log(f"  note: {meta_path} records no segmentation model for {src!r}: the sentences are looked up in the "
            f"dictionary as they are")
        return lambda s: s
    model = Path(data_dir) / meta.bpe_models[src]
    if not model.is_file():
        raise SystemExit(f"error: the segmentation model {model} named in {meta_path} is missing")

    def prepare(sentence: str) -> str:
        text = detokenize(sentence, src)  # SentEval's text is Moses-tokenized; start from plain text
        if meta.moses_tokenized:
            text = tokenize(text, src, aggressive_dash=meta.aggressive_dash, lowercase=meta.lowercase)
        elif meta.lowercase:
            text = text.lower()
        return segment(meta.bpe, model, text)

    return prepare


def encode(dictionary, sentences: Sequence[str], max_positions: Optional[int] = None) -> List[torch.Tensor]:
    """Token ids of segmented sentences (+ ``</s>``), cut to ``max_positions`` (``</s>`` kept)."""
    out = []
    for s in sentences:
        ids = dictionary.encode_line(s, add_if_not_exist=False, append_eos=True).long()
        if max_positions and len(ids) > max_positions:
            ids = torch.cat([ids[: max_positions - 1], ids[-1:]])
        out.append(ids)
    return out


@torch.no_grad()
def sentence_features(model, tokens: Sequence[torch.Tensor], pad: int, eos: int, left_pad: bool = True,
                      max_tokens: int = 4096, device: str = "cpu") -> torch.Tensor:
    """[N, C] float32: the sentences' features (step 2 above), in batches of at most ``max_tokens`` tokens with
    padding, padded as the model was trained (``left_pad``)."""
    from fairseq.data import data_utils

    model.eval()
    encoder = model.encoder
    order = np.array(sorted(range(len(tokens)), key=lambda i: (len(tokens[i]), i)), dtype=np.int64)
    longest = max(map(len, tokens), default=1)  # batch_by_size refuses a sentence longer than max_tokens
    features = None
    for batch in data_utils.batch_by_size(order, lambda i: len(tokens[i]), max_tokens=max(max_tokens, longest)):
        src = data_utils.collate_tokens([tokens[i] for i in batch], pad, eos, left_pad=left_pad).to(device)
        lengths = torch.tensor([len(tokens[i]) for i in batch], device=device)
        out = encoder(src, src_lengths=lengths)
        x = out["encoder_out"][0].transpose(0, 1).float()  # [B, T, C]
        keep = src.ne(pad).unsqueeze(-1)  # [B, T, 1]
        mean = (x * keep).sum(1) / keep.sum(1)
        if features is None:
            features = torch.empty(len(tokens), mean.size(-1))
        features[batch] = mean.cpu()
    return features if features is not None else torch.empty(0, 0)


@torch.no_grad()
def accuracy(classifier: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 4096) -> float:
    """Percentage of ``x`` classified as ``y``."""
    classifier.eval()
    right = sum(int(classifier(x[i:i + batch]).argmax(-1).eq(y[i:i + batch]).sum()) for i in range(0, len(x), batch))
    return 100.0 * right / max(1, len(x))


def train_classifier(x_train: torch.Tensor, y_train: torch.Tensor, x_valid: torch.Tensor, y_valid: torch.Tensor,
                     classes: int, settings: ProbeSettings):
    """Step 3 above (a linear layer when ``hidden`` is 0): ``(classifier, best validation accuracy, best epoch,
    epochs run)``. Runs on the CPU under its own random state (``settings.seed``: initialisation, shuffling,
    dropout), leaving the global one untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        generator = torch.Generator().manual_seed(settings.seed)
        dim, hidden = x_train.size(1), settings.hidden
        classifier = nn.Linear(dim, classes) if hidden <= 0 else nn.Sequential(
            nn.Linear(dim, hidden), nn.Dropout(settings.dropout), nn.Sigmoid(), nn.Linear(hidden, classes))
        optimizer = torch.optim.Adam(classifier.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
        loss_fn = nn.CrossEntropyLoss()
        best, best_epoch, best_state, epoch = -1.0, 0, None, 0
        for epoch in range(1, settings.max_epochs + 1):
            classifier.train()
            perm = torch.randperm(len(x_train), generator=generator)
            for i in range(0, len(perm), settings.batch_size):
                idx = perm[i:i + settings.batch_size]
                optimizer.zero_grad()
                loss_fn(classifier(x_train[idx]), y_train[idx]).backward()
                optimizer.step()
            valid = accuracy(classifier, x_valid, y_valid)
            if valid > best:
                best, best_epoch, best_state = valid, epoch, copy.deepcopy(classifier.state_dict())
            elif epoch - best_epoch >= settings.patience:
                break
        classifier.load_state_dict(best_state)
        classifier.eval()
    return classifier, best, best_epoch, epoch


def probe_features(features: Dict[str, torch.Tensor], labels: Dict[str, List[str]],
                   settings: ProbeSettings) -> Dict:
    """Train on ``tr``, select on ``va``, test on ``te``: the task's result record."""
    classes = sorted(set(labels["tr"]))
    index = {c: i for i, c in enumerate(classes)}
    y = {s: torch.tensor([index[label] for label in labels[s]], dtype=torch.long) for s in senteval.SPLITS}
    classifier, valid, best_epoch, epochs = train_classifier(features["tr"], y["tr"], features["va"], y["va"],
                                                             len(classes), settings)
    majority = max(labels["te"].count(c) for c in classes)
    return {"accuracy": accuracy(classifier, features["te"], y["te"]), "valid_accuracy": valid,
            "majority": 100.0 * majority / len(labels["te"]), "classes": len(classes),
            "sizes": {s: len(labels[s]) for s in senteval.SPLITS}, "best_epoch": best_epoch, "epochs": epochs}


def cache_key(checkpoint, tasks: Sequence[senteval.Task], data_dir, settings: ProbeSettings) -> Dict:
    """What a stored probing result must match to be reused: the checkpoint's name, the task files' digests,
    the classifier settings and the package version."""
    from .. import __version__

    return {"checkpoint": Path(checkpoint).name, "settings": asdict(settings), "version": __version__,
            "tasks": {t.name: hash_file(Path(data_dir) / t.filename, ["sha256"])["sha256"] for t in tasks}}


def probe_checkpoint(checkpoint, tasks: Sequence[senteval.Task], data_dir, settings: ProbeSettings = ProbeSettings(),
                     data: Optional[str] = None, device: str = "cpu", max_tokens: int = 4096, log=print) -> Dict:
    """Probe ``checkpoint``'s encoder on ``tasks`` (files in ``data_dir``): ``{"tasks": {name: record}, ...}``."""
    from .loading import load_checkpoint

    task_data = [senteval.read_task(t, data_dir) for t in tasks]  # every file checked before the model loads
    started = time.time()
    loaded = load_checkpoint(str(checkpoint), data, device=device)
    prepare = source_segmenter(loaded.data, log=log)
    dictionary = loaded.task.source_dictionary
    left_pad = bool(getattr(loaded.task.cfg, "left_pad_source", True))
    max_positions = loaded.model.encoder.max_positions()
    results = {}
    for td in task_data:
        t0 = time.time()
        features, unknown, total = {}, 0, 0
        for split in senteval.SPLITS:
            tokens = encode(dictionary, [prepare(s) for s in td.sentences[split]], max_positions)
            unknown += sum(int(ids.eq(dictionary.unk()).sum()) for ids in tokens)
            total += sum(len(ids) for ids in tokens)
            features[split] = sentence_features(loaded.model, tokens, dictionary.pad(), dictionary.eos(), left_pad,
                                                max_tokens, device)
        record = probe_features(features, td.labels, settings)
        record["unknown_tokens"] = 100.0 * unknown / max(1, total)
        record["seconds"] = time.time() - t0
        results[td.task.name] = record
        log(f"  {td.task.name}: test accuracy {record['accuracy']:.2f} (validation {record['valid_accuracy']:.2f}, "
            f"majority class {record['majority']:.2f}, {record['classes']} classes) in {record['seconds']:.1f}s")
    return {"checkpoint": str(checkpoint), "data": str(loaded.data), "probing_data": str(data_dir),
            "settings": asdict(settings), "tasks": results, "seconds": time.time() - started}


def to_markdown(payload: Dict) -> str:
    """One line per task: test and validation accuracy, the majority class's share, sizes."""
    lines = ["| task | test accuracy | validation accuracy | majority class | classes | tr / va / te "
             "| unknown tokens |",
             "|---|---|---|---|---|---|---|"]
    for name, r in payload["tasks"].items():
        n = r["sizes"]
        lines.append(f"| {name} | {r['accuracy']:.2f} | {r['valid_accuracy']:.2f} | {r['majority']:.2f} | "
                     f"{r['classes']} | {n['tr']:,} / {n['va']:,} / {n['te']:,} | {r['unknown_tokens']:.1f}% |")
    return "\n".join(lines) + "\n"
