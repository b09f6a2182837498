"""SentEval's probing files are checked against the published sizes as they arrive, and a fixture or mirror never
writes into ``work/senteval_probing``, the cache that real probing tables read.

The repository root is redirected into tmp_path (``senteval.__file__``), so the real cache here is
``tmp_path/work/senteval_probing`` and the checkout's own ``work/`` is never touched.
"""

from pathlib import Path

import pytest

from diverse_fairseq.data import senteval
from diverse_fairseq.data.download import DownloadError
from diverse_fairseq.tables.__main__ import ensure_probing_data

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "senteval"
ENV_KEYS = ("DIVERSE_FAIRSEQ_MIRROR", "PROBING_DATA", "CHECKSUMS")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A stand-in repository root: the real probing cache becomes ``tmp_path/work/senteval_probing``."""
    monkeypatch.setattr(senteval, "__file__", str(tmp_path / "diverse_fairseq" / "data" / "senteval.py"))
    return tmp_path


def _published_size_file(path: Path):
    """A file with SentEval's published sizes (100k / 10k / 10k), two balanced classes."""
    rows = [f"{split}\t{i % 2}\tsentence number {i} ." for split, n in senteval.PUBLISHED_MIN.items()
            for i in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def test_a_fixture_probing_run_leaves_the_real_cache_untouched(repo):
    real = repo / "work" / "senteval_probing"
    # the README's 3-minute fixture check: DIVERSE_FAIRSEQ_MIRROR=tests/fixtures/senteval
    used = ensure_probing_data(["SentLen", "Tense"], None, "demo", mirror=str(FIXTURE))
    assert used != real.resolve() and (used / "sentence_length.txt").is_file()
    assert not real.exists() or not any(real.iterdir())
    # a paper-scale (real) run refuses the stand-ins, and names what it expected
    with pytest.raises(SystemExit, match=r"24 / 6 / 6 .*100,000 / 10,000 / 10,000"):
        ensure_probing_data(["SentLen"], None, "paper", mirror=str(FIXTURE))
    assert not real.exists() or not any(real.iterdir())


def test_a_real_run_refuses_stand_ins_already_in_the_real_cache(repo):
    real = repo / "work" / "senteval_probing"
    real.mkdir(parents=True)
    (real / "sentence_length.txt").write_bytes((FIXTURE / "sentence_length.txt").read_bytes())  # the old leak
    with pytest.raises(SystemExit, match="sentence_length.txt has 24 / 6 / 6 sentences"):
        ensure_probing_data(["SentLen"], None, "demo")
    assert not (real / "sentence_length.txt").exists()  # never kept under its final name
    assert (real / "sentence_length.txt.rejected").is_file()


def test_stand_ins_never_go_into_the_real_cache_even_when_accepted(repo):
    with pytest.raises(DownloadError, match="not allowed in"):
        senteval.download(senteval.parse_tasks("SentLen"), repo / "work" / "senteval_probing", mirror=str(FIXTURE),
                          require_published=False)


def test_a_short_download_is_refused_with_the_published_sizes(tmp_path):
    with pytest.raises(DownloadError) as err:
        senteval.download(senteval.parse_tasks("WC"), tmp_path / "cache", mirror=str(FIXTURE), log=lambda m: None)
    message = str(err.value)
    assert "word_content.txt has 24 / 6 / 6" in message and "SentEval's data/probing/README.md" in message
    assert "raw.githubusercontent.com/facebookresearch/SentEval" in message
    assert not (tmp_path / "cache" / "word_content.txt").exists()


def test_a_file_of_the_published_size_is_accepted(tmp_path):
    mirror = tmp_path / "mirror"
    _published_size_file(mirror / "bigram_shift.txt")
    paths = senteval.download(senteval.parse_tasks("BShift"), tmp_path / "cache", mirror=str(mirror),
                              log=lambda m: None)
    assert senteval.split_sizes(paths["BShift"]) == {"tr": 100_000, "va": 10_000, "te": 10_000}
    assert senteval.check_sizes(paths["BShift"]) is None


def test_a_mirror_gets_its_own_default_cache(repo):
    real = repo / "work" / "senteval_probing"
    assert senteval.default_dir() == real
    assert senteval.default_dir(str(FIXTURE)).parent == repo / "work" / "senteval_probing-mirrors"
    assert senteval.default_dir(str(FIXTURE)) != senteval.default_dir("https://mirror.example.org/nmt")
