"""Same seed, same result: on one machine, the same command with the same seed gives bit-identical data and
parameters.

The runs go through the code path of ``make demo``: ``scripts/prepare_data.sh demo`` (sentencepiece, binarize)
on the first 600 pairs of ``data/demo``, then :func:`diverse_fairseq.training.run` with the ``tiny`` setting
on the CPU with one thread (OMP_NUM_THREADS = MKL_NUM_THREADS = 1), for a few updates. The first run of each row
is the real one (fairseq-train's main as ``training.launch`` runs it); the runs compared with it train the same
plan's fairseq-train arguments through the tests' own helper (tests/methods/fairseq_in_process.py, one thread,
fairseq's global state put back), so "bit-identical" also holds across the two ways of running. A different number of
threads or another CPU may give other bits (matrix products split their sums differently): see docs/reproducing.md,
"What may differ across machines".
"""

import gzip
import itertools
import os
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import once_per_session
from fairseq_in_process import fairseq_train

from diverse_fairseq import training
from diverse_fairseq.runs.plan import plan

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "demo"
UPDATES = 6  # within the first epoch (15 or more batches of 1,024 tokens): the seeded batch order matters

ROWS = {
    "baseline": [],
    # disagreement regularization, EM routing and repulsive attention with SPOS, whose noise is the one
    # random draw of the features themselves (repulsive_adam seeds it from --seed and the step number)
    "all_three": ["--arch", "diverse_transformer", "--criterion", "label_smoothed_cross_entropy_with_disagreement",
                  "--disagreement-terms", "out", "--disagreement-attention", "enc_self,dec_self,enc_dec",
                  "--routing-type", "em", "--routing-encoder-layers", "0,1", "--routing-iterations", "3",
                  "--optimizer", "repulsive_adam", "--repulsive-method", "spos",
                  "--repulsive-attention", "enc_self,dec_self,enc_dec", "--repulsive-layers", "all",
                  "--repulsive-projections", "q,k,v"],
}


def _head(path: Path, n: int):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return list(itertools.islice(f, n))


def _prepare(root: Path, demo_dir: Path, workers: int) -> Path:
    env = dict(os.environ, DATA_BIN=str(root / "data-bin"), WORK_DIR=str(root / "work"), DEMO_DIR=str(demo_dir),
               BPE_SIZE="400", WORKERS=str(workers))
    env.pop("BPE", None)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "prepare_data.sh"), "demo"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "data-bin"


def _prepare_here(root: Path, demo_dir: Path, workers: int) -> Path:
    """:func:`_prepare` with the data preparation's ``main`` called in this process (the same options)."""
    from diverse_fairseq.data.prepare import main as prepare

    with pytest.MonkeyPatch.context() as env:
        env.delenv("BPE", raising=False)
        prepare(["demo", "--data-bin", str(root / "data-bin"), "--work-dir", str(root / "work"), "--demo-dir",
                 str(demo_dir), "--bpe-size", "400", "--workers", str(workers)])
    return root / "data-bin"


@pytest.fixture(scope="module")
def demo_bins(tmp_path_factory, worker_id):
    """The first 600 training pairs (50 valid, 50 test) of data/demo, prepared twice: with 1 worker (the data
    preparation's main, in this process) and 2 (scripts/prepare_data.sh demo). Once per session, also across
    pytest-xdist's workers (conftest's ``once_per_session``): a worker given only some of this module's tests waits
    for the other's preparations instead of repeating them."""

    def make(root: Path) -> None:
        for name in ("demo_subset", "prep_w1", "prep_w2"):
            (root / name).mkdir()
        demo_dir = root / "demo_subset"
        for split, n in (("train", 600), ("valid", 50), ("test", 50)):
            for lang in ("en", "de"):
                src = DEMO / f"{split}.{lang}.gz" if split == "train" else DEMO / f"{split}.{lang}"
                (demo_dir / f"{split}.{lang}").write_text("".join(_head(src, n)), encoding="utf-8")
        _prepare_here(root / "prep_w1", demo_dir, 1)
        _prepare(root / "prep_w2", demo_dir, 2)

    root = once_per_session(tmp_path_factory, worker_id, "reproducibility_demo_bins", make)
    return [root / "prep_w1" / "data-bin", root / "prep_w2" / "data-bin"]


def _pieces(model: Path):
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.read_bytes())
    return [(p.piece, p.score, p.type) for p in proto.pieces]


@pytest.mark.slow
def test_demo_preparation_is_deterministic(demo_bins):
    """Two preparations (1 and 2 workers) give byte-identical binarized data and the same sentencepiece model
    (its file also records the input paths, so the pieces are compared)."""
    one, two = (d / "demo" for d in demo_bins)
    names = sorted(p.name for p in one.iterdir() if p.suffix in (".bin", ".idx") or p.name.startswith("dict."))
    assert len(names) == 14  # 3 splits x 2 languages x (.bin, .idx) + 2 dictionaries
    assert names == sorted(p.name for p in two.iterdir() if p.suffix in (".bin", ".idx") or p.name.startswith("dict."))
    for name in names:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    assert len(_pieces(one / "spm.model")) == 400 and _pieces(one / "spm.model") == _pieces(two / "spm.model")


def test_sentencepiece_learns_from_a_seeded_sample(tmp_path, monkeypatch):
    """A corpus larger than SPM_INPUT_SENTENCES is sampled by our seeded sampler (sentencepiece's own sampling
    draws a new seed in every process): the same lines every time, and sentencepiece learns from exactly them."""
    from diverse_fairseq.data import bpe

    files = {}
    for lang in ("en", "de"):
        files[lang] = tmp_path / f"train.{lang}"
        files[lang].write_text("".join(_head(DEMO / f"train.{lang}.gz", 2000)), encoding="utf-8")
    corpus = files["en"].read_bytes().splitlines() + files["de"].read_bytes().splitlines()
    samples = [tmp_path / "sample1", tmp_path / "sample2"]
    assert all(bpe._seeded_sample(list(files.values()), 300, s) for s in samples)
    assert not bpe._seeded_sample(list(files.values()), len(corpus), tmp_path / "none")  # everything fits
    assert samples[0].read_bytes() == samples[1].read_bytes()
    lines = samples[0].read_bytes().splitlines()
    rest = iter(corpus)
    assert len(lines) == 300 and all(line in rest for line in lines)  # a subsequence of the corpus, in order
    assert set(lines) & set(corpus[:2000]) and set(lines) & set(corpus[2000:])  # from both languages

    monkeypatch.setattr(bpe, "SPM_INPUT_SENTENCES", 300)
    sampled = bpe.learn("sentencepiece", files, tmp_path / "sampled", 200, joint=True, log=lambda *a: None)
    monkeypatch.setattr(bpe, "SPM_INPUT_SENTENCES", len(corpus))
    whole = bpe.learn("sentencepiece", {"en": samples[0]}, tmp_path / "whole", 200, joint=True, log=lambda *a: None)
    assert len(_pieces(sampled["en"])) == 200 and _pieces(sampled["en"]) == _pieces(whole["en"])
    assert not list((tmp_path / "sampled").glob("*.sample"))  # the sample file is removed


@pytest.fixture(scope="module")
def train(demo_bins, tmp_path_factory, worker_id):
    """``train(row, seed, tag)`` → the checkpoint after UPDATES updates: seed 1 without a tag by
    :func:`diverse_fairseq.training.run` (the product's path: ``training.launch``), the others by the tests' own
    in-process fairseq-train. Each run is
    trained once per session, also across pytest-xdist's workers (conftest's ``once_per_session``: a worker that
    needs a run the other is training waits for it), and loaded once per process."""
    done = {}

    def _train(row: str, seed: int, tag: str = ""):
        key = (row, seed, tag)
        if key not in done:

            def make(folder: Path) -> None:
                save_dir = folder / "save"
                env = dict(os.environ, DATA_BIN=str(demo_bins[0]), SAVE_DIR=str(save_dir), SEED=str(seed),
                           MAX_UPDATE=str(UPDATES), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                           CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
                for name in ("MAX_TOKENS", "UPDATE_FREQ", "PRECISION", "AVERAGE", "NNODES", "SLURM_NNODES", "DRY_RUN"):
                    env.pop(name, None)
                if tag or seed != 1:  # the same plan, fairseq-train in this process
                    fairseq_train(plan(training.request_from_env("demo", "tiny", ROWS[row], env=env, gpus=0)).args)
                    checkpoint = save_dir / "checkpoint_last.pt"
                else:  # the real run: diverse_fairseq.training.run, fairseq-train's main as training.launch runs it
                    checkpoint = training.run_from_env("demo", "tiny", ROWS[row], env=env, gpus=0).checkpoint
                (folder / "checkpoint").write_text(str(checkpoint))

            folder = once_per_session(tmp_path_factory, worker_id, f"reproducibility_{row}-seed{seed}{tag}", make)
            checkpoint = Path((folder / "checkpoint").read_text())
            state = torch.load(checkpoint, map_location="cpu", weights_only=False)
            assert state["optimizer_history"][-1]["num_updates"] == UPDATES
            assert state["extra_state"]["train_iterator"]["epoch"] == 1  # within the first epoch
            done[key] = state
        return done[key]

    return _train


@pytest.mark.slow
@pytest.mark.parametrize("row", sorted(ROWS))
def test_same_seed_gives_bit_identical_parameters(train, row):
    cfg = train(row, 1)["cfg"]
    if row == "all_three":  # the features are on: SPOS noise, disagreement term, EM routing
        assert (cfg["optimizer"]["_name"], cfg["optimizer"]["repulsive_method"]) == ("repulsive_adam", "spos")
        assert cfg["criterion"]["_name"] == "label_smoothed_cross_entropy_with_disagreement"
        assert (cfg["model"].arch, cfg["model"].routing_type) == ("diverse_transformer", "em")
    first, second = train(row, 1)["model"], train(row, 1, "-again")["model"]
    assert first.keys() == second.keys() and len(first) > 50
    differ = [name for name in first if not torch.equal(first[name], second[name])]
    assert not differ, f"{len(differ)} of {len(first)} tensors differ between two runs with seed 1: {differ[:5]}"


@pytest.mark.slow
def test_another_seed_gives_other_parameters(train):
    first, other = train("baseline", 1)["model"], train("baseline", 2)["model"]
    # every parameter: weight matrices start from another draw, and the biases and layer norms (which start
    # at 0 and 1) took UPDATES Adam steps on other batches; the encoder's and decoder's ``version`` buffers
    # are no parameters
    weights = [name for name in first if not name.endswith(".version")]
    same = [name for name in weights if torch.equal(first[name], other[name])]
    assert len(weights) > 50 and not same, same
