"""Learning the segmentation (diverse_fairseq/data/bpe.py): no progress bar in the preparation log, and a warning,
naming BPE_SIZE, when the corpus supports fewer merges (or sentencepiece pieces) than asked for."""

import random

import pytest

from diverse_fairseq.data import bpe


def _corpus(path, sentences=200, seed=0):
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7))) for _ in range(300)]
    path.write_text("".join(" ".join(rng.choice(words) for _ in range(8)) + "\n" for _ in range(sentences)))
    return path


def test_more_merges_than_the_corpus_supports_are_warned_about_without_a_progress_bar(tmp_path, capfd):
    train = _corpus(tmp_path / "train.en")
    said = []
    models = bpe.learn("subword-nmt", {"en": train}, tmp_path / "bpe", 10000, joint=True, log=said.append)
    learned = bpe.count_merges(models["en"])
    assert 0 < learned < 10000
    warning = [s for s in said if "warning" in s]
    assert warning == [f"  warning: subword-nmt learned {learned:,} of the 10,000 BPE merges asked for: after that "
                       f"no symbol pair occurs twice in train.en, so every word that occurs at least twice is already "
                       f"one symbol and the corpus supports no more merges. Lower BPE_SIZE (--bpe-size) to "
                       f"{learned:,} or less ({learned:,} gives the same model; the <unk> rates printed after "
                       f"binarisation say whether a smaller size is needed): BPE_SIZE={learned}"]
    out, err = capfd.readouterr()
    # subword-nmt's tqdm bar ("  5%|▌   | 512/10000 [00:00<00:02, 3456.78it/s]") and its stop message stay out
    assert "it/s" not in err + out and "%|" not in err + out and "Stopping" not in err + out


def test_a_supported_number_of_merges_learns_them_all_quietly(tmp_path, capfd):
    said = []
    models = bpe.learn("subword-nmt", {"en": _corpus(tmp_path / "train.en")}, tmp_path / "bpe", 50, joint=True,
                       log=said.append)
    assert bpe.count_merges(models["en"]) == 50 and not [s for s in said if "warning" in s]
    out, err = capfd.readouterr()
    assert "it/s" not in err + out


def test_a_text_of_single_symbols_is_left_unsegmented(tmp_path):
    train = tmp_path / "train.zh"
    train.write_text("我 们 是\n你 们 好\n")
    said = []
    models = bpe.learn("subword-nmt", {"zh": train}, tmp_path / "bpe", 100, joint=False, log=said.append)
    assert bpe.count_merges(models["zh"]) == 0
    assert any("no BPE merges can be learned from train.zh" in s for s in said)
    assert bpe.segment("subword-nmt", models["zh"], "我 们") == "我 们"


def test_a_sentencepiece_vocabulary_larger_than_the_corpus_supports_is_warned_about(tmp_path):
    pytest.importorskip("sentencepiece")
    said = []
    bpe.learn("sentencepiece", {"en": _corpus(tmp_path / "train.en")}, tmp_path / "bpe", 10000, joint=True,
              log=said.append)
    warning = [s for s in said if "warning" in s]
    assert len(warning) == 1 and "sentencepiece made a vocabulary of " in warning[0]
    assert "of the 10,000 entries asked for: the corpus (train.en) supports no more pieces. Lower BPE_SIZE " \
           "(--bpe-size) to " \
           in warning[0]
