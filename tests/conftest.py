"""Shared pytest fixtures: a tiny binarized translation dataset and a runner for fairseq's CLIs."""

import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "diverse_fairseq")

# A toy language pair that a tiny Transformer learns in a few dozen updates: the "German" side is the
# English side with every word mapped through a fixed vocabulary and the word order reversed.
_WORDS = [f"w{i}" for i in range(40)]
_MAP = {w: f"x{(i * 7) % 40}" for i, w in enumerate(_WORDS)}


def _make_pairs(n, seed):
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        src = [rng.choice(_WORDS) for _ in range(rng.randint(3, 9))]
        tgt = [_MAP[w] for w in reversed(src)]
        pairs.append((" ".join(src), " ".join(tgt)))
    return pairs


def write_parallel(directory, split, pairs, src="en", tgt="de"):
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{split}.{src}").write_text("".join(s + "\n" for s, _ in pairs))
    (directory / f"{split}.{tgt}").write_text("".join(t + "\n" for _, t in pairs))


def lines(path):
    """The lines of a UTF-8 text file."""
    return Path(path).read_text(encoding="utf-8").splitlines()


def pytest_configure(config):
    """Under pytest-xdist (one worker per core, ``make test``), each worker computes with one torch thread: the
    tests' tensors are tiny, and two threads per worker on as many cores only wait for each other (the fairseq
    processes that tests start get ``OMP_NUM_THREADS=1`` from :func:`run_cli` for the same reason)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _clean_env(request, monkeypatch):
    """Unset the environment variables that the test module names in ``ENV_KEYS``, if it has one."""
    for key in getattr(request.module, "ENV_KEYS", ()):
        monkeypatch.delenv(key, raising=False)


def fake_prepared(data_bin, dataset, **meta):
    """``data_bin/dataset/prepare.json`` (en→de, joined dictionary, plus ``meta``) and nothing else: all that
    :func:`diverse_fairseq.runs.plan.plan` reads. Returns ``data_bin``."""
    d = Path(data_bin) / dataset
    d.mkdir(parents=True, exist_ok=True)
    (d / "prepare.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de", "joined_dictionary": True,
                                                **meta}))
    return Path(data_bin)


def linked_prepared(data, data_bin, dataset="toy"):
    """``data_bin/dataset``: the files of the binarized ``data`` linked, with :func:`fake_prepared`'s prepare.json
    (what a table job's plan reads); ``data`` itself (a session fixture's) is left as it is. Returns ``data_bin``."""
    (Path(data_bin) / dataset).mkdir(parents=True)
    for path in Path(data).iterdir():
        (Path(data_bin) / dataset / path.name).symlink_to(path)
    return fake_prepared(data_bin, dataset)


def run_cli(module, args, timeout=600, env=None, check=True):
    """Run ``python -m fairseq_cli.<module> args`` and return the CompletedProcess (output captured)."""
    args = [str(a) for a in args]
    if module == "train" and "--data-buffer-size" not in args:
        # fairseq prefetches batches in a daemon thread (data/iterators.py, BackgroundConsumer); when a short run
        # ends while that thread is inside torch, the interpreter's exit can abort the process ("terminate called
        # without an active exception", exit -6): seen once in a fixture's one-update run under pytest-xdist
        args += ["--data-buffer-size", "0"]
    cmd = [sys.executable, "-m", f"fairseq_cli.{module}", *args]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    full_env.update(env or {})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed with exit code {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


@pytest.fixture(scope="session")
def tiny_raw(tmp_path_factory):
    """Plain-text toy parallel corpus (en→de): train 600, valid 60, test 40 sentences."""
    raw = tmp_path_factory.mktemp("tiny_raw")
    write_parallel(raw, "train", _make_pairs(600, 1))
    write_parallel(raw, "valid", _make_pairs(60, 2))
    write_parallel(raw, "test", _make_pairs(40, 3))
    return raw


@pytest.fixture(scope="session")
def tiny_data(tiny_raw, tmp_path_factory):
    """The toy corpus binarized by ``fairseq-preprocess`` with a joined dictionary (its ``main``, called in this
    process as the data preparation calls it: a new process would first import torch and fairseq)."""
    from fairseq import options
    from fairseq_cli import preprocess

    dest = tmp_path_factory.mktemp("tiny_bin")
    argv = ["--source-lang", "en", "--target-lang", "de", "--trainpref", tiny_raw / "train",
            "--validpref", tiny_raw / "valid", "--testpref", tiny_raw / "test", "--destdir", dest,
            "--joined-dictionary", "--workers", "1"]
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        preprocess.main(options.get_preprocessing_parser().parse_args([str(a) for a in argv]))
    finally:
        for handler in root.handlers[:]:  # preprocess.main adds a log file handler per call
            if handler not in before:
                root.removeHandler(handler)
                handler.close()
    return dest


def demo_text_env(root) -> dict:
    """The environment of ``scripts/prepare_data.sh demo`` (and of the table runner's own data check) for the
    fixtures' small demo corpus (tests/fixtures/demo_text, 100 sentencepiece pieces), prepared under ``root``."""
    root = Path(root)
    env = dict(os.environ, DATA_BIN=str(root / "data-bin"), WORK_DIR=str(root / "work"),
               DEMO_DIR=str(REPO / "tests" / "fixtures" / "demo_text"), BPE_SIZE="100")
    env.pop("BPE", None)
    return env


@pytest.fixture(scope="session")
def demo_text_prepared(tmp_path_factory, worker_id):
    """A folder holding ``data-bin/demo`` and ``work/`` made by ``scripts/prepare_data.sh demo`` with
    :func:`demo_text_env`, once per session across xdist's workers (:func:`once_per_session`): test_tables' runner
    finds it up to date, test_user_workflow and test_training_eval train from it; its output is in
    ``prepare_data.log``. Tests write beside it, each under names of its own (``results*/``, ``checkpoints/``), never
    into it."""
    return once_per_session(tmp_path_factory, worker_id, "demo_text", _prepare_demo_text)


def _prepare_demo_text(root: Path) -> None:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "prepare_data.sh"), "demo"], env=demo_text_env(root),
                          check=True, capture_output=True, text=True, timeout=600)
    (root / "prepare_data.log").write_text(proc.stdout)


def ctrl_c_as_in_a_terminal():
    """``preexec_fn`` of a child process that a test interrupts with SIGINT: SIGINT's default action, as in a
    terminal. A shell starts its background commands with SIGINT ignored, and an ignored signal stays ignored in the
    children (Python then installs no KeyboardInterrupt handler): ``pytest ... &`` would otherwise fail those tests."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def once_per_session(tmp_path_factory, worker_id: str, name: str, make) -> Path:
    """The folder ``name`` made by ``make(folder)`` once per test session, also across pytest-xdist's workers: the
    first worker to ask makes it under the session's base folder while holding a lock, the others wait for it and
    find it made (a worker whose ``make`` failed leaves it unmade: the next one starts afresh in an empty folder).
    Without xdist (``worker_id`` "master"): a folder of this session."""
    if worker_id == "master":
        folder = tmp_path_factory.mktemp(name)
        make(folder)
        return folder
    from filelock import FileLock  # (torch's dependency)

    folder = tmp_path_factory.getbasetemp().parent / name
    with FileLock(str(folder) + ".lock"):
        if not (folder / ".made").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / ".made").touch()
    return folder


@pytest.fixture(scope="session")
def tiny_table_local(demo_text_prepared, tmp_path_factory, worker_id):
    """test_tables' tiny two-row table (``TABLE``, ``TINY`` settings, seeds 1 and 2, two jobs at a time) run once per
    session (across xdist's workers too) by the local runner, a command line of its own, on ``demo_text_prepared``,
    into its ``results/``: test_tables' end-to-end test reads its output, test_slurm compares a run on the cluster
    with its records. Returns ``stdout``, ``table`` (the YAML), ``records`` and ``hypotheses`` by ``(row, seed)``, as
    they were when the run ended (``tiny_table.json``: the end-to-end test then changes a row and runs the table
    again in the same folder)."""
    from types import SimpleNamespace

    from test_tables import TABLE, _run_table

    root, pairs = demo_text_prepared, [(row, seed) for row in ("base", "dis") for seed in (1, 2)]

    def make(_) -> None:
        (root / "tiny_table.yaml").write_text(TABLE)
        stdout = _run_table(root, root / "tiny_table.yaml")
        runs = root / "results" / "demo-demo" / "runs"
        (root / "tiny_table.json").write_text(json.dumps({"stdout": stdout, "runs": {
            f"{r}/{s}": {"record": json.loads((runs / r / f"seed{s}" / "job.json").read_text()),
                         "hypotheses": (runs / r / f"seed{s}" / "eval" / "hyp.detok.de").read_text()}
            for r, s in pairs}}))

    once_per_session(tmp_path_factory, worker_id, "tiny_table", make)
    made = json.loads((root / "tiny_table.json").read_text())
    return SimpleNamespace(stdout=made["stdout"], table=root / "tiny_table.yaml",
                           records={(r, s): made["runs"][f"{r}/{s}"]["record"] for r, s in pairs},
                           hypotheses={(r, s): made["runs"][f"{r}/{s}"]["hypotheses"] for r, s in pairs})


@pytest.fixture(scope="session")
def slurm_cluster():
    """The one-node SLURM cluster of ``scripts/slurm_cluster.sh`` on this machine, started when it is not running
    (as root the script installs the packages it needs; ``.ci/run`` starts it before the tests). Where it cannot be
    started (not root, no package), the tests that submit to it skip with the script's one line; with
    ``REQUIRE_SLURM=1`` (``.ci/run``: CI must run them) they fail instead."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "slurm_cluster.sh"), "start"], capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        why = "no SLURM cluster: " + (proc.stderr.strip().splitlines() or ["scripts/slurm_cluster.sh start failed"])[-1]
        if os.environ.get("REQUIRE_SLURM") == "1":
            pytest.fail(why + " (REQUIRE_SLURM=1)")
        pytest.skip(why)
    return proc.stdout.strip()


CUSTOM_CORPUS = REPO / "tests" / "fixtures" / "custom_corpus"
# the variables of scripts/prepare_data.sh, train.sh and evaluate.sh that would change a run on the custom corpus
_CUSTOM_SCRIPT_KEYS = ("BPE", "DATASET_NAME", "SEPARATE_VOCAB", "PROGRESS_INTERVAL", "STOP_AFTER", "GPUS", "SAVE_DIR",
                       "NNODES", "MAX_TOKENS", "UPDATE_FREQ", "PRECISION", "AVERAGE", "OUT", "SUBSET", "SLURM_NNODES")


def custom_script_env(root) -> dict:
    """The environment of ``scripts/*.sh`` (and of the tools they call) for tests/fixtures/custom_corpus
    (subword-nmt, BPE size 200, one worker), in ``root``, with nothing of the caller's that would change the run."""
    root = Path(root)
    env = dict(os.environ, SRC="en", TGT="de", CORPUS_DIR=str(CUSTOM_CORPUS), BPE_SIZE="200", WORKERS="1",
               DATA_BIN=str(root / "data-bin"), WORK_DIR=str(root / "work"), CHECKPOINTS=str(root / "checkpoints"),
               MAX_UPDATE="3", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    for key in _CUSTOM_SCRIPT_KEYS:
        env.pop(key, None)
    return env


@pytest.fixture(scope="session")
def custom_prepared(tmp_path_factory, worker_id):
    """``(root, output)``: ``scripts/prepare_data.sh custom`` run on tests/fixtures/custom_corpus with
    :func:`custom_script_env` (``root/data-bin/custom_en_de``), once per session across xdist's workers
    (:func:`once_per_session`; its output in ``root/prepare_data.log``): test_custom_data checks and trains on it,
    test_interactive_command and ``custom_model`` train from it. Tests write beside it (``checkpoints/``), never into
    it."""

    def make(root: Path) -> None:
        proc = subprocess.run(["bash", str(REPO / "scripts" / "prepare_data.sh"), "custom"],
                              env=custom_script_env(root), capture_output=True, text=True, timeout=600, cwd=REPO)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        (root / "prepare_data.log").write_text(proc.stdout)

    root = once_per_session(tmp_path_factory, worker_id, "custom", make)
    return root, (root / "prepare_data.log").read_text()


def one_update_model(data, save_dir):
    """``save_dir/checkpoint_last.pt``: a 16-wide one-layer Transformer trained one update on ``data`` (en→de,
    joined dictionary) by fairseq-train's ``main``, in this process (a new process would first import torch and
    fairseq; test_custom_data runs the command line)."""
    from fairseq_in_process import fairseq_train

    fairseq_train([data, "--user-dir", USER_DIR, "--cpu", "--task", "translation", "--source-lang", "en",
                      "--target-lang", "de", "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1",
                      "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "16",
                      "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2", "--decoder-attention-heads",
                      "2", "--share-all-embeddings", "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "1000",
                      "--max-update", "1", "--save-dir", save_dir, "--no-epoch-checkpoints", "--num-workers", "0",
                      "--criterion", "cross_entropy"])
    return Path(save_dir) / "checkpoint_last.pt"


@pytest.fixture(scope="session")
def custom_model(custom_prepared, tmp_path_factory, worker_id):
    """(dataset folder, checkpoint): :func:`one_update_model` on ``custom_prepared``'s ``custom_en_de``, once per
    session across xdist's workers (test_interactive_command and test_checkpoint_file only read it)."""
    data = custom_prepared[0] / "data-bin" / "custom_en_de"
    run = once_per_session(tmp_path_factory, worker_id, "custom_model", lambda folder: one_update_model(data, folder))
    return data, run / "checkpoint_last.pt"


GLOO_FLAGS = ["--distributed-world-size", "2", "--distributed-backend", "gloo", "--distributed-no-spawn",
              "--ddp-backend", "legacy_ddp"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_gloo_ranks(rank_args, params_out=None, timeout=600):
    """Run two data-parallel fairseq-train processes (gloo, legacy_ddp) on this machine and return their
    outputs; fails the test if either exits non-zero (fairseq checks after every all-reduce that the
    workers' gradient norms agree). ``rank_args(rank, gloo_flags)`` gives one rank's fairseq-train
    arguments (append ``gloo_flags``). With ``params_out(rank)``, each rank runs through
    ``repulsive_rank_params.py``, which saves that rank's parameters there (and at ``.init`` when built)."""
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    procs = []
    for rank in range(2):
        flags = [*GLOO_FLAGS, "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-rank", str(rank)]
        args = list(map(str, rank_args(rank, flags)))
        if params_out is None:
            cmd = [sys.executable, "-m", "fairseq_cli.train", *args]
        else:
            script = REPO / "tests" / "methods" / "repulsive" / "repulsive_rank_params.py"
            cmd = [sys.executable, str(script), str(params_out(rank)), *args]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-6000:]
    return outputs


def tiny_train_args(data, save_dir, arch="transformer", max_update=20, extra=()):
    """fairseq-train arguments for a very small Transformer on ``data`` (CPU, fp32)."""
    return [
        data, "--user-dir", USER_DIR, "--cpu", "--task", "translation",
        "--source-lang", "en", "--target-lang", "de",
        "--arch", arch,
        "--encoder-layers", "2", "--decoder-layers", "2",
        "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
        "--share-all-embeddings", "--dropout", "0.0",
        "--optimizer", "adam", "--lr", "0.005", "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", "10", "--max-tokens", "1000", "--max-update", max_update,
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--save-dir", save_dir, "--no-epoch-checkpoints", "--log-format", "simple",
        "--log-interval", "1", "--seed", "1", "--num-workers", "0", *extra,
    ]


@pytest.fixture
def tiny_args():
    return tiny_train_args


@pytest.fixture(scope="session")
def tiny_checkpoints(tiny_data, tmp_path_factory):
    """``{"transformer": path, "diverse_transformer": path}``: tiny models trained 8 updates on ``tiny_data`` by
    fairseq-train's ``main`` in this process, once per session (test_analysis and test_probing only read them)."""
    from fairseq_in_process import fairseq_train

    root = tmp_path_factory.mktemp("analysis_ckpt")
    ckpts = {}
    for arch in ("transformer", "diverse_transformer"):
        fairseq_train(tiny_train_args(tiny_data, root / arch, arch=arch, max_update=8))
        ckpts[arch] = root / arch / "checkpoint_last.pt"
    return ckpts


def job_record(seed=1, bleu=0.0, eval=None, reused=False, disagreement=None, probing=None, **train):
    """A per-seed :class:`~diverse_fairseq.tables.records.JobRecord` for tests of its readers (report, progress):
    ``train`` overrides fields of its TrainRecord, ``eval`` of its test set's EvalRecord."""
    from diverse_fairseq.tables.records import EvalRecord, JobRecord, TrainRecord

    fields = dict(row="r", seed=seed, arch="transformer", setting="tiny", train_args=[], key={}, threads=1,
                  trained_at="2024-01-01 00:00:00", checkpoint="checkpoint_last.pt", args=[], averaged_checkpoints=0,
                  best_checkpoint_metric=None, embeddings="all", parameters=None, updates=0,
                  train_steps_per_second=None, train_loss=None, valid_loss=None, valid_nll_loss=None)
    evaluation = EvalRecord(**dict(dict(
        checkpoint="checkpoint_last.pt", dataset="demo", data="", subset="test", out="", target_lang="de",
        sentences=0, beam=4, lenpen=0.6, max_len_a=0.0, max_len_b=200, length_penalty="fairseq", batch_size=128,
        device="cpu", reference="", bleu=bleu, bleu_detail="", signature="", tok_bleu=bleu, tok_bleu_detail="",
        tok_bleu_kind="tokenized"), **(eval or {})))
    return JobRecord(train=TrainRecord(**dict(fields, **train)), evals={"test": evaluation}, reused=reused,
                     disagreement=disagreement, probing=probing)


def with_train(record, **changes):
    """``record`` with ``changes`` to its TrainRecord."""
    from dataclasses import replace

    return replace(record, train=replace(record.train, **changes))
