"""Your own corpus: ``scripts/prepare_data.sh custom`` on tests/fixtures/custom_corpus (300 training pairs and 40
valid/test pairs cut from the demo corpus in data/demo), the checks that reject a malformed corpus folder before any
work, the setting a custom dataset trains with, and prepare → a few training updates → evaluate end to end."""

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import CUSTOM_CORPUS as CORPUS
from conftest import custom_script_env, lines

from diverse_fairseq import training
from diverse_fairseq.data.prepare import main as prepare
from diverse_fairseq.data.text import tokenize
from diverse_fairseq.runs import settings
from diverse_fairseq.runs.hints import translate_command

REPO = Path(__file__).resolve().parents[2]
ENV_KEYS = ("BPE", "BPE_SIZE", "WORK_DIR", "DATA_BIN", "WORKERS", "SRC", "TGT", "CORPUS_DIR", "DATASET_NAME",
            "SEPARATE_VOCAB", "PROGRESS_INTERVAL", "STOP_AFTER", "GPUS", "SAVE_DIR", "NNODES", "MAX_TOKENS",
            "UPDATE_FREQ", "PRECISION", "AVERAGE", "OUT", "SUBSET", "SLURM_NNODES")


def args(tmp_path, corpus=CORPUS, *extra):
    return ["custom", "--src", "en", "--tgt", "de", "--corpus-dir", str(corpus), "--work-dir", str(tmp_path / "work"),
            "--data-bin", str(tmp_path / "data-bin"), "--bpe-size", "200", "--workers", "1", *extra]


def load_split(dest: Path, split: str, lang: str, src="en", tgt="de"):
    """The binarized sentences of ``split`` in ``lang``, read back with fairseq and its dictionary."""
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(dest / f"dict.{lang}.txt"))
    dataset = data_utils.load_indexed_dataset(str(dest / f"{split}.{src}-{tgt}.{lang}"), dictionary)
    assert dataset is not None, f"{dest}/{split}.{src}-{tgt}.{lang} does not parse"
    return dictionary, dataset


def test_custom_corpus_with_subword_nmt_binarizes_every_split(custom_prepared):
    root, out = custom_prepared
    assert "train: 300 sentence pairs in train.en / train.de" in out and "step 7/7: binarize" in out
    dest = root / "data-bin" / "custom_en_de"
    meta = json.loads((dest / "prepare.json").read_text())
    assert meta["dataset"] == "custom_en_de" and meta["recipe"] == "custom"
    assert (meta["source_lang"], meta["target_lang"]) == ("en", "de")
    assert meta["bpe"] == "subword-nmt" and meta["bpe_size"] == 200 and meta["moses_tokenized"]
    assert meta["post_process"] == "subword_nmt" and meta["joined_dictionary"] and (dest / "codes").exists()
    assert meta["sentences"] == {"train": 300, "valid": 40, "test": 40}
    # the <unk> rates fairseq-preprocess reports (valid 0.105% / 0.0%, test 0.35% / 0.357%), printed and recorded
    assert "<unk> after binarisation: valid en 0.11%, de 0.00%; test en 0.35%, de 0.36%" in out
    assert meta["unk"] == {"valid": {"en": 0.11, "de": 0.0}, "test": {"en": 0.35, "de": 0.36}}
    assert "are <unk>" not in out  # below 1%: no warning
    # the raw test reference for sacrebleu is the user's file, unchanged
    assert lines(dest / "test.ref.de") == lines(CORPUS / "test.de")
    assert lines(dest / "test.tok.de") == [tokenize(s, "de") for s in lines(CORPUS / "test.de")]
    # every split parses and holds the Moses-tokenized text of the user's files, segmented by BPE
    for split, n in meta["sentences"].items():
        for lang in ("en", "de"):
            dictionary, dataset = load_split(dest, split, lang)
            assert len(dataset) == n
            raw = lines(CORPUS / f"{split}.{lang}")
            assert [dictionary.string(dataset[i], "subword_nmt") for i in (0, n - 1)] == \
                [tokenize(raw[i], lang) for i in (0, n - 1)]


def test_many_unk_tokens_are_warned_of_with_a_bpe_size_that_fits(tmp_path, monkeypatch, capsys):
    """The default 10,000 merges on 120 pairs: subword-nmt learns 1,049, and 6-7% of the held-out tokens are
    <unk> (fairseq-preprocess says so; the preparation used to drop it). The warning names BPE_SIZE and a command
    with a size that fits; that command, run as printed, brings every rate under 1%."""
    import shlex

    corpus = tmp_path / "corpus"
    shutil.copytree(CORPUS, corpus)
    for lang in ("en", "de"):  # 120 training pairs: a corpus of this kind, learned in a second
        (corpus / f"train.{lang}").write_text("\n".join(lines(CORPUS / f"train.{lang}")[:120]) + "\n")
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    prepare(["custom", "--src", "en", "--tgt", "de", "--corpus-dir", str(corpus), "--work-dir", str(tmp_path / "work"),
             "--data-bin", str(tmp_path / "data-bin"), "--workers", "1"])
    out = capsys.readouterr().out
    assert "<unk> after binarisation: valid en 6.97%, de 5.86%; test en 7.05%, de 6.73%" in out
    warning = next(line for line in out.splitlines() if "are <unk>" in line)
    assert "warning: 7.05% of the tokens of a held-out split are <unk>" in warning
    assert "BPE_SIZE=10,000 (1,049 merges learned)" in warning
    # learning itself named the command of the same form with the merges it learned (the one run below is the same)
    assert re.search(r"Lower BPE_SIZE \(--bpe-size\) to 1,049 or less \(1,049 gives the same model; the <unk> rates "
                     r"printed after binarisation say whether a smaller size is needed\): SRC=en .*BPE_SIZE=1049 "
                     r"scripts/prepare_data.sh "
                     r"custom\n", out)
    command = shlex.split(warning.split("<unk>: ", 1)[1])
    assert command[-2:] == ["scripts/prepare_data.sh", "custom"] and (REPO / command[-2]).is_file()
    variables = dict(word.split("=", 1) for word in command[:-2])
    assert variables["BPE_SIZE"] == "262" and variables["CORPUS_DIR"] == str(corpus)
    for key, value in variables.items():  # the command as printed: its variables, then the script's main
        monkeypatch.setenv(key, value)
    prepare([command[-1]])
    rates = json.loads((tmp_path / "data-bin" / "custom_en_de" / "prepare.json").read_text())["unk"]
    assert max(pct for split in rates.values() for pct in split.values()) <= 1.0
    assert "are <unk>" not in capsys.readouterr().out


def test_custom_corpus_with_sentencepiece_separate_vocab_gzip_and_a_name(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    shutil.copytree(CORPUS, corpus)
    with open(corpus / "train.de", "rb") as f, gzip.open(corpus / "train.de.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    (corpus / "train.de").unlink()
    env = dict(SRC="en", TGT="de", CORPUS_DIR=str(corpus), DATASET_NAME="my_corpus", BPE="sentencepiece",
               SEPARATE_VOCAB="1", BPE_SIZE="300", WORK_DIR=str(tmp_path / "work"), DATA_BIN=str(tmp_path / "data-bin"))
    for key, value in env.items():  # the environment variables the scripts and the Makefile pass
        monkeypatch.setenv(key, value)
    prepare(["custom", "--workers", "1"])
    dest = tmp_path / "data-bin" / "my_corpus"
    meta = json.loads((dest / "prepare.json").read_text())
    assert meta["dataset"] == "my_corpus" and meta["bpe"] == "sentencepiece" and meta["post_process"] == "sentencepiece"
    assert not meta["joint_bpe"] and not meta["joined_dictionary"] and not meta["moses_tokenized"]
    assert (dest / "spm.en.model").exists() and (dest / "spm.de.model").exists()
    assert lines(dest / "dict.en.txt") != lines(dest / "dict.de.txt")
    dictionary, dataset = load_split(dest, "test", "de")
    raw = lines(CORPUS / "test.de")
    assert len(dataset) == len(raw) and dictionary.string(dataset[3], "sentencepiece") == raw[3]
    assert not (tmp_path / "data-bin" / "custom_en_de").exists()


def _corrupt(tmp_path, edit):
    corpus = tmp_path / "corpus"
    shutil.copytree(CORPUS, corpus)
    edit(corpus)
    return corpus


@pytest.mark.parametrize("edit, message", [
    (lambda c: (c / "valid.de").unlink(), r"corpus/valid\.de not found \(nor valid\.de\.gz\)\. CORPUS_DIR must hold "
                                          r"train\.en train\.de valid\.en valid\.de test\.en test\.de"),
    (lambda c: (c / "test.en").write_text("one line\n"),
     r"corpus/test\.en has 1 lines but .*corpus/test\.de has 40: line i of one must be the translation"),
    (lambda c: (c / "train.de").write_text(""), r"corpus/train\.de is empty"),
    (lambda c: (c / "train.en").write_bytes("caf\xe9\n".encode("latin-1")),
     r"corpus/train\.en is not UTF-8 text \(line 1"),
])
def test_a_malformed_corpus_is_rejected_before_any_work(tmp_path, edit, message):
    corpus = _corrupt(tmp_path, edit)
    with pytest.raises(SystemExit, match=message):
        prepare(args(tmp_path, corpus))
    assert not (tmp_path / "work" / "custom_en_de" / "raw").exists() and not (tmp_path / "data-bin").exists()


@pytest.mark.parametrize("argv, message", [
    (["custom"], r"the custom dataset needs SRC \(--src\), TGT \(--tgt\), CORPUS_DIR \(--corpus-dir\)"),
    (["custom", "--src", "en", "--tgt", "en", "--corpus-dir", str(CORPUS)], r"SRC and TGT are both 'en'"),
    (["custom", "--src", "e n", "--tgt", "de", "--corpus-dir", str(CORPUS)],
     r"SRC \(--src\)='e n' is not a language code"),
    (["custom", "--src", "en", "--tgt", "de", "--corpus-dir", "/nonexistent/corpus"],
     r"CORPUS_DIR=/nonexistent/corpus is not a folder"),
    (["custom", "--src", "en", "--tgt", "de", "--corpus-dir", str(CORPUS), "--name", "a/b"],
     r"DATASET_NAME \(--name\)='a/b'"),
    (["custom", "--src", "en", "--tgt", "de", "--corpus-dir", str(CORPUS), "--bpe-size", "0"],
     r"BPE_SIZE \(--bpe-size\)='0' is not valid"),
    (["demo", "--src", "fr", "--corpus-dir", str(CORPUS)],
     r"SRC \(--src\), CORPUS_DIR \(--corpus-dir\) only apply to `custom` \(your own corpus\); demo has fixed"),
])
def test_bad_custom_options_are_named(tmp_path, argv, message):
    with pytest.raises(SystemExit, match=message):
        prepare(argv + ["--work-dir", str(tmp_path / "work"), "--data-bin", str(tmp_path / "data-bin")])
    assert not (tmp_path / "work").exists()


def _meta(data_bin: Path, name: str, train_pairs):
    (data_bin / name).mkdir(parents=True, exist_ok=True)
    meta = {"source_lang": "en", "target_lang": "de", "joined_dictionary": True}
    if train_pairs is not None:
        meta["sentences"] = {"train": train_pairs, "valid": 10, "test": 10}
    (data_bin / name / "prepare.json").write_text(json.dumps(meta))


def test_a_custom_dataset_trains_with_a_setting_for_its_size(tmp_path, monkeypatch, capsys):
    data_bin = tmp_path / "data-bin"
    for name, pairs, setting in (("custom_en_de", 300, "tiny"), ("mid", 160_000, "small"), ("big", 4_500_000, "base")):
        _meta(data_bin, name, pairs)
        assert settings.default_setting(name, data_bin) == setting
    assert settings.default_setting("wmt14_en_de", data_bin) == "base"  # the papers' datasets keep theirs
    _meta(data_bin, "unknown", None)
    with pytest.raises(SystemExit, match="no setting can be chosen for unknown: name one"):
        settings.default_setting("unknown", data_bin)
    with pytest.raises(SystemExit, match="prepare the data first"):
        settings.default_setting("missing", data_bin)
    # the table runner at paper scale takes the same default; the command line without a setting too
    from diverse_fairseq.tables.config import RunConfig
    from diverse_fairseq.tables.spec import Row

    run = RunConfig(dataset="mid", scale="paper", seeds=[1], gpus=0, out_dir=tmp_path, data_bin=data_bin)
    assert run.setting(Row(id="base", label="Transformer", family="transformer")) == "small"
    monkeypatch.setenv("DATA_BIN", str(data_bin))
    monkeypatch.setenv("DRY_RUN", "1")
    monkeypatch.setattr(training, "visible_gpus", lambda: 0)
    assert training.main(["custom_en_de", "--max-update", "3"]) == 0
    out = capsys.readouterr().out
    assert "no setting given: custom_en_de trains with 'tiny'" in out
    command = next(line for line in out.splitlines() if "fairseq_cli.train" in line)
    assert "--encoder-layers 2" in command and command.rstrip().endswith("--max-update 3")


@pytest.mark.slow
def test_custom_prepare_train_evaluate_end_to_end(custom_prepared, monkeypatch, capsys):
    """prepare (scripts/prepare_data.sh custom, the fixture) → train → evaluate; the training and evaluation tools'
    ``main`` run in this process with the scripts' environment (scripts/train.sh and evaluate.sh, which only call
    them, run in test_training_eval's demo end to end)."""
    from diverse_fairseq import evaluate

    root, _ = custom_prepared  # prepared by scripts/prepare_data.sh custom
    for key, value in custom_script_env(root).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(training, "visible_gpus", lambda: 0)
    assert (root / "data-bin" / "custom_en_de" / "train.en-de.en.bin").exists()
    assert training.main(["custom_en_de", "tiny", "--max-tokens", "500", "--num-workers", "0"]) == 0
    out = capsys.readouterr().out
    [save_dir] = (root / "checkpoints").glob("custom_en_de_tiny-*")  # one directory per variant
    checkpoint = save_dir / "checkpoint_last.pt"
    assert "on the CPU" in out and checkpoint.exists()
    evaluate.main([str(checkpoint), "custom_en_de", "--max-len-b", "5"])
    out = capsys.readouterr().out
    result_dir = checkpoint.parent / "eval-custom_en_de-test-checkpoint_last"
    results = json.loads((result_dir / "results.json").read_text())
    assert results["dataset"] == "custom_en_de" and results["sentences"] == 40 and 0 <= results["bleu"] <= 100
    assert results["reference"] == "raw reference test.ref.de"
    assert lines(result_dir / "ref.detok.de") == lines(CORPUS / "test.de")
    assert len(lines(result_dir / "hyp.detok.de")) == 40 and "BLEU (sacrebleu, detokenized) =" in out
    # the translate hint names this Python (tests/test_interactive_command.py runs it outside the venv)
    assert f"to translate your own text: {translate_command(checkpoint, root / 'data-bin' / 'custom_en_de')} " in out


def _edit_line(path: Path, number: int, text: str):
    rows = path.read_text(encoding="utf-8").split("\n")
    rows[number - 1] = text
    path.write_text("\n".join(rows), encoding="utf-8")


def test_crlf_and_empty_training_lines_are_counted_and_empty_pairs_dropped(tmp_path, capsys):
    def edit(corpus):
        _edit_line(corpus / "train.de", 5, "  ")  # whitespace only: empty
        _edit_line(corpus / "train.en", 9, "")
        (corpus / "train.en").write_bytes((corpus / "train.en").read_bytes().replace(b"\n", b"\r\n"))
    corpus = _corrupt(tmp_path, edit)
    prepare(args(tmp_path, corpus))
    out = capsys.readouterr().out
    assert "warning: " + str(corpus / "train.en") + ": 300 of 300 lines end in CR LF (Windows line ends)" in out
    assert "warning: train: 2 of 300 sentence pairs have an empty side (lines 5, 9 of train.en / train.de); " \
           "they are dropped" in out
    meta = json.loads((tmp_path / "data-bin" / "custom_en_de" / "prepare.json").read_text())
    assert meta["sentences"] == {"train": 298, "valid": 40, "test": 40}
    dictionary, dataset = load_split(tmp_path / "data-bin" / "custom_en_de", "train", "en")
    assert "\r" not in "".join(dictionary.symbols)  # the CR never reaches the vocabulary
    raw = lines(CORPUS / "train.en")
    kept = [s for i, s in enumerate(raw, 1) if i not in (5, 9)]
    assert dictionary.string(dataset[len(dataset) - 1], "subword_nmt") == tokenize(kept[-1], "en")


@pytest.mark.parametrize("name, number, what", [("valid.de", 3, "reference"), ("test.en", 40, "source sentence")])
def test_an_empty_line_in_valid_or_test_is_refused_naming_file_and_line(tmp_path, name, number, what):
    corpus = _corrupt(tmp_path, lambda c: _edit_line(c / name, number, ""))
    split = name.split(".")[0]
    with pytest.raises(SystemExit, match=rf"corpus/{name} line {number} is empty \(1 empty lines in all: {number}\): "
                                         rf"an empty {what} in {split} would be scored"):
        prepare(args(tmp_path, corpus))
    assert not (tmp_path / "work" / "custom_en_de" / "raw").exists() and not (tmp_path / "data-bin").exists()


def test_a_prepared_dataset_is_not_replaced_by_different_data(tmp_path, capsys):
    """Preparing again into the same DATA_BIN with another BPE size is refused before the old dataset is touched,
    naming what differs and the mv that makes room; after that mv the same command runs. The same data made again
    (a fresh work dir) replaces it without a word."""
    def run(size, work):
        prepare(["custom", "--src", "en", "--tgt", "de", "--corpus-dir", str(CORPUS),
                 "--work-dir", str(tmp_path / work), "--data-bin", str(tmp_path / "data-bin"),
                 "--bpe", "subword-nmt", "--bpe-size", size, "--workers", "1"])

    data = tmp_path / "data-bin" / "custom_en_de"
    run("200", "work")
    first = {p.name: p.read_bytes() for p in data.iterdir()}
    run("200", "work-again")  # the same data made again: replaced (prepare.json's time and the log are new)
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    logs = ("prepare.json", "preprocess.log")
    assert {name: text for name, text in before.items() if name not in logs} == {
        name: text for name, text in first.items() if name not in logs}
    with pytest.raises(SystemExit) as refused:
        run("150", "work")
    message = str(refused.value)
    assert f"error: {data} already holds a prepared dataset that this one would replace" in message
    assert "bpe_size: 200 before, 150 now" in message and "dictionaries dict.de.txt, dict.en.txt differ" in message
    assert f"(mv {data} {data}.old)" in message and "DATASET_NAME" in message
    assert "To replace it: SRC=en TGT=de CORPUS_DIR=" in message and " REPLACE=1 BPE_SIZE=150 scripts/prepare_data.sh" \
        " custom (the finished steps are kept)" in message
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before  # untouched
    assert not (tmp_path / "data-bin" / "custom_en_de.binarizing").exists()
    data.rename(data.with_name("custom_en_de.old"))  # the hint's mv
    capsys.readouterr()
    run("150", "work")
    assert json.loads((data / "prepare.json").read_text())["bpe_size"] == 150
    assert "skipped" in capsys.readouterr().out  # the steps finished before the refusal were kept
