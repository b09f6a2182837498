"""Every fetched file is verified before anything reads it (diverse_fairseq/data/verify.py), offline: a loopback
HTTP server serves good, truncated, HTML and wrong files; files are placed by hand; a mirror folder holds
well-formed archives of the wrong corpus (the fixtures: the real names and members, a dozen lines each)."""

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from diverse_fairseq.data import download
from diverse_fairseq.data.download import DownloadError, Source, fetch
from diverse_fairseq.data.prepare import main as prepare
from diverse_fairseq.data.recipes import wmt14
from diverse_fairseq.data.verify import Expected

REPO = Path(__file__).resolve().parents[2]
MIRROR = REPO / "tests" / "fixtures" / "mirror"
GOOD = (MIRROR / "de-en.tgz").read_bytes()
GOOD_EXPECTED = Expected(size=len(GOOD), sha256=__import__("hashlib").sha256(GOOD).hexdigest(), source="test")
HTML = b"<!DOCTYPE html>\n<html><head><title>Download</title></head><body>Please log in</body></html>\n"


class Handler(BaseHTTPRequestHandler):
    """/good (Range support), /truncated (first half, a complete response), /html (200, text/html),
    /html-octet (an HTML body sent as application/octet-stream), /other (another valid gzip file)."""

    requests = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        name = self.path.strip("/").split("/")[0]
        rng = self.headers.get("Range")
        type(self).requests.append((name, rng))
        body, kind = {"good": (GOOD, "application/x-gzip"), "truncated": (GOOD[: len(GOOD) // 2], "application/x-gzip"),
                      "html": (HTML, "text/html; charset=utf-8"), "html-octet": (HTML, "application/octet-stream"),
                      "other": ((MIRROR / "dev.tgz").read_bytes(), "application/x-gzip")}.get(name, (None, None))
        if body is None:
            self.send_error(404)
            return
        start = int(rng.split("=")[1].split("-")[0]) if rng else 0
        self.send_response(206 if rng else 200)
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        self.wfile.write(body[start:])


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(download.time, "sleep", lambda s: None)
    monkeypatch.delenv("DIVERSE_FAIRSEQ_MIRROR", raising=False)
    handler = type("H", (Handler,), {"requests": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


def quiet(*_):
    pass


def test_a_good_file_is_verified_and_marked(tmp_path, server):
    url, handler = server
    got = fetch(Source("de-en.tgz", (f"{url}/good/de-en.tgz",)), tmp_path, expected=GOOD_EXPECTED, log=quiet)
    assert got.read_bytes() == GOOD
    record = json.loads((tmp_path / "de-en.tgz.verified").read_text())
    assert record["sha256"] == GOOD_EXPECTED.sha256 and record["size"] == len(GOOD)
    handler.requests[:] = []
    fetch(Source("de-en.tgz", (f"{url}/good/de-en.tgz",)), tmp_path, expected=GOOD_EXPECTED, log=quiet)
    assert handler.requests == []  # verified already: neither fetched nor hashed again


def test_a_truncated_file_is_refused_with_expected_and_found_sizes(tmp_path, server):
    url, _ = server
    source = Source("de-en.tgz", (f"{url}/truncated/de-en.tgz",))
    with pytest.raises(DownloadError) as err:
        fetch(source, tmp_path, expected=GOOD_EXPECTED, log=quiet)
    message = str(err.value)
    assert f"expected {len(GOOD):,} bytes" in message and f"found {len(GOOD) // 2:,} bytes" in message
    assert "truncated" in message and "de-en.tgz" in message and f"{url}/truncated/de-en.tgz" in message
    assert not (tmp_path / "de-en.tgz").exists() and not (tmp_path / "de-en.tgz.part").exists()


def test_an_html_page_with_status_200_is_refused_and_the_next_location_tried(tmp_path, server):
    url, handler = server
    # nothing published for this file: the HTML checks alone must catch the page, whatever its Content-Type
    for page in ("html", "html-octet"):
        with pytest.raises(DownloadError, match="HTML page") as err:
            fetch(Source("de-en.tgz", (f"{url}/{page}/de-en.tgz",)), tmp_path, retries=1, log=quiet)
        assert "de-en.tgz" in str(err.value) and not (tmp_path / "de-en.tgz").exists()
    handler.requests[:] = []
    source = Source("de-en.tgz", (f"{url}/html/de-en.tgz", f"{url}/html-octet/de-en.tgz", f"{url}/good/de-en.tgz"))
    assert fetch(source, tmp_path, log=quiet).read_bytes() == GOOD
    assert [name for name, _ in handler.requests] == ["html", "html-octet", "good"]  # one try each, then the next


def test_a_wrong_checksum_is_refused_and_the_next_location_tried(tmp_path, server):
    url, handler = server
    wrong = Source("de-en.tgz", (f"{url}/other/de-en.tgz",), sha256=GOOD_EXPECTED.sha256, checksum_source="a registry")
    with pytest.raises(DownloadError) as err:
        fetch(wrong, tmp_path, log=quiet)
    message = str(err.value)
    assert f"expected sha256 {GOOD_EXPECTED.sha256} (a registry)" in message and "found " in message
    assert f"Get the file from {url}/other/de-en.tgz" in message and not (tmp_path / "de-en.tgz").exists()
    both = Source("de-en.tgz", (f"{url}/other/de-en.tgz", f"{url}/good/de-en.tgz"), sha256=GOOD_EXPECTED.sha256)
    assert fetch(both, tmp_path, log=quiet).read_bytes() == GOOD


def test_a_partial_file_resumes_with_range_and_is_verified(tmp_path, server):
    url, handler = server
    (tmp_path / "de-en.tgz.part").write_bytes(GOOD[:700])
    got = fetch(Source("de-en.tgz", (f"{url}/good/de-en.tgz",)), tmp_path, expected=GOOD_EXPECTED, log=quiet)
    assert got.read_bytes() == GOOD and handler.requests == [("good", "bytes=700-")]
    assert (tmp_path / "de-en.tgz.verified").exists()
    # a .part longer than the published size is no prefix of it: started over, not resumed
    got.unlink()
    (tmp_path / "de-en.tgz.part").write_bytes(GOOD + b"junk")
    handler.requests[:] = []
    assert fetch(Source("de-en.tgz", (f"{url}/good/de-en.tgz",)), tmp_path, expected=GOOD_EXPECTED,
                 log=quiet).read_bytes() == GOOD
    assert handler.requests == [("good", None)]


def test_a_wrong_file_placed_by_hand_is_refused_before_use(tmp_path):
    placed = tmp_path / "training-parallel-nc-v9.tgz"
    shutil.copyfile(MIRROR / "training-parallel-nc-v9.tgz", placed)  # the real name, a dozen lines
    with pytest.raises(DownloadError) as err:
        fetch(wmt14.NEWS_COMMENTARY, tmp_path, log=quiet)
    message = str(err.value)
    assert message.startswith("training-parallel-nc-v9.tgz: expected 80,418,416 bytes (TensorFlow Datasets")
    assert f"found {(MIRROR / 'training-parallel-nc-v9.tgz').stat().st_size:,} bytes" in message
    assert "http://statmt.org/wmt14/training-parallel-nc-v9.tgz" in message
    assert not placed.exists() and (tmp_path / "training-parallel-nc-v9.tgz.rejected").exists()


def test_a_right_file_placed_by_hand_is_verified_once(tmp_path):
    shutil.copyfile(MIRROR / "de-en.tgz", tmp_path / "de-en.tgz")
    messages = []
    fetch(Source("de-en.tgz", ()), tmp_path, expected=GOOD_EXPECTED, log=messages.append)
    assert "verifying it before use" in messages[0] and (tmp_path / "de-en.tgz.verified").exists()


def test_a_user_checksum_never_overrides_a_published_one():
    from diverse_fairseq.data.download import expected_for

    with pytest.raises(DownloadError, match="published sha256 is 0224c7c7"):
        expected_for(wmt14.EUROPARL, {"training-parallel-europarl-v7.tgz": "1" * 64})
    # where nothing is published, the user's digest is checked
    assert expected_for(Source("x.tgz", ()), {"x.tgz": "ab" * 16}).md5 == "ab" * 16


def test_member_line_counts(tmp_path):
    from diverse_fairseq.data.text import count_lines
    from diverse_fairseq.data.verify import VerificationError, check_member_lines

    (tmp_path / "en-zh").mkdir()
    (tmp_path / "en-zh" / "UNv1.0.en-zh.en").write_text("a\nb\nc")  # no final newline: still three lines
    assert count_lines(tmp_path / "en-zh" / "UNv1.0.en-zh.en") == 3
    assert check_member_lines(tmp_path, {"UNv1.0.en-zh.en": 3}, "un", "src", "there") == {"UNv1.0.en-zh.en": 3}
    with pytest.raises(VerificationError, match=r"member UNv1.0.en-zh.en has 3 lines, expected 15,886,041 \(t2t\)"):
        check_member_lines(tmp_path, {"UNv1.0.en-zh.en": 15_886_041}, "un", "t2t", "there")


def _mirror_of_wrong_archives(tmp_path) -> Path:
    """A mirror folder of well-formed archives with the real names and members, a dozen lines each."""
    mirror = tmp_path / "mirror"
    shutil.copytree(MIRROR, mirror)
    return mirror


def test_a_mirror_of_wrong_wmt14_archives_is_refused_at_the_first(tmp_path):
    mirror = _mirror_of_wrong_archives(tmp_path)
    with pytest.raises(SystemExit) as err:
        prepare(["wmt14_en_de", "--work-dir", str(tmp_path / "work"), "--data-bin", str(tmp_path / "data-bin"),
                 "--mirror", str(mirror)])
    message = str(err.value)
    assert "training-parallel-europarl-v7.tgz: expected 657,632,379 bytes" in message and "found" in message
    downloads = tmp_path / "work" / "wmt14_en_de" / "downloads"
    assert sorted(p.name for p in downloads.iterdir()) == []  # nothing kept, nothing else fetched
    assert not (tmp_path / "work" / "wmt14_en_de" / "orig").exists()


def test_the_un_corpus_is_refused_by_its_line_counts_before_the_next_archive(tmp_path):
    # the fixtures' manifest without its line counts: the UN parts pass (the manifest's sizes and checksums replace
    # the published ones) and the published member counts (15,886,041 lines) refuse them right after extraction,
    # before dev.tgz is fetched
    manifest = json.loads((MIRROR / "EXPECTED.json").read_text())
    del manifest["lines"]
    path = tmp_path / "expect.json"
    path.write_text(json.dumps(manifest))
    with pytest.raises(SystemExit) as err:
        prepare(["wmt17_zh_en", "--work-dir", str(tmp_path / "work"), "--data-bin", str(tmp_path / "data-bin"),
                 "--mirror", str(MIRROR), "--expect", str(path), "--skip-cwmt"])
    message = str(err.value)
    assert "UNv1.0.en-zh.tar.gz.00 + UNv1.0.en-zh.tar.gz.01: member UNv1.0.en-zh" in message
    assert "has 12 lines, expected 15,886,041 (the UN Parallel Corpus page" in message
    work = tmp_path / "work" / "wmt17_zh_en+fixture"
    downloads = sorted(p.name for p in (work / "downloads").iterdir())
    assert "UNv1.0.en-zh.tar.gz.00.rejected" in downloads and "dev.tgz" not in downloads
    assert not (work / "orig" / "un").exists()


def test_fixture_data_never_goes_where_the_real_data_goes(tmp_path):
    """IWSLT14 through the fixtures' manifest, up to the extraction: everything lands in iwslt14_de_en+fixture."""
    prepare(["iwslt14_de_en", "--work-dir", str(tmp_path / "work"), "--data-bin", str(tmp_path / "data-bin"),
             "--mirror", str(MIRROR), "--expect", str(MIRROR / "EXPECTED.json"), "--stop-after", "extract-de-en"])
    assert (tmp_path / "work" / "iwslt14_de_en+fixture" / "orig" / "de-en").is_dir()
    assert not (tmp_path / "work" / "iwslt14_de_en").exists()


def test_the_final_count_is_printed_beside_the_papers_and_a_short_corpus_named():
    from dataclasses import replace

    from diverse_fairseq.data.prepare import compare_with_paper
    from diverse_fairseq.runs.dataset_meta import TrainPairs

    record = TrainPairs.from_json({
        "final_train": 3_000_000, "paper": 4_500_000, "paper_source": "EMNLP 2020", "expectations": "published",
        "corpora": {"europarl-v7": {"before_cleaning": 1_920_209, "after_cleaning": 1_900_000},
                    "commoncrawl": {"before_cleaning": 2_399_123, "after_cleaning": 900_000}}})
    first, warning = compare_with_paper(record, "wmt14_en_de")
    assert "3,000,000, the paper's 4,500,000 (-33.3%; EMNLP 2020)" in first
    assert "33% fewer" in warning and "commoncrawl kept 900,000 of 2,399,123" in warning and "europarl" not in warning
    assert len(compare_with_paper(replace(record, final_train=4_450_000), "wmt14_en_de")) == 1  # within 5%


def test_html_is_told_from_data():
    from diverse_fairseq.data.verify import looks_like_html

    assert looks_like_html(HTML) and looks_like_html(b"\n  <!-- mirror -->\n<html lang='en'>")
    assert not looks_like_html(GOOD)  # gzip
    assert not looks_like_html(b'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<srcset setid="x">')  # IWSLT XML
    assert not looks_like_html(b"tr\tPRES\tShe walks .\n")  # a SentEval probing file
