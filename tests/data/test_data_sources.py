"""What every download is pinned to and where the value comes from (issue 37): CWMT from the address Hugging Face's
scripts use, each zip by Hugging Face's size and sha256, neu2017 by the copy each address serves; UN v1.0's parts
by size and sha1; the WMT test sets' md5s written in the code (and the installed sacrebleu agreeing); packing debris
never read and CWMT text attributed by its path inside CWMT_DIR only; prepare.json written and read through one type
(issue 36), with the identity of data prepared before unchanged. Offline and quick: no preparation runs here."""

import hashlib
import io
import json
import shutil
import threading
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath

import pytest

from diverse_fairseq.data.archive import extract
from diverse_fairseq.data.download import Copy, DownloadError, Source, copies_source, expected_for, fetch
from diverse_fairseq.data.recipes import base, wmt14, wmt17
from diverse_fairseq.data.recipes.base import Context
from diverse_fairseq.data.verify import check_member_lines, verified_record
from diverse_fairseq.runs.dataset_meta import FileCheck, Verification, load_dataset_meta, meta_from_dict

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def quiet(*_):
    pass


# ------------------------------------------------------------------------------------------------ the pins
def test_cwmt_comes_from_hugging_faces_current_address_then_its_data_repository():
    for name in wmt17.CWMT_CORPORA:
        assert wmt17.CWMT_SOURCES[name].urls == (
            f"https://huggingface.co/datasets/wmt/wmt18/resolve/main-zip/cwmt-wmt/{name}.zip",
            f"https://huggingface.co/datasets/wmt/wmt18-data/resolve/main/cwmt-wmt/{name}.zip")


def test_five_cwmt_zips_are_pinned_by_hugging_faces_size_and_sha256():
    """huggingface/datasets datasets/wmt17/dataset_infos.json (040102f): the same values TensorFlow Datasets records
    for the WMT17 FTP files (url_checksums/wmt17_translate.txt, 333639b3)."""
    pins = {name: (wmt17.CWMT_SOURCES[name].size, wmt17.CWMT_SOURCES[name].sha256) for name in wmt17.CWMT_PINS}
    assert pins == {
        "casia2015": (98_159_063, "c939f1528f96c419e9bbffb9caad869616a969e7704ffac896e245a02aff59a9"),
        "casict2011": (166_957_775, "606adc0ccc5d8fc7c47f8589991286616342a1a379a571ce3038918731ae0182"),
        "casict2015": (106_836_569, "eef8e25b297c1aff12ab24719247d3588e756d7a4e2c30d4d34fcb4d05ab1050"),
        "datum2015": (100_118_018, "654afce6731485c40ce856514ab80cd2bfd836126bcaf48cdb911ebc32b021a4"),
        "datum2017": (99_278_067, "737455c139596f4abf3b1da73bc38932b3ef9534549328eff47d867e29950ed2")}
    assert all("040102f" in wmt17.CWMT_SOURCES[name].checksum_source for name in pins)


def test_neu2017_is_pinned_by_the_copy_each_address_serves():
    neu = wmt17.CWMT_SOURCES["neu2017"]
    hf, ftp = neu.copies
    assert (hf.size, hf.sha256) == (150_311_715, "5c5ea9ac5cbc43c974bd53796a3a29829800865b6398b52cda0a3854cb0d2e03")
    assert hf.urls == neu.urls == tuple(a.format("neu2017") for a in wmt17.CWMT_ADDRESSES)  # both serve Hugging Face's
    assert (ftp.size, ftp.sha256, ftp.sha1) == (148_681_171,
                                                "9f63020b6990cde85f5387b745e3ae37f1d6a49848b90a49bae28219fb65395f",
                                                "532b56ba62f6cffccdc85f4316468873ca739bd1")
    assert ftp.urls == ()  # the FTP server is gone: a copy put there by hand is still recognised
    assert [e.copy for e in expected_for(neu)] == [hf.name, ftp.name]
    assert wmt17.COUNTED_COPIES == {ftp.name}  # the published count was made on (a repack of) the FTP file


def test_un_parts_are_pinned_by_size_and_sha1_and_the_hub_zip_by_size_and_sha256():
    parts = [(s.size, s.sha1) for s in wmt17.UN_PARTS]
    assert parts == [(1_073_741_824, "1bec5f10297512183e483fdd4984d207700657d1"),
                     (312_943_879, "15df2968bc69ef7662cf3029282bbb62cbf107b1")]
    assert sum(size for size, _ in parts) == 1_386_685_703  # TensorFlow Datasets' size of the whole archive
    assert (wmt17.HF_UN.size, wmt17.HF_UN.sha256) == (
        1_385_832_125, "97f5ce0892084cdbb2332b52ffcc0299a649ba0a43712d921575fe2b7edfb4b4")


def test_sha1_is_checked(tmp_path):
    data = (FIXTURES / "mirror" / "dev.tgz").read_bytes()
    (tmp_path / "dev.tgz").write_bytes(data)
    with pytest.raises(DownloadError, match=r"expected sha1 0{40} \(pinned\), found " + hashlib.sha1(data).hexdigest()):
        fetch(Source("dev.tgz", (), sha1="0" * 40, checksum_source="pinned"), tmp_path, log=quiet)
    (tmp_path / "dev.tgz").write_bytes(data)
    fetch(Source("dev.tgz", (), sha1=hashlib.sha1(data).hexdigest()), tmp_path, log=quiet)
    assert verified_record(tmp_path / "dev.tgz", expected_for(Source("dev.tgz", (),
                                                                      sha1=hashlib.sha1(data).hexdigest())))


def test_test_set_md5s_are_written_in_the_code_and_the_installed_sacrebleu_agrees():
    from sacrebleu import DATASETS

    assert (wmt14.TEST.md5, wmt17.DEV.md5, wmt17.TEST.md5) == (
        "a8cd784e006feb32ac6f3d9ec7eb389a", "9b1aa63c1cf49dccdd20b962fe313989", "86a1724c276004aa25455ae2a04cef26")
    for url, (name, md5) in base.SACREBLEU_MD5.items():
        registered = dict(zip(DATASETS[name].data, DATASETS[name].md5))
        address = url.split("://", 1)[1]  # the registry lists http://, we fetch https://
        assert md5 in [m for u, m in registered.items() if u.split("://", 1)[1].removeprefix("www.") == address], name


# ------------------------------------------------------------------------------------------------ copies by address
def test_a_file_must_be_the_copy_its_address_serves(tmp_path):
    """Two copies, each served at its own address: the first address answers with the other copy's bytes (refused:
    not what it serves), the second with its own (kept, recorded as that copy and where it came from); a copy put
    there by hand is recognised by its checksums."""
    first, second = b"PK\x03\x04 first copy", b"PK\x03\x04 second copy"
    web = tmp_path / "web"
    for folder in ("a", "b"):
        (web / folder).mkdir(parents=True)
        (web / folder / "x.zip").write_bytes(second)
    handler = partial(type("Quiet", (SimpleHTTPRequestHandler,), {"log_message": lambda *a: None}),
                      directory=str(web))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        source = copies_source("x.zip", (
            Copy("first", (f"{url}/a/x.zip",), len(first), hashlib.sha256(first).hexdigest()),
            Copy("second", (f"{url}/b/x.zip",), len(second), hashlib.sha256(second).hexdigest())))
        said = []
        got = fetch(source, tmp_path / "dl", retries=1, log=said.append)
    finally:
        server.shutdown()
        server.server_close()
    fetched = [line.split()[-1] for line in said if ": fetching " in line]
    refused = [line for line in said if ": refused (" in line]
    assert fetched == [f"{url}/a/x.zip", f"{url}/b/x.zip"] and len(refused) == 1
    assert f"expected {len(first)} bytes (first" in refused[0] and "not the published file" in refused[0]
    record = verified_record(got, expected_for(source))
    assert record["copy"] == "second" and record["origin"] == f"{url}/b/x.zip"
    (tmp_path / "hand").mkdir()
    (tmp_path / "hand" / "x.zip").write_bytes(first)
    placed = fetch(source, tmp_path / "hand", log=quiet)
    assert verified_record(placed, expected_for(source))["copy"] == "first"


# ------------------------------------------------------------------------------------------------ archive members
def _zip(path: Path, files):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    path.write_bytes(buf.getvalue())


APPLE_DOUBLE = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        \x00\x02\xff\xfe"  # a resource fork's header


def test_packing_debris_is_never_read(tmp_path):
    """A zip made on a Mac holds ``__MACOSX/`` and ``._NAME`` beside each file: never extracted, counted or read."""
    _zip(tmp_path / "casia2015.zip", {
        "casia2015/casia2015_ch.txt": "第一句。\n第二句。\n", "casia2015/casia2015_en.txt": "One .\nTwo .\n",
        "__MACOSX/casia2015/._casia2015_ch.txt": APPLE_DOUBLE, "casia2015/._casia2015_en.txt": APPLE_DOUBLE,
        "casia2015/._casia2015_ch.txt": APPLE_DOUBLE, "._casia2015.txt": APPLE_DOUBLE})
    out = tmp_path / "orig" / "cwmt-casia2015"
    extract([tmp_path / "casia2015.zip"], out, log=quiet)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "casia2015/casia2015_ch.txt", "casia2015/casia2015_en.txt"]
    # debris placed by hand in an unpacked folder: neither a member nor a text pair
    manual = tmp_path / "manual" / "casia2015"
    shutil.copytree(out / "casia2015", manual)
    (manual / "._casia2015_ch.txt").write_bytes(APPLE_DOUBLE)
    (manual / "._casia2015_en.txt").write_bytes(APPLE_DOUBLE)
    (manual.parent / "__MACOSX").mkdir()
    (manual.parent / "__MACOSX" / "x_ch.txt").write_bytes(APPLE_DOUBLE)
    (manual.parent / "__MACOSX" / "x_en.txt").write_bytes(APPLE_DOUBLE)
    assert check_member_lines(manual.parent, {"casia2015_ch.txt": 2}, "casia2015.zip", "t2t", "x") == {
        "casia2015_ch.txt": 2}
    assert [str(name) for name, _, _ in wmt17._cwmt_pairs(manual.parent)] == ["casia2015/casia2015"]


def test_cwmt_text_is_attributed_by_its_path_inside_cwmt_dir_only(tmp_path):
    """CWMT_DIR below a folder named after another corpus (``casia2015_backup``): the text is neu2017's and
    datum2017's, as the folders inside CWMT_DIR say; a folder named ``neural`` is no corpus."""
    cwmt = tmp_path / "casia2015_backup" / "cwmt"
    shutil.copytree(FIXTURES / "cwmt" / "neu2017", cwmt / "neu2017")
    (cwmt / "Datum2017").mkdir()
    (cwmt / "Datum2017" / "Book1_cn.txt").write_text("一。\n", encoding="utf-8")
    (cwmt / "Datum2017" / "Book1_en.txt").write_text("One .\n")
    (cwmt / "neural").mkdir()
    (cwmt / "neural" / "notes_ch.txt").write_text("注。\n", encoding="utf-8")
    (cwmt / "neural" / "notes_en.txt").write_text("Note .\n")
    ctx = Context(wmt17.RECIPE, tmp_path / "work", {"cwmt_dir": str(cwmt)}, log=quiet)
    files, copies = wmt17.cwmt_files(ctx)
    assert sorted((name, corpus) for name, corpus, _, _ in files) == [
        ("Datum2017/Book1", "datum2017"), ("neu2017/NEU", "neu2017"), ("neural/notes", None)]
    assert copies == {}  # unpacked by hand: which copy it was is not known
    assert wmt17._corpus_of(PurePosixPath("neu2017.zip/casia2015/NEU")) == "neu2017"  # the innermost name decides


# ------------------------------------------------------------------------------------------------ prepare.json
#: prepare.json layouts as the code before issue 36 wrote them, and their run identity's sha256 computed by that code
#: (main at e01d395): the runs trained on such data keep their save directories
OLD_LAYOUTS = [
    ({"dataset": "wmt17_zh_en+hf", "recipe": "wmt17_zh_en", "description": "x", "source_lang": "zh",
      "target_lang": "en", "bpe": "subword-nmt", "bpe_size": 100, "joint_bpe": False,
      "bpe_models": {"zh": "codes.zh", "en": "codes.en"}, "post_process": "subword_nmt", "moses_tokenized": True,
      "lowercase": False, "aggressive_dash": False, "zh_seg": "char", "joined_dictionary": False, "beam": 4,
      "lenpen": 0.6, "max_len_a": 0.0, "max_len_b": 200, "sacrebleu_tokenize": "13a", "compound_split": False,
      "references": {"valid": "valid.ref.en", "test": "test.ref.en"}, "sentences": {"train": 36, "valid": 5, "test": 8},
      "verification": {"expectations": {"manifest": "hf", "path": "/x/EXPECTED.json"}, "files": {
          "dev.tgz": {"archive": "dev", "size": 1051, "sha256": "ab", "checked": "1,051 bytes (manifest)",
                      "member_lines": None, "member_lines_source": None},
          "UNv1.0.en-zh.zip": {"archive": "un", "size": None, "sha256": None, "checked": "x",
                               "member_lines": {"UNv1.0.en-zh.zh": 2}, "member_lines_source": "manifest"}}},
      "train_pairs": {"corpora": {"UN-v1.0": {"before_cleaning": 2, "after_cleaning": 2}}, "final_train": 36,
                      "paper": 20600000, "paper_source": "p", "expectations": "manifest hf"},
      "created": "2025-01-01 00:00:00",
      "training_data": {"corpora": {"UN-v1.0": {"pairs": 2, "expected": 15886041, "check": "mismatch"},
                                    "news-commentary-v12": {"pairs": 12, "expected": None,
                                                            "check": "no published count"}},
                        "cwmt": {"status": "complete", "corpora": ["casia2015"], "missing": [], "digest": "d",
                                 "pairs": 4}, "counts_source": "c", "verified": False,
                        "problems": ["UN-v1.0: 2 pairs, published 15,886,041"], "paper_train_pairs": 20600000,
                        "paper_source": "j", "length_cap": {"max": 50, "unit": "subwords after BPE"},
                        "train_pairs": 36, "train_pairs_vs_paper": 0.0},
      "unknown_future": {"a": 1}},
     "b3be9378429af38238e205cfcbedee5e75e7b8b6d39c00427bef67848b391106"),
    ({"dataset": "wmt14_en_de", "source_lang": "en", "target_lang": "de", "joined_dictionary": False,
      "synthetic": True, "beam": 4, "lenpen": 0.6, "max_len_a": 0.0, "max_len_b": 200, "post_process": "subword_nmt",
      "moses_tokenized": True},
     "fbb4b8fb5a6f5b707d4aa0315ac4f238f5f2cece519b4391dc5b499740692683"),
    ({"source_lang": "en", "target_lang": "de"}, "e0a997d5ad3d1a9b92f72b207f89d3e1b998b4e526fd292f95e6d0ce30c68a27"),
]


@pytest.mark.parametrize("layout,identity_sha256", OLD_LAYOUTS)
def test_prepare_json_written_before_reads_back_to_the_same_identity(layout, identity_sha256):
    meta = meta_from_dict(layout)
    assert hashlib.sha256(json.dumps(meta.identity(), sort_keys=True).encode()).hexdigest() == identity_sha256
    assert meta.to_json() == {**{k: v for k, v in meta.to_json().items() if k not in layout}, **layout}
    if "training_data" in layout:  # typed records, not dicts
        assert meta.training_data.corpora["UN-v1.0"].check == "mismatch" and not meta.training_data.verified
        assert meta.verification.manifest == "hf" and meta.train_pairs.corpora["UN-v1.0"].after_cleaning == 2


def test_a_field_added_later_is_written_only_when_set():
    check = FileCheck("cwmt-neu2017", 5, "ab", "x")
    assert "copy" not in check.to_json() and "origin" not in check.to_json()
    copied = FileCheck("cwmt-neu2017", 5, "ab", "x", copy="Hugging Face's repack", origin="https://h/neu2017.zip")
    verification = Verification.from_json(Verification("published", {"neu2017.zip": copied}).to_json())
    assert verification.files["neu2017.zip"] == copied


def test_dictionaries_only_data_is_written_through_the_type(tmp_path):
    from diverse_fairseq.tables.check import write_synthetic_data

    data = write_synthetic_data(tmp_path, "wmt17_zh_en")
    written = json.loads((data / "prepare.json").read_text())
    meta = load_dataset_meta(data)
    assert meta.synthetic and (meta.source_lang, meta.target_lang, meta.beam) == ("zh", "en", 4)
    assert written == meta.to_json() and "verification" not in written and "training_data" not in written
