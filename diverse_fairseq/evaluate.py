"""Evaluate a checkpoint on a prepared dataset: detokenized output, sacrebleu BLEU with its signature, a tokenized
BLEU (case-sensitive, compound-split for German, as WMT14 En-De results were commonly scored at the time; the papers
report "case-sensitive 4-gram NIST BLEU", which neither number is; docs/paper-settings.md#evaluation), and decoding
speed.

    python -m diverse_fairseq.evaluate CHECKPOINT DATASET [options] [extra fairseq-generate options]
    scripts/evaluate.sh CHECKPOINT DATASET [...]

DATASET is a name under DATA_BIN (default data-bin/) or a directory made by ``prepare_data``; its ``prepare.json``
says how the text was segmented and tokenized, and which beam/length penalty the recipe uses. The output directory
(``--out``, default ``<checkpoint dir>/eval-<dataset>-<subset>-<name>``) receives ``generate-<subset>.txt``
(fairseq-generate's output, decoded in this process) and ``generate-<subset>.log`` (its log), ``hyp.detok.<tgt>``,
``hyp.tok.<tgt>``/``ref.tok.<tgt>`` (tokenized, compound-split where the BLEU is), ``ref.detok.<tgt>`` and
``results.json``. Compare two systems with
``python -m diverse_fairseq.significance``.
"""

import argparse
import json
import logging
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from sacrebleu.metrics import BLEU

from .data.text import compound_split, detokenize, tokenize
from .methods.length_penalty import BEAM_SEARCHES, LENGTH_PENALTIES
from .runs.checkpoint_file import check_dataset, read_checkpoint
from .runs.cli_logging import CONFIG_DUMP, DATE_FORMAT, LOG_FORMAT, fairseq_main_logging, setup_cli_logging
from .runs.dataset_meta import DatasetMeta, load_dataset_meta
from .runs.hints import shown_command, translate_command
from .runs.options import (
    add_options,
    choice,
    flag_of,
    integer,
    number,
    option,
    options_of,
    resolve,
    switch,
    warn_misspelled,
)
from .runs.options import path as a_path
from .runs.paper_bleu import authors_bleu
from .runs.paths import DataBin
from .runs.plan import PRECISIONS, task_args
from .user_dir import USER_DIR  # the package directory, for --user-dir

_TRANSLATED = re.compile(
    r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s \(([\d.]+) sentences/s, ([\d.]+) tokens/s\)")


def parse_generate_output(text: str) -> Dict[str, Dict[int, str]]:
    """Hypotheses and targets by sentence id from fairseq-generate's output."""
    texts = {"H": {}, "T": {}}  # lines "H-<id>\t<score>\t<text>" and "T-<id>\t<text>"
    for line in text.splitlines():
        if line[:1] in texts and line[1:2] == "-":
            columns, column = line.split("\t"), 2 if line[0] == "H" else 1
            texts[line[0]][int(columns[0][2:])] = columns[column] if len(columns) > column else ""
    return {"hyps": texts["H"], "targets": texts["T"]}


def parse_generate_speed(text: str) -> Optional[Dict[str, float]]:
    """The decoding speed reported by fairseq-generate (``Translated N sentences (M tokens) in Ts ...``)."""
    matches = _TRANSLATED.findall(text)
    if not matches:
        return None
    n, tokens, seconds, sps, tps = matches[-1]
    return {"sentences": int(n.replace(",", "")), "tokens": int(tokens.replace(",", "")), "seconds": float(seconds),
            "sentences_per_second": float(sps), "tokens_per_second": float(tps)}


def _in_order(by_id: Dict[int, str], n: int, what: str) -> List[str]:
    missing = [i for i in range(n) if i not in by_id]
    if missing or len(by_id) != n:
        raise SystemExit(f"error: fairseq-generate produced {len(by_id)} {what} for {n} sentences "
                         f"(missing ids {missing[:10]}...). Was a sentence skipped as too long? Do not pass "
                         f"--skip-invalid-size-inputs-valid-test, or raise --max-source-positions.")
    return [by_id[i] for i in range(n)]


def resolve_data(dataset: str, data_bin: str) -> Path:
    """A prepared dataset's folder: ``dataset`` itself, else the name under ``data_bin``."""
    return Path(dataset) if (Path(dataset) / "prepare.json").exists() else Path(data_bin) / dataset


def bleu_scores(hyps_detok: List[str], refs_detok: List[str], hyps_tok: List[str], refs_tok: List[str],
                meta: DatasetMeta) -> Dict[str, object]:
    """sacrebleu BLEU on detokenized text (with signature) and tokenized BLEU (tokenize=none)."""
    sacre = BLEU(tokenize=meta.sacrebleu_tokenize, lowercase=meta.lowercase)
    score = sacre.corpus_score(hyps_detok, [refs_detok])
    tok_score = BLEU(tokenize="none", force=True).corpus_score(hyps_tok, [refs_tok])
    return {
        "bleu": round(score.score, 2), "bleu_detail": str(score), "signature": str(sacre.get_signature()),
        "tok_bleu": round(tok_score.score, 2), "tok_bleu_detail": str(tok_score),
        "tok_bleu_kind": "tokenized" + (", compound-split" if meta.compound_split else "") +
                         (", lowercased" if meta.lowercase else ""),
    }


def tokenized_pair(hyps_model: List[str], hyps_detok: List[str], refs_detok: List[str], data_dir: Path, subset: str,
                   meta: DatasetMeta):
    """The tokenized hypothesis and reference lines for the tokenized BLEU."""
    def tok(lines):  # a zh target without a recorded segmenter: characters, as WMT17 Zh results are commonly scored
        return [tokenize(s, meta.target_lang, aggressive_dash=meta.aggressive_dash, lowercase=meta.lowercase,
                         zh_seg=meta.zh_seg or "char") for s in lines]

    hyps = hyps_model if meta.moses_tokenized else tok(hyps_detok)
    ref_file = data_dir / f"{subset}.tok.{meta.target_lang}"
    refs = ref_file.read_text(encoding="utf-8").splitlines() if ref_file.exists() else tok(refs_detok)
    if meta.compound_split:
        hyps, refs = [compound_split(s) for s in hyps], [compound_split(s) for s in refs]
    return hyps, refs


def run_generate(cmd: List[str], log_file: Path) -> None:
    """fairseq-generate's ``main`` in this process on the arguments of ``cmd`` (:func:`generate_command`'s command
    line, which the user sees and can run as printed), so that evaluating costs no second start of torch and
    fairseq. Its log lines go to ``log_file`` as well as to this process's log; any failure raises SystemExit with
    fairseq's error and ``log_file``, which holds its traceback. Ctrl-C is not caught."""
    from fairseq import options
    from fairseq_cli.generate import main as generate_main

    log = logging.FileHandler(log_file, mode="w", encoding="utf-8")
    log.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
    log.addFilter(CONFIG_DUMP)
    # a handler before fairseq-generate's own basicConfig, which would otherwise log into its output file
    with fairseq_main_logging(log):
        try:
            parser = options.get_generation_parser()
            parser.add_argument("--arch", "-a", default="wav2vec2", help="as fairseq-generate's own parser")
            generate_main(options.parse_args_and_arch(parser, cmd[cmd.index("fairseq_cli.generate") + 1:]))
        except Exception as e:  # noqa: BLE001 - any failure of fairseq's: one error line, the traceback in the log
            logging.getLogger("fairseq_cli.generate").exception("fairseq-generate failed")
            raise SystemExit(f"error: fairseq-generate failed: {type(e).__name__}: {e}; its log is {log_file}") \
                from None
        except SystemExit as e:  # its argument parser's error (printed above), or an exit of its own
            if e.code not in (None, 0):
                raise SystemExit(f"error: fairseq-generate failed (exit {e.code}): its options are wrong (the "
                                 f"message above); its log is {log_file}") from None


@dataclass(frozen=True)
class EvalRequest:
    """One evaluation: what :func:`evaluate` decodes and scores. ``main`` builds it from the command line and the
    environment (:func:`build_parser`); the table runner from the table alone, so no variable changes it."""

    checkpoint: Path
    data_dir: Path  # a prepared dataset (with prepare.json)
    subset: str = option("SUBSET", "valid or test", "test", choice(("test", "valid")))
    beam: Optional[int] = option("BEAM", "default: the recipe's (prepare.json)", None, integer(1))
    lenpen: Optional[float] = option("LENPEN", "default: the recipe's", None, number())
    length_penalty: str = option(
        "LENGTH_PENALTY", "how --lenpen normalises a finished hypothesis' score by its length |y| (EOS included): "
        "'fairseq' divides by |y|^lenpen, 'gnmt' by ((5 + |y|)/6)^lenpen (GNMT's, as the THUMT papers decoded: their "
        "settings base and big use it); default fairseq", "fairseq", choice(LENGTH_PENALTIES))
    beam_search: str = option(
        "BEAM_SEARCH", "the beam search: 'fairseq' (fairseq's) or 'thumt' (THUMT's, as the THUMT papers decoded: their "
        "settings base and big use it; at the length limit a hypothesis without EOS, an empty output allowed); "
        "default fairseq", "fairseq", choice(BEAM_SEARCHES))
    max_len_a: Optional[float] = option(
        "MAX_LEN_A", "at most max-len-a * source length (with its EOS) + max-len-b output tokens; default: the "
        "recipe's (the THUMT settings: 1, with --max-len-b 49: |x| + 50 tokens)", None, number())
    max_len_b: Optional[int] = option("MAX_LEN_B", "default: the recipe's", None, integer(0))
    batch_size: int = option("BATCH_SIZE", "sentences per batch", 128, integer(1))
    out: Optional[Path] = option("OUT", "output directory (default <checkpoint dir>/eval-<dataset>-<subset>-"
                                        "<checkpoint name>)", None, a_path)
    cpu: bool = option("CPU", "decode on the CPU even with a GPU (CPU=1)", False, switch, store_true=True)
    precision: str = option("PRECISION", "decoding precision on a GPU: fp16 or bf16; the other training precisions "
                                         "(amp, memory-efficient-fp16, fp32) decode in fp32", "fp32",
                            choice(PRECISIONS))
    generate_args: Tuple[str, ...] = ()  # extra fairseq-generate options


@dataclass(frozen=True)
class EvalRecord:
    """What :func:`evaluate` measured, as ``results.json`` holds it (:func:`dataclasses.asdict`)."""

    checkpoint: str
    dataset: str
    data: str  # the prepared data decoded (its dictionaries: the table report's parameter footnote)
    subset: str  # the split decoded: test or valid
    out: str  # the folder of hyp.detok.<target_lang>, ref.detok.<target_lang> and results.json
    target_lang: str
    sentences: int
    beam: int
    lenpen: float
    max_len_a: float
    max_len_b: int
    length_penalty: str
    batch_size: int
    device: str  # gpu or cpu
    reference: str  # what the hypotheses were scored against
    bleu: float  # sacrebleu on detokenized text
    bleu_detail: str
    signature: str  # sacrebleu's
    tok_bleu: float
    tok_bleu_detail: str
    tok_bleu_kind: str
    paper_bleu: Optional[float] = None  # the authors' own scoring (runs/paper_bleu.py), where the dataset has one
    paper_bleu_kind: Optional[str] = None
    paper_bleu_detail: Optional[str] = None
    speed: Optional[Dict] = None  # fairseq-generate's: {"sentences", "seconds", "sentences_per_second", ...}


def build_parser():
    """The options; each defaults to its environment variable (in brackets), checked before any work."""
    p = argparse.ArgumentParser(prog="evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="checkpoint file (.pt)")
    p.add_argument("dataset", help="dataset name under --data-bin, or a prepared dataset directory")
    add_options(p, DataBin, EvalRequest)
    p.add_argument("--fp16", dest="precision", action="store_const", const="fp16", help="the same as --precision fp16")
    return p


def command_line(request: EvalRequest) -> List[str]:
    """``python -m diverse_fairseq.evaluate`` arguments that make ``request`` (every option spelled out, so
    that no environment variable changes it); what a dry run prints."""
    args = [str(request.checkpoint), str(request.data_dir)]
    for f in options_of(EvalRequest):
        value, flag = getattr(request, f.name), flag_of(f)
        if value is True:
            args.append(flag)
        elif value is not None and value is not False:  # a float as short as it reads back: 1.0 is "1"
            args += [flag, str(value).removesuffix(".0") if isinstance(value, float) else str(value)]
    return args + list(request.generate_args)


def parse_request(argv: Optional[List[str]], env: Mapping[str, str]) -> EvalRequest:
    """The :class:`EvalRequest` of a command line and the environment (checked; SystemExit naming a bad value)."""
    args, extra = build_parser().parse_known_args(argv)
    if Path(args.dataset).suffix == ".pt":
        raise SystemExit(f"error: the second argument {args.dataset!r} is a checkpoint, not a dataset: name one "
                         "checkpoint (a checkpoints/NAME-*/ pattern matching several variants gives several)")
    data_bin = resolve(DataBin, env, args).data_bin
    return resolve(EvalRequest, env, args, checkpoint=Path(args.checkpoint),
                   data_dir=resolve_data(args.dataset, data_bin), generate_args=tuple(extra))


def main(argv=None):
    setup_cli_logging()
    warn_misspelled(os.environ, "evaluate")
    return evaluate(parse_request(argv, os.environ))


def decoding(request: EvalRequest, meta: DatasetMeta) -> Dict[str, object]:
    """beam, lenpen (the penalty's value), max_len_a, max_len_b: the request's where it gives them, else the
    recipe's (``prepare.json``)."""
    return {key: getattr(meta if getattr(request, key) is None else request, key)
            for key in ("beam", "lenpen", "max_len_a", "max_len_b")}


def generate_command(request: EvalRequest, meta: DatasetMeta, out: Path, on_gpu: bool) -> List[str]:
    """The fairseq-generate command that decodes ``request.subset`` into ``out`` as :func:`decoding` says, GNMT's
    length penalty and THUMT's search through the plugin's ``--task translation_length_penalty``."""
    d = decoding(request, meta)
    cmd = [sys.executable, "-m", "fairseq_cli.generate", str(request.data_dir), "--path", str(request.checkpoint),
           "--user-dir", USER_DIR, *task_args(request.length_penalty, request.beam_search),
           "--source-lang", meta.source_lang,
           "--target-lang", meta.target_lang, "--gen-subset", request.subset, "--beam", str(d["beam"]),
           "--lenpen", str(d["lenpen"]), "--batch-size", str(request.batch_size),
           "--max-len-a", f"{d['max_len_a']:g}", "--max-len-b", str(d["max_len_b"]),
           "--post-process", meta.post_process, "--results-path", str(out),
           # fairseq 0.12 drops the sentences of a last, partial batch when this is 8 (its default)
           "--required-batch-size-multiple", "1",
           # the batches read in the decoding process (fairseq's one loader process would be forked from it)
           "--num-workers", "0"]
    if not on_gpu:
        cmd.append("--cpu")
    elif request.precision in ("fp16", "bf16"):
        cmd.append(f"--{request.precision}")
    return cmd + list(request.generate_args)


def evaluate(request: EvalRequest) -> EvalRecord:
    """Decode ``request.subset`` with the checkpoint (fairseq-generate, :func:`run_generate`), detokenize, score;
    write the outputs and ``results.json`` (:class:`EvalRecord`) into the output directory and return the record."""
    data_dir, subset, ckpt = Path(request.data_dir), request.subset, Path(request.checkpoint)
    meta = load_dataset_meta(data_dir)
    tgt = meta.target_lang
    # before any output: a truncated file, one that is not a checkpoint, or a model of another dataset
    check_dataset(read_checkpoint(ckpt), ckpt, data_dir, meta.source_lang, tgt)
    out = Path(request.out or ckpt.parent / f"eval-{meta.dataset}-{subset}-{ckpt.stem}")
    out.mkdir(parents=True, exist_ok=True)

    on_gpu = torch.cuda.is_available() and not request.cpu
    cmd, d = generate_command(request, meta, out, on_gpu), decoding(request, meta)
    print(f"[evaluate] step 1/3: decode {data_dir} {subset} with {ckpt} (beam {d['beam']}, lenpen {d['lenpen']} "
          f"({request.length_penalty}), at most {d['max_len_a']:g}·|x|+{d['max_len_b']} tokens, "
          f"{'GPU' if on_gpu else 'CPU'})", flush=True)
    print("  " + shown_command(cmd), flush=True)
    gen_file, log_file = out / f"generate-{subset}.txt", out / f"generate-{subset}.log"
    run_generate(cmd, log_file)

    print("[evaluate] step 2/3: detokenize and collect references", flush=True)
    generated = gen_file.read_text(encoding="utf-8")
    parsed = parse_generate_output(generated)
    n = len(parsed["targets"]) or len(parsed["hyps"])
    hyps_model = _in_order(parsed["hyps"], n, "hypotheses")
    ref_name = meta.references.get(subset)
    # the targets: the reference without a raw one, and the IWSLT14 authors' BLEU (runs/paper_bleu.py)
    targets = _in_order(parsed["targets"], n, "targets") if parsed["targets"] or not ref_name else None

    def detok(lines):
        return [detokenize(line, tgt) for line in lines] if meta.moses_tokenized else lines

    hyps_detok = detok(hyps_model)
    if ref_name:
        refs_detok = (data_dir / ref_name).read_text(encoding="utf-8").split("\n")[:-1]
        ref_kind = f"raw reference {ref_name}"
    else:
        refs_detok = detok(targets)
        ref_kind = "processed target side of the binarized data (no raw reference for this split)"
    if len(refs_detok) != len(hyps_detok):
        raise SystemExit(f"error: {len(hyps_detok)} hypotheses but {len(refs_detok)} references in {ref_name}")
    hyps_tok, refs_tok = tokenized_pair(hyps_model, hyps_detok, refs_detok, data_dir, subset, meta)
    for name, lines in ((f"hyp.detok.{tgt}", hyps_detok), (f"ref.detok.{tgt}", refs_detok),
                        (f"hyp.tok.{tgt}", hyps_tok), (f"ref.tok.{tgt}", refs_tok)):
        (out / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")

    print("[evaluate] step 3/3: score", flush=True)
    log_text = log_file.read_text(encoding="utf-8", errors="replace")
    r = EvalRecord(checkpoint=str(ckpt), dataset=meta.dataset, data=str(data_dir), subset=subset, out=str(out),
                   target_lang=tgt, sentences=n, **d, length_penalty=request.length_penalty,
                   batch_size=request.batch_size, device="gpu" if on_gpu else "cpu", reference=ref_kind,
                   **bleu_scores(hyps_detok, refs_detok, hyps_tok, refs_tok, meta),
                   **authors_bleu(meta.dataset, hyps_model, targets, refs_detok, tgt),
                   speed=parse_generate_speed(log_text) or parse_generate_speed(generated))
    (out / "results.json").write_text(json.dumps(asdict(r), indent=1) + "\n")
    speed = r.speed
    print(f"BLEU (sacrebleu, detokenized) = {r.bleu:.2f}   {r.signature}\n"
          f"BLEU ({r.tok_bleu_kind}) = {r.tok_bleu:.2f}\n" +
          (f"BLEU ({r.paper_bleu_kind}) = {r.paper_bleu:.2f}\n" if r.paper_bleu is not None else "") +
          (f"decoding: {speed['sentences']} sentences in {speed['seconds']:.1f}s = "
           f"{speed['sentences_per_second']:.2f} sentences/s ({speed['tokens_per_second']:.1f} tokens/s)\n"
           if speed else "") +
          f"outputs and results.json in {out}\n"
          f"to translate your own text: {translate_command(ckpt, data_dir)} "
          f"(prints the fairseq-interactive command; docs/translating.md)", flush=True)
    return r


if __name__ == "__main__":
    main()
