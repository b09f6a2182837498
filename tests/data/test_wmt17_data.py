"""WMT17 Zh-En that can be built: the Hugging Face Hub routes for CWMT and UN v1.0, the published pair counts each
corpus is checked against (a warning, not a refusal, on a copy they were not made on), a skipped or partial CWMT
recorded in prepare.json, the paper-scale refusal of such data, and the unit of the 50-token length cap.

Offline: fixture zips with the real file names and member layouts, made in the test, served by a loopback HTTP
server through the mirror override (a mirror is looked up by file name).
"""

import hashlib
import io
import json
import shutil
import threading
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from diverse_fairseq.data.prepare import main as prepare
from diverse_fairseq.data.prepare import step_ids
from diverse_fairseq.data.recipes import wmt17
from diverse_fairseq.runs.dataset_meta import CorpusCount, load_dataset_meta, meta_from_dict
from diverse_fairseq.tables.__main__ import check_paper_data, data_problems
from diverse_fairseq.tables.__main__ import main as tables_main

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
MIRROR = FIXTURES / "mirror"
ENV_KEYS = ("BPE", "BPE_SIZE", "WORK_DIR", "DATA_BIN", "DIVERSE_FAIRSEQ_MIRROR", "CHECKSUMS", "WORKERS", "DEMO_DIR",
            "CWMT_DIR", "CWMT", "ZH_SEG", "STOP_AFTER", "WMT17_SOURCE", "LENGTH_UNIT", "ALLOW_UNVERIFIED",
            "ALLOW_UNVERIFIED_DATA", "SCALE", "DATASET", "DRY_RUN")

#: member files of each CWMT zip, as the real zips name them (datum2017: books, casict2011: two halves)
CWMT_MEMBERS = {"casia2015": [("casia2015_ch.txt", "casia2015_en.txt")],
                "casict2011": [("casict-A_ch.txt", "casict-A_en.txt"), ("casict-B_ch.txt", "casict-B_en.txt")],
                "casict2015": [("casict2015_ch.txt", "casict2015_en.txt")],
                "datum2015": [("datum_ch.txt", "datum_en.txt")],
                "datum2017": [("Book1_cn.txt", "Book1_en.txt"), ("Book2_cn.txt", "Book2_en.txt")],
                "neu2017": [("NEU_cn.txt", "NEU_en.txt")]}


def _zip(files):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return buf.getvalue()


def _pairs(tag, n):
    zh = "".join(f"{tag}第{i}句话很好。\n" for i in range(n))
    en = "".join(f"{tag} sentence number {i} is good .\n" for i in range(n))
    return zh, en


@pytest.fixture
def hf_mirror(tmp_path):
    """The fixture mirror plus the Hugging Face Hub files (six CWMT zips, UNv1.0.en-zh.zip), 2 pairs per file,
    served over loopback HTTP; yields (URL, checksum file, the names requested)."""
    folder = tmp_path / "mirror"
    shutil.copytree(MIRROR, folder)
    for corpus, members in CWMT_MEMBERS.items():
        files = {}
        for zh_name, en_name in members:
            zh, en = _pairs(zh_name[:5], 2)
            files[f"{corpus}/{zh_name}"], files[f"{corpus}/{en_name}"] = zh, en
        (folder / f"{corpus}.zip").write_bytes(_zip(files))
    zh, en = _pairs("UN", 2)
    (folder / "UNv1.0.en-zh.zip").write_bytes(_zip({"en-zh/UNv1.0.en-zh.zh": zh, "en-zh/UNv1.0.en-zh.en": en}))
    # the files are stand-ins: an expectations manifest replaces the published sizes, checksums and member line
    # counts (the data goes to wmt17_zh_en+hf); the pair-count check of collect still sees the published counts
    files = {p.name: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in sorted(folder.iterdir()) if p.suffix in (".tgz", ".zip", ".00", ".01")}
    # neu2017 is published in two copies: the stand-in is Hugging Face's, the FTP file is another one
    files["neu2017.zip"] = [dict(files["neu2017.zip"], copy=wmt17.HF_NEU2017.name),
                            {"copy": wmt17.FTP_NEU2017.name, "size": 1, "sha256": "0" * 64}]
    lines = {"un": {"UNv1.0.en-zh.zh": 2, "UNv1.0.en-zh.en": 2}}
    lines.update({a.name: {m: 2 for m in a.expected_lines} for a in wmt17.CWMT_ARCHIVES if a.expected_lines})
    sums = tmp_path / "EXPECTED.json"
    sums.write_text(json.dumps({"name": "hf", "files": files, "lines": lines}))
    requested = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            requested.append(self.path.rsplit("/", 1)[-1])
            super().do_GET()

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", str(sums), requested
    server.shutdown()
    server.server_close()


def common(tmp_path, *extra):
    return ["--work-dir", str(tmp_path / "work"), "--data-bin", str(tmp_path / "data-bin"), "--bpe-size", "100",
            "--workers", "1", "--zh-seg", "char", *extra]


# ------------------------------------------------------------------------------------------------ routes
def test_cwmt_and_un_have_https_routes_on_the_hugging_face_hub():
    for name in wmt17.CWMT_CORPORA:  # the address Hugging Face's wmt_utils.py uses, then the wmt18-data repository
        assert wmt17.CWMT_SOURCES[name].urls == (
            f"https://huggingface.co/datasets/wmt/wmt18/resolve/main-zip/cwmt-wmt/{name}.zip",
            f"https://huggingface.co/datasets/wmt/wmt18-data/resolve/main/cwmt-wmt/{name}.zip")
    assert wmt17.HF_UN.urls == ("https://huggingface.co/datasets/wmt/uncorpus/resolve/main-zip/UNv1.0.en-zh.zip",)
    # CWMT needs no manual download: by default its six zips are steps of the pipeline
    recipe = wmt17.configure(wmt17.RECIPE, {"work_dir": "/nonexistent"})
    assert [a.name for a in recipe.archives if a.name.startswith("cwmt-")] == [f"cwmt-{c}" for c in wmt17.CWMT_CORPORA]
    assert [s.filename for a in recipe.archives if a.name == "un" for s in a.parts] == [
        "UNv1.0.en-zh.tar.gz.00", "UNv1.0.en-zh.tar.gz.01"]
    hf = wmt17.configure(wmt17.RECIPE, {"work_dir": "/nonexistent", "source": "hf", "skip_cwmt": True})
    assert [s.filename for a in hf.archives if a.name == "un" for s in a.parts] == ["UNv1.0.en-zh.zip"]
    assert not [a for a in hf.archives if a.name.startswith("cwmt-")]
    with pytest.raises(SystemExit, match=r"WMT17_SOURCE \(--wmt17-source\)='ftp' is not valid: use one of original"):
        wmt17.configure(wmt17.RECIPE, {"source": "ftp"})
    # the instructions no longer send anyone to the dead FTP server for a manual download
    instructions = wmt17.CWMT_INSTRUCTIONS.format(cwmt_dir="x")
    assert "wmt18/resolve/main-zip/cwmt-wmt/<name>.zip" in instructions and "wmt18-data" in instructions


def test_published_counts_are_pinned_with_who_made_them():
    assert wmt17.EXPECTED_PAIRS == {"UN-v1.0": 15_886_041, "CWMT casia2015": 1_050_000,
                                    "CWMT casict2015": 2_036_833, "CWMT datum2015": 1_000_003,
                                    "CWMT datum2017": 1_999_968, "CWMT neu2017": 2_000_000}
    # UN v1.0: the UN's own statistics; CWMT: a third party's repack (tensor2tensor PR #461), not CWMT's
    assert "conferences.unite.un.org/uncorpus" in wmt17.UN_COUNT_SOURCE and "15,886,041" in wmt17.UN_COUNT_SOURCE
    assert "ba2cf587857963515d660e4550bcaa1f5df9952a" in wmt17.CWMT_COUNTS_SOURCE
    assert "PR #461" in wmt17.CWMT_COUNTS_SOURCE and "twairball.wmt17.zh-en/cwmt.tgz" in wmt17.CWMT_COUNTS_SOURCE
    un = next(a for a in wmt17.ARCHIVES if a.name == "un")
    assert un.expected_lines == {"UNv1.0.en-zh.zh": 15_886_041, "UNv1.0.en-zh.en": 15_886_041}
    assert un.counts_source == wmt17.UN_COUNT_SOURCE
    # News Commentary v12 zh-en: a third party's count, printed beside ours, never checked
    assert wmt17.THIRD_PARTY_PAIRS["news-commentary-v12"][0] == 227_330


def test_a_corpus_with_another_count_is_refused_naming_it():
    with pytest.raises(SystemExit) as err:
        wmt17.check_counts({"news-commentary-v12": 5, "CWMT datum2017": 10}, allow_unverified=False)
    message = str(err.value)
    assert "CWMT datum2017: 10 sentence pairs, expected 1,999,968" in message and "PR #461" in message
    assert "wmt18/resolve/main-zip/cwmt-wmt/datum2017.zip" in message and "ALLOW_UNVERIFIED=1" in message
    report = wmt17.check_counts({"news-commentary-v12": 5, "CWMT datum2017": 10}, True, log=lambda m: None)
    assert report["CWMT datum2017"].check == "mismatch"
    assert (report["news-commentary-v12"].pairs, report["news-commentary-v12"].expected,
            report["news-commentary-v12"].check, report["news-commentary-v12"].third_party) == (
        5, None, "no published count", 227_330)


def test_a_count_that_differs_on_a_copy_it_was_not_made_on_is_a_warning_naming_that():
    """neu2017's published count was made on (a repack of) the WMT17 FTP file; Hugging Face serves another copy. A
    different count on that copy is recorded and warned of, not refused; on the FTP copy it is refused."""
    said = []
    report = wmt17.check_counts({"CWMT neu2017": 1_999_990}, allow_unverified=False, log=said.append,
                                copies={"CWMT neu2017": wmt17.HF_NEU2017.name})
    assert report["CWMT neu2017"].check == "differs on another copy"
    assert report["CWMT neu2017"].copy == wmt17.HF_NEU2017.name
    assert any("made on another copy" in line and wmt17.HF_NEU2017.name in line for line in said)
    record = wmt17.corpus_record(report, skipped=False, found=list(wmt17.CWMT_CORPORA), missing=[],
                                 copies={"neu2017": wmt17.HF_NEU2017.name})
    assert record.verified and not record.problems and "counted on another copy" in record.notes[0]
    assert record.cwmt.copies == {"neu2017": wmt17.HF_NEU2017.name}
    with pytest.raises(SystemExit, match="CWMT neu2017: 1,999,990 sentence pairs, expected 2,000,000"):
        wmt17.check_counts({"CWMT neu2017": 1_999_990}, allow_unverified=False, log=said.append,
                           copies={"CWMT neu2017": wmt17.FTP_NEU2017.name})


def test_skipped_and_partial_cwmt_are_recorded_as_not_the_papers_data():
    ok = {name: CorpusCount(n, n, "ok") for name, n in wmt17.EXPECTED_PAIRS.items()}
    full = wmt17.corpus_record(ok, skipped=False, found=list(wmt17.CWMT_CORPORA), missing=[])
    assert full.verified and full.cwmt.status == "complete" and full.paper_train_pairs == 20_600_000
    skipped = wmt17.corpus_record({"UN-v1.0": ok["UN-v1.0"]}, skipped=True, found=[], missing=[])
    assert not skipped.verified and skipped.cwmt.to_json() == {
        "status": "skipped", "corpora": [], "missing": list(wmt17.CWMT_CORPORA), "digest": "", "pairs": 0}
    partial = wmt17.corpus_record(ok, skipped=False, found=["casia2015"], missing=["neu2017"])
    assert partial.problems == ["CWMT partial (missing: neu2017)"]


def _meta(**fields):
    return meta_from_dict({"source_lang": "zh", "target_lang": "en", **fields})


def test_paper_scale_refuses_wmt17_data_without_a_record_of_its_corpora(tmp_path):
    data = tmp_path / "wmt17_zh_en"
    data.mkdir()
    (data / "prepare.json").write_text(json.dumps({"dataset": "wmt17_zh_en", "source_lang": "zh",
                                                   "target_lang": "en", "sentences": {"train": 5}}))
    with pytest.raises(SystemExit, match="older version that did not check"):
        check_paper_data(data, allow=False)
    assert data_problems(_meta(dataset="wmt14_en_de")) == []  # a recipe that records nothing yet is not refused
    verified = wmt17.corpus_record({}, skipped=False, found=list(wmt17.CWMT_CORPORA), missing=[])
    assert data_problems(_meta(dataset="wmt17_zh_en", training_data=verified.to_json())) == []


def test_paper_scale_refuses_data_checked_against_a_stand_in_manifest(tmp_path):
    """Data prepared with EXPECT (stand-in archives, e.g. the test fixtures) is not the papers' data: a paper-scale
    table refuses it unless asked, and the message names the dataset to prepare without its +NAME suffix."""
    data = tmp_path / "wmt14_en_de+fixture"
    data.mkdir()
    meta = {"dataset": "wmt14_en_de", "source_lang": "en", "target_lang": "de",
            "verification": {"expectations": {"manifest": "fixture", "path": "x.json"}}}
    (data / "prepare.json").write_text(json.dumps(meta))
    with pytest.raises(SystemExit, match=r"stand-in manifest 'fixture'.*make data DATASET=wmt14_en_de, "):
        check_paper_data(data, allow=False)
    check_paper_data(data, allow=True)  # asked for: a warning, no refusal
    assert data_problems(_meta(dataset="wmt14_en_de", verification={"expectations": "published"})) == []


def test_the_length_cap_unit_is_an_option():
    assert wmt17.configure(wmt17.RECIPE, {"work_dir": "/nonexistent"}).clean_after_bpe  # subwords (default)
    words = wmt17.configure(wmt17.RECIPE, {"work_dir": "/nonexistent", "length_unit": "words"})
    assert not words.clean_after_bpe and "clean-bpe" not in step_ids(words) and words.clean_max == 50
    with pytest.raises(SystemExit, match=r"LENGTH_UNIT \(--length-unit\)='chars' is not valid"):
        wmt17.configure(wmt17.RECIPE, {"length_unit": "chars"})


# ------------------------------------------------------------------------------------------------ the pipeline
@pytest.mark.slow
def test_prepare_downloads_cwmt_and_records_what_it_used(tmp_path, hf_mirror, capsys):
    url, sums, requested = hf_mirror
    with pytest.raises(SystemExit, match=r"UN-v1.0: 2 sentence pairs, expected 15,886,041"):
        prepare(["wmt17_zh_en", *common(tmp_path, "--mirror", url, "--expect", sums, "--wmt17-source", "hf")])
    assert not (tmp_path / "data-bin" / "wmt17_zh_en+hf").exists()
    prepare(["wmt17_zh_en", *common(tmp_path, "--mirror", url, "--expect", sums, "--wmt17-source", "hf",
                                     "--allow-unverified")])
    assert {f"{c}.zip" for c in wmt17.CWMT_CORPORA} | {"UNv1.0.en-zh.zip"} <= set(requested)
    assert not any(name.startswith("UNv1.0.en-zh.tar.gz") for name in requested)
    meta = load_dataset_meta(tmp_path / "data-bin" / "wmt17_zh_en+hf")  # written and read through one type
    data = meta.training_data
    assert data.cwmt.status == "complete" and data.cwmt.corpora == sorted(wmt17.CWMT_CORPORA)
    assert (data.corpora["CWMT datum2017"].pairs, data.corpora["CWMT datum2017"].expected,
            data.corpora["CWMT datum2017"].check) == (4, 1_999_968, "mismatch")
    assert data.corpora["CWMT casict2011"].check == "no published count"
    assert not data.verified and "UN-v1.0: 2 pairs, published 15,886,041" in data.problems
    assert data.train_pairs == meta.sentences["train"] and data.paper_train_pairs == 20_600_000
    assert data.length_cap.to_json() == {"max": 50, "unit": "subwords after BPE"}
    # the neu2017 copy read (Hugging Face's, recognised by its checksums) is recorded, and the published count
    # (made on the FTP file) that it does not match is a note, not a problem
    assert meta.verification.files["neu2017.zip"].copy == wmt17.HF_NEU2017.name
    assert data.cwmt.copies == {"neu2017": wmt17.HF_NEU2017.name}
    assert data.corpora["CWMT neu2017"].check == "differs on another copy"
    assert not any("neu2017" in problem for problem in data.problems)
    out = capsys.readouterr().out
    assert "the paper's 20,600,000" in out and "227,330 in twairball/fairseq-zh-en" in out


@pytest.mark.slow
def test_a_partial_manual_cwmt_is_recorded_and_refused_at_paper_scale(tmp_path, hf_mirror, monkeypatch):
    url, sums, requested = hf_mirror
    prepare(["wmt17_zh_en", *common(tmp_path, "--mirror", url, "--expect", sums, "--allow-unverified",
                                     "--wmt17-source", "hf", "--cwmt-dir", str(FIXTURES / "cwmt"),
                                     "--length-unit", "words")])
    assert not any(name.endswith(".zip") and name[:-4] in wmt17.CWMT_CORPORA for name in requested)
    data_bin = tmp_path / "data-bin"
    meta = load_dataset_meta(data_bin / "wmt17_zh_en+hf")
    cwmt = meta.training_data.cwmt
    assert cwmt.status == "partial" and cwmt.corpora == ["casia2015", "neu2017"]
    assert cwmt.missing == ["casict2011", "casict2015", "datum2015", "datum2017"]
    assert meta.training_data.length_cap.to_json() == {"max": 50, "unit": "words before BPE"}
    assert not (tmp_path / "work" / "wmt17_zh_en+hf" / "final").exists()  # no cleaning after BPE
    assert any("CWMT partial" in p for p in data_problems(meta))
    with pytest.raises(SystemExit, match=r"prepared from other data than the papers' .*CWMT partial.*"
                                         r"ALLOW_UNVERIFIED_DATA=1"):
        check_paper_data(data_bin / "wmt17_zh_en+hf", allow=False)
    check_paper_data(data_bin / "wmt17_zh_en+hf", allow=True)
    # the table runner refuses before any work, also in a dry run
    out = tmp_path / "results"
    with pytest.raises(SystemExit, match="CWMT partial"):
        tables_main(["emnlp18_t3_zh_en", "--scale", "paper", "--data-bin", str(data_bin), "--out", str(out),
                     "--dataset", "wmt17_zh_en+hf",
                     "--dry-run", "1"])
    assert not out.exists()
