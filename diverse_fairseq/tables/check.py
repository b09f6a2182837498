"""``make check-tables``: every row of every table builds, and at demo scale trains one step, without data.

For each table, row and scale (``demo``: the CPU; ``paper``: the papers' 8 GPUs, fp16 where CUDA is available, else
fp32) this builds the plan the table runner would train (:func:`row_plan`) with fairseq-train's parser and fairseq's
builders, on synthetic dictionaries of the sizes the recipe assumes (``Recipe.assumed_vocab``), and checks the
setting's depth; at demo scale it trains one step on a synthetic batch. At paper scale a row more than
:data:`PARAM_TOLERANCE` off its paper's parameter count (``paper: {params: ...}``, millions) fails unless its
``params_gap`` says why (``GAP``); a prepared dataset (``DATA_BIN/<dataset>``) also gets the count on its real
dictionaries. One line per table/row/scale, then every failure again; the same run identity is built once.

    python -m diverse_fairseq.tables.check [--scale demo|paper] [--paper-gpus 8] [TABLE ...]
    make check-tables [SCALE=demo|paper]
"""

import argparse
import gc
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..data.recipes import RECIPES
from ..runs.cli_logging import setup_cli_logging
from ..runs.dataset_meta import DatasetMeta, load_dataset_meta
from ..runs.options import add_options, choice, integer, option, resolve, warn_misspelled
from ..runs.paths import data_bin_option
from ..runs.plan import Plan, TrainOptions
from . import scale as scale_mod
from .config import RunConfig
from .job import job_plan
from .options import SCALES
from .spec import TABLE_DIR, Row, Table, load_table


@dataclass
class Result:
    ok: bool
    message: str  # the failure's reason, or what was checked
    parameters: Optional[int] = None


PARAM_TOLERANCE = 0.02  # a paper-scale model may differ from the paper's parameter count by at most 2%


def synthetic_dictionary(entries: Optional[int] = None, symbols: Optional[int] = None):
    """A fairseq ``Dictionary`` of ``entries`` entries in all (special symbols included), or of ``symbols``
    symbols besides the special ones, padded to a multiple of 8 as fairseq-preprocess pads."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    n = symbols if symbols is not None else entries - dictionary.nspecial
    for i in range(n):
        dictionary.add_symbol(f"w{i}")
    dictionary.finalize(padding_factor=8)  # as fairseq-preprocess does
    if entries is not None and len(dictionary) != entries:
        raise ValueError(f"a dictionary of {entries} entries is not possible: use a multiple of 8")
    return dictionary


def write_synthetic_data(data_bin: Path, dataset: str) -> Path:
    """``data_bin/dataset`` with a ``prepare.json`` and dictionaries (no text) of the sizes the recipe assumes
    (``assumed_vocab``, else its BPE size in symbols): what the plan and fairseq's translation task read. Languages
    with dictionaries of one size (a joined dictionary) get the same one, built once."""
    recipe = RECIPES[dataset]
    data = data_bin / dataset
    if (data / "prepare.json").exists():
        return data
    data.mkdir(parents=True, exist_ok=True)
    dictionaries = {}  # entries (None: the BPE size in symbols) -> dictionary
    for lang in recipe.langs:
        size = None if recipe.joined_dictionary else recipe.assumed_vocab.get(lang)
        if size not in dictionaries:
            dictionaries[size] = synthetic_dictionary(size, None if size else recipe.bpe_size)
        dictionaries[size].save(str(data / f"dict.{lang}.txt"))
    DatasetMeta(source_lang=recipe.src, target_lang=recipe.tgt, dataset=dataset,
                joined_dictionary=recipe.joined_dictionary, synthetic=True, beam=recipe.beam, lenpen=recipe.lenpen,
                max_len_a=recipe.max_len_a, max_len_b=recipe.max_len_b,
                post_process="subword_nmt" if recipe.bpe == "subword-nmt" else "sentencepiece",
                moses_tokenized=recipe.bpe == "subword-nmt").write(data)
    return data


def compare_parameters(built: int, paper_millions: Optional[float], tolerance: float = PARAM_TOLERANCE
                       ) -> Tuple[bool, str]:
    """(within tolerance, text): the built model's parameters beside the paper's (millions; None: within)."""
    if paper_millions is None:
        return True, f"{built / 1e6:.2f}M params"
    off = built / (paper_millions * 1e6) - 1
    text = f"{built / 1e6:.2f}M params, paper {paper_millions:g}M ({off:+.1%})"
    if abs(off) > tolerance:
        return False, (f"{text}: more than {tolerance:.0%} off the paper's count, so this is not the paper's model "
                       f"(check the setting's embeddings and the dataset's dictionary sizes)")
    return True, text


def judge_parameters(built: int, row) -> Tuple[str, str]:
    """(status, text) of a paper-scale row's parameters: ``ok`` within :data:`PARAM_TOLERANCE`, else ``GAP``
    with the row's ``params_gap`` where it has one, else ``FAIL``."""
    within, text = compare_parameters(built, row.paper.get("params"))
    if within:
        return "ok  ", text
    if row.params_gap:
        return "GAP ", f"{text.split(':')[0]}: the paper's count is not buildable: {row.params_gap}"
    return "FAIL", text


def fairseq_config(args: List[str]):
    """fairseq-train's parse of ``args`` and its configuration (fairseq's ``convert_namespace_to_omegaconf``); an
    unknown argument is refused as fairseq-train refuses it."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parsed, unknown = options.parse_args_and_arch(options.get_training_parser(), list(args), parse_known=True)
    if unknown:
        raise SystemExit(f"fairseq-train: unrecognized arguments: {' '.join(unknown)}")
    return convert_namespace_to_omegaconf(parsed)


def count_parameters(args: List[str]) -> int:
    """Parameters of the model fairseq-train ``args`` build, on the meta device (no memory, no initialisation)."""
    import torch
    from fairseq import tasks

    cfg = fairseq_config(args)
    task = tasks.setup_task(cfg.task)
    with torch.device("meta"):
        model = task.build_model(cfg.model)
    return sum(p.numel() for p in model.parameters())


def dataset_for(table: Table, scale: str, dataset: Optional[str] = None) -> Optional[str]:
    """The dataset ``make table-<id> SCALE=<scale>`` runs on (as ``python -m diverse_fairseq.tables``)."""
    return dataset or (table.paper_dataset if scale == "paper" else "demo")


def row_plan(row: Row, dataset: str, scale: str, data_bin: Path, gpus: int, precision: Optional[str] = None) -> Plan:
    """The plan the table runner would train ``row`` (seed 1) with (``precision``: as ``PRECISION``)."""
    run = RunConfig(dataset=dataset, scale=scale, seeds=[1], gpus=gpus, out_dir=data_bin.parent, data_bin=data_bin,
                    train_options=TrainOptions(precision=precision))
    return job_plan(row, run, 1)


def _synthetic_batch(task, batch: int = 4, src_len: int = 7, tgt_len: int = 6) -> Dict:
    import torch

    gen = torch.Generator().manual_seed(0)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    src = torch.randint(src_dict.nspecial, len(src_dict), (batch, src_len), generator=gen)
    src[:, -1] = src_dict.eos()
    tgt = torch.randint(tgt_dict.nspecial, len(tgt_dict), (batch, tgt_len), generator=gen)
    tgt[:, -1] = tgt_dict.eos()
    prev = torch.cat([torch.full((batch, 1), tgt_dict.eos()), tgt[:, :-1]], dim=1)
    return {"id": torch.arange(batch), "nsentences": batch, "ntokens": batch * tgt_len, "target": tgt,
            "net_input": {"src_tokens": src, "src_lengths": torch.full((batch,), src_len),
                          "prev_output_tokens": prev}}


def build_and_step(args: List[str], layers: int, step: bool) -> Result:
    """Build task, model, criterion and optimizer from fairseq-train ``args``; with ``step``, train one step."""
    import torch
    from fairseq import tasks
    from fairseq.trainer import Trainer

    threads = torch.get_num_threads()
    if step:  # a tiny model: one thread is several times faster on a busy machine than threads that wait
        torch.set_num_threads(1)
    try:
        cfg = fairseq_config(args)
        task = tasks.setup_task(cfg.task)
        torch.manual_seed(1)
        model = task.build_model(cfg.model)
        depth = (len(model.encoder.layers), len(model.decoder.layers))
        if depth != (layers, layers):
            return Result(False, f"the model has {depth[0]}+{depth[1]} layers, the setting says {layers}+{layers}")
        criterion = task.build_criterion(cfg.criterion)
        parameters = sum(p.numel() for p in model.parameters())
        trainer = Trainer(cfg, task, model, criterion)
        trainer.optimizer  # built lazily, with the learning-rate schedule
        if not step:
            return Result(True, "built", parameters)
        logs = trainer.train_step([_synthetic_batch(task)])
        if logs is None:
            return Result(False, "the training step was skipped (overflow or an empty batch)", parameters)
        if trainer.get_num_updates() != 1:
            return Result(False, f"{trainer.get_num_updates()} updates after one step", parameters)
        loss = float(logs["loss"]) if "loss" in logs else float("nan")
        if not torch.isfinite(torch.tensor(loss)):
            return Result(False, f"loss {loss} after one step", parameters)
        return Result(True, f"built, one step (loss {loss:.2f})", parameters)
    except (Exception, SystemExit) as e:  # noqa: BLE001 -- every failure is reported, with its type
        text = str(e).strip().splitlines()
        return Result(False, f"{type(e).__name__}: {text[-1] if text else ''}")
    finally:
        torch.set_num_threads(threads)


def real_dictionaries(data_bin: Optional[Path], dataset: str) -> Optional[Dict[str, int]]:
    """``{lang: entries}`` (special symbols included) of a prepared dataset's dictionaries under ``data_bin``;
    None without ``prepare.json`` or a dictionary, or for :func:`write_synthetic_data`'s."""
    data = Path(data_bin or ".") / dataset
    if data_bin is None or not (data / "prepare.json").is_file():
        return None
    meta = load_dataset_meta(data)
    files = {lang: data / f"dict.{lang}.txt" for lang in (meta.source_lang, meta.target_lang)}
    if meta.synthetic or not all(f.is_file() for f in files.values()):
        return None
    # fairseq adds <s>, <pad>, </s>, <unk> to the file's entries
    return {lang: len(f.read_text(encoding="utf-8").splitlines()) + 4 for lang, f in files.items()}


def real_data_note(row: Row, dataset: str, data_bin: Path, gpus: int, precision: Optional[str],
                   counted: Dict[str, int]) -> str:
    """"; real dictionaries of data-bin/x (de 8,848 / en 8,848 entries): 36.75M params, paper 37M (-0.7%)" for
    a prepared dataset, else "" (``counted``: counts by run identity; the rows of one run, whose commands differ
    only in their directories and log file or in a default spelled out, are counted once, as :func:`check` builds
    them once)."""
    sizes = real_dictionaries(data_bin, dataset)
    if sizes is None:
        return ""
    job = row_plan(row, dataset, "paper", Path(data_bin), gpus, precision)
    key = json.dumps(job.identity, sort_keys=True)
    if key not in counted:
        counted[key] = count_parameters(list(job.args))
    vocab = " / ".join(f"{lang} {n:,}" for lang, n in sizes.items())
    _, text = compare_parameters(counted[key], row.paper.get("params"))
    return f"; real dictionaries of {Path(data_bin) / dataset} ({vocab} entries): {text.split(': ')[0]}"


def check(tables: List[Table], scales=SCALES, paper_gpus: int = 8, dataset: Optional[str] = None,
          out=print, real_data_bin: Optional[Path] = None) -> Tuple[int, List[str]]:
    """Check every row of ``tables`` at ``scales``; print a line each; return (lines, failures)."""
    import torch

    failures, done, lines, counted = [], {}, 0, {}
    paper_precision = "fp16" if torch.cuda.is_available() else "fp32"
    with tempfile.TemporaryDirectory(prefix="check-tables-") as tmp:
        data_bin = Path(tmp) / "data-bin"
        for scale in scales:
            gpus = 0 if scale == "demo" else paper_gpus
            out(f"# scale={scale}: " + ("the CPU, fp32, one training step each" if scale == "demo" else
                f"commands for {gpus} GPUs, built in {paper_precision}, no step"))
            for table in tables:
                name = dataset_for(table, scale, dataset)
                for row in table.rows:
                    where = f"{table.table}:{row.id} scale={scale}"
                    lines += 1
                    if name is None:
                        out(f"skip {where}: the table names no paper dataset (make table-<id> needs DATASET)")
                        continue
                    start, note = time.perf_counter(), ""
                    try:
                        write_synthetic_data(data_bin, name)
                        job = row_plan(row, name, scale, data_bin, gpus, None if scale == "demo" else paper_precision)
                    except (Exception, SystemExit) as e:  # noqa: BLE001 -- reported with its type
                        result = Result(False, f"{type(e).__name__}: {e}")
                    else:
                        changes = scale_mod.changes(row.args, scale_mod.row_args(row.args, job.setting_name))
                        d = job.decoding  # how the row's runs decode (validation BLEU and test)
                        note = (f" [layers mapped: {'; '.join(changes)}]" if changes else "") + (
                            f" [decoding: {d.beam_search} beam search {d.beam}, {d.length_penalty} length penalty "
                            f"{d.lenpen:g}, at most "
                            f"{d.max_len_a:g}·|x| + {d.max_len_b} tokens]" if scale == "paper" else "")
                        key = (scale, json.dumps(job.identity, sort_keys=True))  # the same run: built once
                        if key in done:
                            note = f" (the command of {done[key][1]}){note}"
                        else:
                            done[key] = (build_and_step(list(job.args), job.setting.layers, step=scale == "demo"),
                                         f"{table.table}:{row.id}")
                            if scale == "paper":  # a model and its optimizer of up to a few GB
                                gc.collect()
                        result = done[key][0]
                    params = f"{result.parameters / 1e6:.2f}M params" if result.parameters else "–"
                    status = "ok  "
                    if result.ok and result.parameters and scale == "paper":
                        status, params = judge_parameters(result.parameters, row)
                        if status == "FAIL":
                            result = Result(False, params, result.parameters)
                    params = "" if params == result.message else f", {params}"
                    if scale == "paper" and result.ok:
                        try:
                            params += real_data_note(row, name, real_data_bin, gpus, paper_precision, counted)
                        except (Exception, SystemExit) as e:  # noqa: BLE001 -- reported with its type
                            result = Result(False, f"on the real dictionaries of {real_data_bin / name}: "
                                                   f"{type(e).__name__}: {e}")
                    status = status if result.ok else "FAIL"
                    out(f"{status} {where} dataset={name}: {result.message}{params}, "
                        f"{time.perf_counter() - start:.1f}s{note}")
                    if not result.ok:
                        failures.append(f"{where}: {result.message}")
    return lines, failures


@dataclass(frozen=True)
class CheckOptions:
    """The options of ``python -m diverse_fairseq.tables.check`` (``make check-tables``)."""

    scale: Optional[str] = option("SCALE", "check one scale only, demo or paper; default: both", None, choice(SCALES))
    paper_gpus: int = option(None, "GPUs the paper-scale command is built for (8, the papers'; it sets --update-freq "
                                   "and --fp16)", 8, integer(1))
    dataset: Optional[str] = option("DATASET", "dataset for every table; default: the paper's / demo, as make "
                                               "table-<id>", None, choice(sorted(RECIPES)))
    data_bin: Path = data_bin_option("where `make data` put the prepared datasets; at paper scale the rows of a "
                                     "prepared dataset also get their parameters on its real dictionaries")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m diverse_fairseq.tables.check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tables", nargs="*", help="table ids (default: every configs/tables/*.yaml)")
    args = add_options(p, CheckOptions).parse_args(argv)
    warn_misspelled(os.environ, "check-tables")
    a = resolve(CheckOptions, os.environ, args)
    setup_cli_logging(logging.WARNING)  # fairseq's model and optimizer messages for every row are noise here
    warnings.simplefilter("ignore", (UserWarning, FutureWarning, DeprecationWarning))  # hydra's, torch's
    names = args.tables or sorted(path.stem for path in TABLE_DIR.glob("*.yaml"))
    tables = [load_table(n) for n in names]
    start = time.perf_counter()
    lines, failures = check(tables, (a.scale,) if a.scale else SCALES, a.paper_gpus, a.dataset,
                            out=lambda s: print(s, flush=True), real_data_bin=a.data_bin)
    print(f"\n{lines} table/row/scale lines, {len(failures)} failed, {time.perf_counter() - start:.0f}s")
    for f in failures:
        print(f"FAILED {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
