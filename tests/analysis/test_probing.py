"""Linguistic probing (NAACL 2019 Table 1, journal Table 7): SentEval's task files, the frozen encoder's sentence
features, the MLP classifier, the command line and the table runner's probing step.

Offline: the task files come from tests/fixtures/senteval/ (SentEval's file names and layout, 24 / 6 / 6 lines per
task), copied through the download code as a mirror. The encoder tests use the tiny checkpoints of conftest.py.
"""

import json
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import job_record, linked_prepared

from diverse_fairseq import probing as probing_cli
from diverse_fairseq.analysis import probing
from diverse_fairseq.data import senteval
from diverse_fairseq.tables.spec import TableSpecError, load_table, parse_table

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "senteval"
ENV_KEYS = ("DIVERSE_FAIRSEQ_MIRROR", "PROBING_DATA", "CHECKSUMS")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small matrices: one CPU thread is fastest (and the table runner probes with one thread too)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------- the data
def test_tasks_name_senteval_files_at_their_public_addresses():
    assert [t.name for t in senteval.TASKS] == ["SentLen", "WC", "TreeDepth", "TopConst", "BShift", "Tense",
                                                "SubjNum", "ObjNum", "SOMO", "CoordInv"]
    for task in senteval.TASKS:
        urls = task.source().urls
        assert urls[0] == f"https://raw.githubusercontent.com/facebookresearch/SentEval/main/data/probing/{task.filename}"
        assert urls[1].endswith(f"/SentEval/master/data/probing/{task.filename}")
        assert (FIXTURE / task.filename).is_file(), f"no fixture for {task.filename}"
    assert [t.name for t in senteval.parse_tasks("tense, sentlen,Tense")] == ["Tense", "SentLen"]
    assert senteval.parse_tasks("all") == list(senteval.TASKS)
    with pytest.raises(SystemExit, match="unknown probing task.*Foo"):
        senteval.parse_tasks("SentLen,Foo")


@pytest.mark.parametrize("task", senteval.TASKS, ids=lambda t: t.name)
def test_fixture_files_parse_into_splits_and_labels(task):
    data = senteval.read_task(task, FIXTURE)
    assert senteval.sizes(data) == (24, 6, 6)
    first = (FIXTURE / task.filename).read_text(encoding="utf-8").splitlines()[0].split("\t")
    assert (data.labels["tr"][0], data.sentences["tr"][0]) == (first[1], first[2])
    assert set(data.labels["va"]) | set(data.labels["te"]) <= set(data.classes())
    assert len(data.classes()) >= 2


def test_download_copies_the_files_from_a_mirror_and_keeps_present_ones(tmp_path):
    tasks = senteval.parse_tasks("SentLen,Tense")
    messages = []
    paths = senteval.download(tasks, tmp_path, mirror=str(FIXTURE), log=messages.append, require_published=False)
    for t in tasks:
        assert paths[t.name].read_bytes() == (FIXTURE / t.filename).read_bytes()
    assert not list(tmp_path.glob("*.part"))
    messages.clear()
    senteval.download(tasks, tmp_path, mirror=str(FIXTURE), log=messages.append, require_published=False)
    assert any("present, not downloading again" in m for m in messages), messages
    assert all("present, not downloading again" in m or "a stand-in" in m for m in messages), messages


def test_the_download_command_uses_the_mirror_variable(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIVERSE_FAIRSEQ_MIRROR", str(FIXTURE))
    assert senteval.main(["--dest", str(tmp_path), "--tasks", "WC", "--stand-ins"]) == 0
    assert "WC: " in capsys.readouterr().out and (tmp_path / "word_content.txt").is_file()
    monkeypatch.setenv("DIVERSE_FAIRSEQ_MIRROR", str(tmp_path / "empty"))
    with pytest.raises(SystemExit, match="could not download sentence_length.txt"):
        senteval.main(["--dest", str(tmp_path), "--tasks", "SentLen"])


@pytest.mark.parametrize("text,message", [
    (None, "sentence_length.txt not found.*raw.githubusercontent.com"),
    ("tr\t0\ta b c\nxx\t1\ta b\n", r"sentence_length.txt:2: expected 'split<TAB>label<TAB>sentence'"),
    ("tr\t0\ta b c\ntr\t1\t\n", r":2: expected"),
    ("tr\t0\ta b c\nva\t0\ta b\n", "has no te sentences"),
    ("tr\t0\ta b c\nva\t0\ta b\nte\t7\ta\n", "label.*7 occur in va/te but not in tr"),
])
def test_bad_task_files_are_named(tmp_path, text, message):
    if text is not None:
        (tmp_path / "sentence_length.txt").write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit, match=message):
        senteval.read_task(senteval.BY_NAME["sentlen"], tmp_path)


# ---------------------------------------------------------------------------------------------- the text
def test_sentences_are_prepared_as_the_models_training_data(tmp_path):
    (tmp_path / "codes").write_text("#version: 0.2\n", encoding="utf-8")  # no merges: BPE leaves words alone
    meta = {"source_lang": "en", "target_lang": "de", "bpe": "subword-nmt", "bpe_models": {"en": "codes"},
            "moses_tokenized": True, "lowercase": True}
    (tmp_path / "prepare.json").write_text(json.dumps(meta))
    prepare = probing.source_segmenter(tmp_path)
    assert prepare("The printer 's page , isn 't it ?") == "the printer &apos;s page , isn &apos;t it ?"

    import sentencepiece as spm

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"The printer's page {i} is open, isn't it?\n" for i in range(50)), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "spm"), vocab_size=40,
                                   model_type="bpe", hard_vocab_limit=False, minloglevel=2)
    meta.update(bpe="sentencepiece", bpe_models={"en": "spm.model"}, moses_tokenized=False, lowercase=False)
    (tmp_path / "prepare.json").write_text(json.dumps(meta))
    pieces = probing.source_segmenter(tmp_path)("The printer 's page , isn 't it ?")
    assert len(pieces.split()) > 3 and pieces.replace(" ", "").replace("\u2581", " ").strip() == \
        "The printer's page, isn't it?"

    (tmp_path / "prepare.json").write_text(json.dumps(dict(meta, source_lang="zh")))
    with pytest.raises(SystemExit, match="English sentences.*'zh'"):
        probing.source_segmenter(tmp_path)


# ---------------------------------------------------------------------------------------------- the classifier
def _clusters(n, classes=3, dim=8, seed=0):
    """``n`` points around ``classes`` fixed, well separated centres (the noise drawn with ``seed``) and their
    classes."""
    centres = torch.randn(classes, dim, generator=torch.Generator().manual_seed(0)) * 4
    y = torch.arange(n) % classes
    return centres[y] + torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)), y


@pytest.mark.parametrize("hidden", [200, 0])
def test_classifier_learns_a_separable_task_and_is_deterministic(hidden):
    x, y = _clusters(150)
    xv, yv = _clusters(30, seed=1)
    xt, yt = _clusters(60, seed=2)
    settings = probing.ProbeSettings(hidden=hidden, lr=0.05, max_epochs=10, seed=3)
    state = torch.random.get_rng_state()
    runs = [probing.train_classifier(x, y, xv, yv, 3, settings) for _ in range(2)]
    assert torch.equal(torch.random.get_rng_state(), state), "training must not move the global random state"
    (clf, valid, best, epochs), (clf2, *again) = runs
    assert probing.accuracy(clf, xt, yt) > 90 and valid > 90 and 1 <= best <= epochs <= 10
    assert again == [valid, best, epochs]
    assert all(torch.equal(a, b) for a, b in zip(clf.state_dict().values(), clf2.state_dict().values()))
    other = probing.train_classifier(x, y, xv, yv, 3,
                                     probing.ProbeSettings(hidden=hidden, lr=0.05, max_epochs=2, seed=4))[0]
    assert not all(torch.equal(a, b) for a, b in zip(clf.state_dict().values(), other.state_dict().values()))


def test_probe_features_reports_test_accuracy_and_chance():
    x, y = _clusters(90, classes=2)
    labels = ["A" if int(c) == 0 else "B" for c in y]
    features = {"tr": x[:60], "va": x[60:75], "te": x[75:]}
    split_labels = {"tr": labels[:60], "va": labels[60:75], "te": labels[75:]}
    record = probing.probe_features(features, split_labels, probing.ProbeSettings(lr=0.05, max_epochs=10))
    assert record["accuracy"] == 100.0 and record["classes"] == 2
    assert record["sizes"] == {"tr": 60, "va": 15, "te": 15}
    assert record["majority"] == pytest.approx(100 * 8 / 15)


# ---------------------------------------------------------------------------------------------- errors
def test_cli_errors_for_a_missing_checkpoint_task_or_task_file(tmp_path, capsys):
    with pytest.raises(SystemExit, match="checkpoint .*nothing.pt not found"):
        probing_cli.main([str(tmp_path / "nothing.pt"), "--data-dir", str(FIXTURE)])
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(b"")
    with pytest.raises(SystemExit, match="unknown probing task"):
        probing_cli.main([str(ckpt), "--tasks", "Nope", "--data-dir", str(FIXTURE)])
    with pytest.raises(SystemExit, match="tree_depth.txt not found.*--download"):
        probing.probe_checkpoint(ckpt, senteval.parse_tasks("TreeDepth"), tmp_path)


def test_table_probing_field_is_validated():
    rows = [{"id": "a", "label": "A", "family": "transformer"}]
    table = parse_table({"table": "t", "title": "T", "baseline": "a", "rows": rows, "probing": ["tense", "WC"]})
    assert table.probing == ["Tense", "WC"]
    assert parse_table({"table": "t", "title": "T", "baseline": "a", "rows": rows}).probing == []
    for bad, message in ((["Tense", "Foo"], "unknown task.*Foo"), ("some", "'all' or a list")):
        with pytest.raises(TableSpecError, match=message):
            parse_table({"table": "t", "title": "T", "baseline": "a", "rows": rows, "probing": bad})
    for name in ("naacl19_t1", "journal_t7"):
        spec = load_table(name)
        assert spec.probing == [t.name for t in senteval.TASKS]
        assert all(t.paper_key in row.paper for row in spec.rows for t in senteval.TASKS)


def test_report_puts_the_papers_accuracy_beside_ours():
    from diverse_fairseq.tables.report import probing_entry, probing_section

    spec = load_table("naacl19_t1")
    runs = [job_record(probing={"SentLen": {"accuracy": 50.0 + s, "majority": 20.0}}) for s in (0, 2)]
    entry = probing_entry(spec, spec.rows[0], runs)
    assert entry["probing"]["accuracy"] == {"SentLen": 51.0}
    assert entry["probing"]["paper"] == {"SentLen": 97.22}
    text = "\n".join(probing_section(SimpleNamespace(rows=[SimpleNamespace(label="BASE", seeds=[1, 2], **entry)])))
    assert "| System | SeLen |" in text and "| BASE | 51.00 (97.22) |" in text and "| majority class | 20.00 |" in text
    assert probing_entry(spec, spec.rows[0], [job_record()]) == {}


# ---------------------------------------------------------------------------------------------- a real encoder
def _toy_task(folder: Path, seed: int = 0) -> Path:
    """sentence_length.txt over the tiny corpus's words: label 0 for 3-4 words, 1 for 8-9 (24 / 6 / 6 lines)."""
    rng = random.Random(seed)
    out = []
    for split, count in (("tr", 24), ("va", 6), ("te", 6)):
        for i in range(count):
            n = rng.choice((3, 4)) if i % 2 == 0 else rng.choice((8, 9))
            out.append(f"{split}\t{i % 2}\t{' '.join(f'w{rng.randrange(40)}' for _ in range(n))}\n")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sentence_length.txt").write_text("".join(out), encoding="utf-8")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["transformer", "diverse_transformer"])
def test_features_equal_the_mean_of_the_top_layer_over_each_sentence(tiny_checkpoints, tiny_data, arch):
    from diverse_fairseq.analysis.loading import load_checkpoint

    loaded = load_checkpoint(str(tiny_checkpoints[arch]), str(tiny_data))
    d = loaded.task.source_dictionary
    rng = random.Random(1)
    sentences = [" ".join(f"w{rng.randrange(40)}" for _ in range(rng.randint(1, 12))) for _ in range(23)]
    tokens = probing.encode(d, sentences)
    fast = probing.sentence_features(loaded.model, tokens, d.pad(), d.eos(), left_pad=True, max_tokens=40)
    assert fast.shape == (23, 32)
    with torch.no_grad():
        for i, ids in enumerate(tokens):  # one sentence at a time: no padding at all
            top = loaded.model.encoder(ids[None], src_lengths=torch.tensor([len(ids)]))["encoder_out"][0]  # [T, 1, C]
            assert len(ids) == len(sentences[i].split()) + 1
            torch.testing.assert_close(fast[i], top[:, 0].mean(0), rtol=1e-5, atol=1e-5)
    right = probing.sentence_features(loaded.model, tokens, d.pad(), d.eos(), left_pad=False, max_tokens=40)
    torch.testing.assert_close(right, fast, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_probe_command_end_to_end_is_deterministic(tiny_checkpoints, tiny_data, tmp_path):
    data_dir = _toy_task(tmp_path / "probing")
    out = tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, "-m", "diverse_fairseq.probing", str(tiny_checkpoints["transformer"]),
                           "--tasks", "SentLen", "--data-dir", str(data_dir), "--data", str(tiny_data),
                           "--out", str(out), "--cpu", "--max-epochs", "20", "--threads", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| SentLen |" in proc.stdout
    first = json.loads(out.read_text())["tasks"]["SentLen"]
    again = probing.probe_checkpoint(tiny_checkpoints["transformer"], senteval.parse_tasks("SentLen"), data_dir,
                                     probing.ProbeSettings(max_epochs=20), data=str(tiny_data))["tasks"]["SentLen"]
    assert (first["accuracy"], first["valid_accuracy"], first["best_epoch"]) == \
        (again["accuracy"], again["valid_accuracy"], again["best_epoch"])
    assert first["sizes"] == {"tr": 24, "va": 6, "te": 6} and first["unknown_tokens"] == 0.0
    assert first["accuracy"] >= 50.0  # the length is plain in the mean of a sentence's outputs; chance is 50


@pytest.mark.slow
def test_table_runner_probes_each_run_once(tiny_checkpoints, tiny_data, tmp_path, monkeypatch):
    from diverse_fairseq.tables import steps
    from diverse_fairseq.tables.config import RunConfig
    from diverse_fairseq.tables.job import make_job

    run = RunConfig(dataset="toy", scale="demo", seeds=[1], gpus=0, out_dir=tmp_path,
                           data_bin=linked_prepared(tiny_data, tmp_path / "data-bin"), probing_tasks=["SentLen"],
                           probing_dir=_toy_task(tmp_path / "probing"))
    row = load_table("naacl19_t1").rows[0]
    ckpt, job = tiny_checkpoints["transformer"], make_job("naacl19_t1", row, run, 1)
    first = steps.probing_scores(job, ckpt)
    assert set(first) == {"SentLen"} and 0 <= first["SentLen"]["accuracy"] <= 100
    assert (run.run_dir(row, 1) / "analysis" / "probing.json").is_file()

    def fail(*args, **kwargs):
        raise AssertionError("probed again although the cache matches")

    monkeypatch.setattr(probing, "probe_checkpoint", fail)
    assert steps.probing_scores(job, ckpt) == first
