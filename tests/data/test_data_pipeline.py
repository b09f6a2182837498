"""Data preparation, offline: fixture archives with the real file names and layouts (tests/fixtures/mirror,
built by tests/fixtures/make_fixtures.py) served from a directory or a loopback HTTP server through the
mirror override, run through the real preparation pipeline into binarized fairseq datasets."""

import hashlib
import json
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import lines

from diverse_fairseq.data import download
from diverse_fairseq.data.download import DownloadError, Source, fetch
from diverse_fairseq.data.prepare import main as prepare
from diverse_fairseq.data.text import clean_pair, iwslt_train_lines, sgm_segments

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
MIRROR = FIXTURES / "mirror"
EXPECT = str(MIRROR / "EXPECTED.json")  # the fixtures' expectations manifest: data goes to DATASET+fixture
ENV_KEYS = ("BPE", "BPE_SIZE", "WORK_DIR", "DATA_BIN", "DIVERSE_FAIRSEQ_MIRROR", "CHECKSUMS", "WORKERS", "DEMO_DIR",
            "CWMT_DIR", "CWMT", "ZH_SEG", "STOP_AFTER", "WMT17_SOURCE", "LENGTH_UNIT", "ALLOW_UNVERIFIED")


def common(tmp_path, *extra):
    return ["--work-dir", str(tmp_path / "work"), "--data-bin", str(tmp_path / "data-bin"), "--bpe-size", "100",
            "--workers", "2", *extra]


class RangeHandler(SimpleHTTPRequestHandler):
    """Serves files with HTTP Range support; the first full request of a file can be cut off after
    ``drop_after`` bytes to simulate a broken connection. Records the requests it saw."""

    drop_after = None
    requests = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = Path(self.translate_path(self.path))
        rng = self.headers.get("Range")
        type(self).requests.append((path.name, rng))
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        start = int(rng.split("=")[1].split("-")[0]) if rng else 0
        self.send_response(206 if rng else 200)
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.drop_after is not None and not rng:
            self.wfile.write(body[: self.drop_after])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)


@pytest.fixture
def http_mirror():
    """A loopback HTTP server over tests/fixtures/mirror; yields (base URL, handler class)."""
    handler = type("Handler", (RangeHandler,), {"requests": [], "drop_after": None})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(MIRROR)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


# ------------------------------------------------------------------------------------------------ units
def test_clean_pair_follows_clean_corpus_n():
    assert clean_pair("a  b ", "x y", 1, 5, 1.5) == ("a b", "x y")
    assert clean_pair("a b c d", "x y", 1, 5, 1.5) is None  # ratio 2 > 1.5
    assert clean_pair("", "x", 1, 5, 9) is None  # empty side
    assert clean_pair("a b c d e f", "a b c d e f", 1, 5, 9) is None  # longer than max
    # a word longer than 1,000 characters (clean-corpus-n.perl's max-word-length) drops the pair, on either side
    assert clean_pair("a " + "x" * 1001, "b c", 1, 250, 9) is None
    assert clean_pair("b c", "x" * 1001 + " a", 1, 250, 9) is None
    assert clean_pair("a " + "x" * 1000, "b c", 1, 250, 9) == ("a " + "x" * 1000, "b c")
    assert clean_pair("a " + "x" * 600 + "|" + "x" * 600, "b c", 1, 250, 9) is not None  # | ends a word there


def test_moses_rules_that_sacremoses_lacks_are_the_perl_scripts():
    """The outputs of mosesdecoder 34452895f's tokenizer.perl and normalize-punctuation.perl (run on these lines)."""
    from diverse_fairseq.data.text import normalize, tokenize

    for line, perl in [("He lives in the U.S.", "He lives in the U.S ."), ("It's 5 p.m.", "It &apos;s 5 p.m ."),
                       ("Wait...", "Wait ..."),
                       ("Dr. Smith came at 5 p.m. today.", "Dr. Smith came at 5 p.m. today .")]:
        assert tokenize(line, "en") == perl
    assert tokenize("Er wohnt in den USA bzw.", "de") == "Er wohnt in den USA bzw ."
    assert normalize("Er sagte: „Wir werden gewinnen.“", "de", punct=True) == 'Er sagte: "Wir werden gewinnen".'
    assert normalize("He said ’yes’ now.", "en", punct=True) == 'He said "yes" now.'


def test_sgm_and_iwslt_extraction(tmp_path):
    sgm = tmp_path / "x.sgm"
    sgm.write_text('<refset>\n<doc docid="1">\n<seg id="1"> Hallo   Welt </seg>\n<p>\n<seg id="2">Zwei</seg>\n</doc>\n')
    assert sgm_segments(sgm) == ["Hallo Welt", "Zwei"]
    tags = tmp_path / "train.tags.de-en.en"
    tags.write_text("<url>u</url>\n<keywords>k</keywords>\n<talkid>1</talkid>\n<title>T</title>\n"
                    "<description>D</description>\nHello.\n")
    assert iwslt_train_lines(tags) == ["T", "D", "Hello."]  # what fairseq's prepare-iwslt14.sh keeps


# ------------------------------------------------------------------------------------------------ downloads
def test_download_resumes_after_a_broken_connection_and_a_kept_part_file(tmp_path, http_mirror, monkeypatch):
    url, handler = http_mirror
    monkeypatch.setattr(download.time, "sleep", lambda s: None)
    data = (MIRROR / "de-en.tgz").read_bytes()
    handler.drop_after = 1000  # the first response breaks off after 1000 bytes
    got = fetch(Source("de-en.tgz", ()), tmp_path, mirror=url, log=lambda m: None)
    assert got.read_bytes() == data and not (tmp_path / "de-en.tgz.part").exists()
    assert handler.requests == [("de-en.tgz", None), ("de-en.tgz", "bytes=1000-")]
    # a .part file left by a killed run is resumed, not restarted
    handler.drop_after, handler.requests[:] = None, []
    (tmp_path / "dev.tgz.part").write_bytes((MIRROR / "dev.tgz").read_bytes()[:300])
    got = fetch(Source("dev.tgz", ()), tmp_path, mirror=url, log=lambda m: None)
    assert got.read_bytes() == (MIRROR / "dev.tgz").read_bytes()
    assert handler.requests == [("dev.tgz", "bytes=300-")]


def test_download_with_a_wrong_checksum_leaves_no_file(tmp_path):
    with pytest.raises(DownloadError, match="expected sha256 0000.* found 7458"):
        fetch(Source("dev.tgz", ()), tmp_path, mirror=str(MIRROR), checksums={"dev.tgz": "0" * 64}, log=lambda m: None)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(DownloadError, match="could not download missing.tgz from mirror"):
        fetch(Source("missing.tgz", ()), tmp_path, mirror=str(MIRROR), log=lambda m: None)


def test_published_checksums_come_from_sacrebleu():
    from diverse_fairseq.data.recipes import wmt14, wmt17

    assert wmt14.TEST.md5 == "a8cd784e006feb32ac6f3d9ec7eb389a"  # sacrebleu's wmt14/full
    assert wmt17.DEV.md5 and wmt17.TEST.md5


# ------------------------------------------------------------------------------------------------ datasets
def _dataset_sizes(dest, src, tgt):
    from fairseq.data import Dictionary, data_utils

    sizes = {}
    for split in ("train", "valid", "test"):
        d = Dictionary.load(str(dest / f"dict.{tgt}.txt"))
        ds = data_utils.load_indexed_dataset(str(dest / f"{split}.{src}-{tgt}.{tgt}"), d)
        sizes[split] = len(ds)
    return sizes


@pytest.mark.slow
def test_iwslt14_over_loopback_http(tmp_path, http_mirror, capsys):
    url, handler = http_mirror
    prepare(["iwslt14_de_en", *common(tmp_path, "--mirror", url, "--expect", EXPECT)])
    dest = tmp_path / "data-bin" / "iwslt14_de_en+fixture"
    meta = json.loads((dest / "prepare.json").read_text())
    assert (meta["source_lang"], meta["target_lang"], meta["bpe"],
            meta["lowercase"]) == ("de", "en", "subword-nmt", True)
    assert meta["sentences"] == {"train": 73, "valid": 3, "test": 20} == _dataset_sizes(dest, "de", "en")
    assert (dest / "dict.de.txt").read_text() == (dest / "dict.en.txt").read_text()  # joined (EMNLP 2020's)
    # test = dev2010 + tedx.dev2012 + tst2010-2012 in that order; raw reference kept for sacrebleu
    assert lines(dest / "test.ref.en")[0] == "The ocean is a very complicated thing."
    assert lines(dest / "test.tok.en")[6] == "it &apos;s a well-known problem , isn &apos;t it ?"
    assert ("de-en.tgz", None) in handler.requests


@pytest.mark.slow
def test_wmt14_from_a_mirror_directory(tmp_path, capsys):
    prepare(["wmt14_en_de", *common(tmp_path, "--mirror", str(MIRROR), "--expect", EXPECT)])
    dest = tmp_path / "data-bin" / "wmt14_en_de+fixture"
    meta = json.loads((dest / "prepare.json").read_text())
    assert meta["compound_split"] and meta["aggressive_dash"] and meta["joint_bpe"] and not meta["joined_dictionary"]
    assert (dest / "dict.en.txt").read_text() != (dest / "dict.de.txt").read_text()  # a dictionary per language
    sizes = _dataset_sizes(dest, "en", "de")
    assert sizes == meta["sentences"] and sizes["valid"] == 6 and sizes["test"] == 8 and 30 <= sizes["train"] <= 36
    # europarl + commoncrawl + news-commentary, only the de-en members were extracted
    orig = tmp_path / "work" / "wmt14_en_de+fixture" / "orig"
    assert not list(orig.rglob("*fr-en*")) and (orig / "commoncrawl" / "commoncrawl.de-en.de").exists()
    assert lines(dest / "test.ref.de")[0] == "Es ist ein bekanntes Problem, nicht wahr?"
    assert "@-@" in (tmp_path / "work" / "wmt14_en_de+fixture" / "tok" / "train.en").read_text()  # aggressive hyphens
    # what each archive was checked against and its sha256, and the pairs per corpus before and after cleaning
    checked = meta["verification"]
    assert checked["expectations"] == {"manifest": "fixture", "path": EXPECT}
    assert checked["files"]["training-parallel-nc-v9.tgz"]["sha256"] == hashlib.sha256(
        (MIRROR / "training-parallel-nc-v9.tgz").read_bytes()).hexdigest()
    pairs = meta["train_pairs"]
    assert list(pairs["corpora"]) == ["europarl-v7", "commoncrawl", "news-commentary-v9"]
    assert sum(c["after_cleaning"] for c in pairs["corpora"].values()) == pairs["final_train"] == sizes["train"]
    assert all(c["before_cleaning"] >= c["after_cleaning"] > 0 for c in pairs["corpora"].values())
    out = capsys.readouterr().out
    assert f"training pairs: {sizes['train']:,}, the paper's 4,500,000" in out and "warning [manifest fixture]" in out
    assert not (tmp_path / "data-bin" / "wmt14_en_de").exists()  # the real data's place stays empty


@pytest.mark.slow
def test_wmt17_downloads_cwmt_or_reads_a_manual_download(tmp_path, capsys):
    # without a manual copy CWMT is downloaded (tests/data/test_wmt17_data.py); this mirror lacks the CWMT zips
    with pytest.raises(SystemExit, match="could not download casia2015.zip from mirror") as err:
        prepare(["wmt17_zh_en", *common(tmp_path / "a", "--mirror", str(MIRROR), "--expect", EXPECT)])
    assert "manual/cwmt/ (or CWMT_DIR=dir)" in str(err.value) and "CWMT=skip" in str(err.value)
    # the fixtures hold 12-line stand-ins of the corpora: their pair counts are not the published ones
    prepare(["wmt17_zh_en", *common(tmp_path, "--mirror", str(MIRROR), "--expect", EXPECT, "--allow-unverified",
                                     "--cwmt-dir", str(FIXTURES / "cwmt"), "--zh-seg", "char")])
    dest = tmp_path / "data-bin" / "wmt17_zh_en+fixture"
    meta = json.loads((dest / "prepare.json").read_text())
    # news commentary 12 + UN (two split parts) 12 + CWMT zip 6 + CWMT folder 6
    assert meta["sentences"] == {"train": 36, "valid": 5, "test": 8} == _dataset_sizes(dest, "zh", "en")
    assert (dest / "codes.zh").exists() and (dest / "codes.en").exists()  # BPE per language
    out = capsys.readouterr().out
    assert "CWMT casia2015" in out and "UN-v1.0: 12 sentence pairs" in out


@pytest.mark.slow
def test_wmt17_without_cwmt_with_sentencepiece(tmp_path, capsys):
    prepare(["wmt17_zh_en", *common(tmp_path, "--mirror", str(MIRROR), "--expect", EXPECT, "--skip-cwmt",
                                     "--allow-unverified",
                                     "--bpe", "sentencepiece", "--bpe-size", "300")])  # > the 149 characters
    dest = tmp_path / "data-bin" / "wmt17_zh_en+fixture"
    meta = json.loads((dest / "prepare.json").read_text())
    assert meta["sentences"]["train"] == 24 and meta["post_process"] == "sentencepiece"
    assert meta["training_data"]["cwmt"]["status"] == "skipped" and not meta["training_data"]["verified"]
    assert (dest / "spm.zh.model").exists() and (dest / "spm.en.model").exists()


def test_demo_with_subword_nmt_and_gzip_train(tmp_path, capsys):
    prepare(["demo", *common(tmp_path, "--demo-dir", str(FIXTURES / "demo_text"), "--bpe", "subword-nmt")])
    dest = tmp_path / "data-bin" / "demo"
    meta = json.loads((dest / "prepare.json").read_text())
    assert meta["moses_tokenized"] and meta["post_process"] == "subword_nmt" and meta["joined_dictionary"]
    assert meta["sentences"] == {"train": 60, "valid": 6, "test": 6}
    assert lines(dest / "test.ref.de") == lines(FIXTURES / "demo_text" / "test.de")


def test_resume_after_interruption(tmp_path, capsys):
    def args(size="100"):
        return ["demo", *common(tmp_path, "--demo-dir", str(FIXTURES / "demo_text"), "--bpe-size", size)]

    prepare(args() + ["--stop-after", "tokenize"])
    out = capsys.readouterr().out
    assert "stopped after step tokenize" in out and not (tmp_path / "data-bin" / "demo").exists()
    # a step killed half-way leaves only temporary files, never a file under its final name
    stray = tmp_path / "work" / "demo" / "clean" / ".train.en.txt.tmp999"
    stray.parent.mkdir(parents=True)
    stray.write_text("half a file")
    prepare(args())
    out = capsys.readouterr().out
    assert out.count("done already, skipped") == 3 and "step 4/7: clean" in out
    for step in ("collect", "normalize", "tokenize"):
        assert f"{step}" in out.split("step 4/7")[0]
    meta = json.loads((tmp_path / "data-bin" / "demo" / "prepare.json").read_text())
    assert meta["bpe"] == "sentencepiece" and meta["sentences"]["train"] == 60
    prepare(args())  # everything complete: all skipped
    assert capsys.readouterr().out.count("done already, skipped") == 7
    with pytest.raises(SystemExit, match="already holds a prepared dataset that this one would replace"):
        prepare(args("110"))  # a changed BPE size would replace the dataset: refused
    assert capsys.readouterr().out.count("done already, skipped") == 4  # BPE and what follows ran, nothing before
    prepare(args("110") + ["--replace"])  # only the binarisation was left to do
    out = capsys.readouterr().out
    assert out.count("done already, skipped") == 6 and "replacing " in out and "bpe_size: 100 before, 110 now" in out
    assert json.loads((tmp_path / "data-bin" / "demo" / "prepare.json").read_text())["bpe_size"] == 110


@pytest.mark.slow
def test_corrupt_archive_is_rejected_then_replaced(tmp_path, capsys):
    bad = tmp_path / "bad-mirror"
    bad.mkdir()
    data = (MIRROR / "de-en.tgz").read_bytes()
    (bad / "de-en.tgz").write_bytes(data[: len(data) // 2])  # truncated; IWSLT publishes no checksum
    with pytest.raises(SystemExit, match="de-en.tgz is corrupt or truncated"):
        prepare(["iwslt14_de_en", *common(tmp_path, "--mirror", str(bad))])
    downloads = tmp_path / "work" / "iwslt14_de_en" / "downloads"
    assert (downloads / "de-en.tgz.corrupt").exists() and not (downloads / "de-en.tgz").exists()
    assert not (tmp_path / "work" / "iwslt14_de_en" / "orig" / "de-en").exists()
    prepare(["iwslt14_de_en", *common(tmp_path, "--mirror", str(MIRROR))])  # a good copy: fetched again
    assert (tmp_path / "data-bin" / "iwslt14_de_en" / "prepare.json").exists()


def test_prepare_data_script_help(capsys):
    """scripts/prepare_data.sh execs ``python -m diverse_fairseq.data.prepare "$@"`` (the script itself runs for real
    in test_reproducibility and conftest's demo_text_prepared): its --help, from that main in this process."""
    assert 'exec "$PY" -m diverse_fairseq.data.prepare "$@"' in (REPO / "scripts" / "prepare_data.sh").read_text()
    with pytest.raises(SystemExit) as stopped:
        prepare(["--help"])
    out = capsys.readouterr().out
    assert stopped.value.code == 0 and "iwslt14_de_en" in out and "--mirror" in out


@pytest.mark.slow
def test_wmt14_joined_follows_macaron_nets_scripts_and_shares_the_downloads(tmp_path, capsys):
    """``wmt14_en_de_joined`` (EMNLP 2020) as macaron-net's prepare-wmt14en2de.sh: News Commentary v12, 32,764
    merges, the 1-80 length filter on the tokenized words before BPE, one joined dictionary; the archives it shares
    with ``wmt14_en_de`` are read from (and fetched into) that recipe's downloads/."""
    from diverse_fairseq.data.recipes import RECIPES

    recipe = RECIPES["wmt14_en_de_joined"]
    assert recipe.bpe_size == 32764 and not recipe.clean_after_bpe and (recipe.clean_max, recipe.clean_ratio) == (80, 9)
    assert [s.filename for a in recipe.archives for s in a.parts] == [
        "training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz", "training-parallel-nc-v12.tgz",
        "dev.tgz", "test-full.tgz"]
    prepare(["wmt14_en_de_joined", *common(tmp_path, "--mirror", str(MIRROR), "--expect", EXPECT)])
    dest = tmp_path / "data-bin" / "wmt14_en_de_joined+fixture"
    meta = json.loads((dest / "prepare.json").read_text())
    assert meta["joined_dictionary"] and (dest / "dict.en.txt").read_text() == (dest / "dict.de.txt").read_text()
    work = tmp_path / "work"
    shared = sorted(p.name for p in (work / "wmt14_en_de+fixture" / "downloads").iterdir() if p.suffix == ".tgz")
    assert "training-parallel-nc-v12.tgz" in shared and "training-parallel-europarl-v7.tgz" in shared
    assert not (work / "wmt14_en_de_joined+fixture" / "downloads").exists()
    own = work / "wmt14_en_de_joined+fixture"
    nc_v12 = lines(own / "orig" / "news-commentary-v12" / "training" / "news-commentary-v12.de-en.en")
    train = (own / "raw" / "train.en").read_text()
    assert nc_v12 and all(line.replace("\r", " ") in train for line in nc_v12)
    # cleaned on the tokenized words (clean/), no cleaning after BPE (final/)
    assert (own / "clean" / "train.en.tok").exists() and not (own / "final").exists()
    assert meta["sentences"] == _dataset_sizes(dest, "en", "de") and meta["sentences"]["valid"] == 6


def test_prepare_is_a_library_function_of_typed_options(tmp_path, monkeypatch):
    """The table runner prepares data with :func:`prepare` and typed options: the command line's variables
    (``BPE_SIZE``, ``DEMO_DIR``, ``WORK_DIR``) are read by ``main`` only."""
    from diverse_fairseq.data.prepare import PrepareOptions
    from diverse_fairseq.data.prepare import prepare as prepare_options

    foreign = {"BPE_SIZE": "7", "DEMO_DIR": str(tmp_path / "nowhere"), "WORK_DIR": str(tmp_path / "w")}
    for name, value in foreign.items():
        monkeypatch.setenv(name, value)
    dest = prepare_options(PrepareOptions("demo", bpe_size=100, work_dir=tmp_path / "work",
                                          data_bin=tmp_path / "data-bin", demo_dir=str(FIXTURES / "demo_text")))
    meta = json.loads((dest / "prepare.json").read_text())
    assert dest == tmp_path / "data-bin" / "demo" and meta["bpe_size"] == 100 and (tmp_path / "work").is_dir()
    assert not (tmp_path / "w").exists()
