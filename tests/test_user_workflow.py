"""What a fairseq user does with the installed package, outside the repository, as docs/usage.md describes it:

* ``--user-dir "$(python -m diverse_fairseq.user_dir)"`` from any directory;
* ``fairseq-train ... --log-format json --tensorboard-logdir``: the table runner's log reader gets its numbers
  from the JSON records, and tensorboard event files are written;
* translating with a trained checkpoint, a stock ``transformer`` and a ``diverse_transformer`` with
  routing-by-agreement: ``fairseq-interactive`` with the data's sentencepiece model, and the hub interface
  (``from_pretrained(...).translate(...)``).

The models are trained for 3 updates (the routing one by the ``fairseq-train`` console script, the stock one by its
``main`` in process, on the same arguments) on the test fixture's small demo corpus (segmented with sentencepiece
as ``make data DATASET=demo`` does); the checks are about the plumbing, not the translation quality.
"""

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import once_per_session
from fairseq_in_process import fairseq_interactive, fairseq_train

REPO = Path(__file__).resolve().parents[1]
SENTENCES = ["Cannot open file %s", "Show hidden files"]
MODELS = {
    "baseline": ["--arch", "transformer"],
    # EM routing in the encoder's self-attention and the decoder's (incremental decoding through routing)
    "routing": ["--arch", "diverse_transformer", "--routing-type", "em", "--routing-encoder-layers", "0",
                "--routing-decoder-layers", "0"],
}
TINY = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
        "--decoder-attention-heads", "4", "--share-all-embeddings", "--optimizer", "adam", "--lr", "0.005",
        "--max-tokens", "200", "--max-update", "3", "--criterion", "label_smoothed_cross_entropy",
        "--no-epoch-checkpoints", "--num-workers", "0", "--cpu", "--seed", "1", "--log-interval", "1"]


def _env():
    # PYTHONPATH: this checkout's package, as `pip install` would provide it, whatever the working directory
    return dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def _tool(name: str):
    """A fairseq console script of this environment (``fairseq-train``, ...), as docs/usage.md runs it."""
    script = Path(sys.executable).parent / name
    return [str(script)] if script.exists() else [sys.executable, "-m", "fairseq_cli." + name.split("-")[1]]


def _run(cmd, cwd, stdin=None, timeout=600):
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), input=stdin, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def user_dir_printed(tmp_path_factory):
    """The output of ``python -m diverse_fairseq.user_dir`` run in a directory outside the repository."""
    return _run([sys.executable, "-m", "diverse_fairseq.user_dir"], cwd=tmp_path_factory.mktemp("elsewhere")).stdout


@pytest.fixture(scope="module")
def workdir(demo_text_prepared, user_dir_printed, tmp_path_factory, worker_id):
    """A directory outside the repository with data-bin/demo (the fixture corpus, sentencepiece-segmented: the
    session's ``demo_text_prepared``) and checkpoints/<model>/ trained from there with the package's user dir
    (as ``python -m diverse_fairseq.user_dir`` prints it), JSON logs and tensorboard; trained once per session, also
    when xdist's workers share this module's tests."""
    root = demo_text_prepared
    user_dir = user_dir_printed.strip()

    def train(_):
        for name, args in MODELS.items():
            save = root / "checkpoints" / name
            save.mkdir(parents=True)  # --log-file is opened before fairseq makes --save-dir
            train_args = [*args, *TINY, "--save-dir", str(save), "--log-format", "json",
                          "--log-file", str(save / "train.log")]
            if name == "routing":  # the console script, from the directory outside the repository, with tensorboard
                _run(_tool("fairseq-train") + ["data-bin/demo", "--user-dir", user_dir, *train_args,
                                               "--tensorboard-logdir", str(save / "tensorboard")], cwd=root)
            else:  # fairseq-train's main in this process, on the same arguments (a new process would import fairseq)
                fairseq_train([root / "data-bin" / "demo", "--user-dir", user_dir, *train_args])

    once_per_session(tmp_path_factory, worker_id, "user_workflow", train)
    return root


def test_user_dir_helper_prints_a_directory_fairseq_imports(user_dir_printed, tmp_path):
    out = user_dir_printed
    assert out == str(REPO / "diverse_fairseq") + "\n"
    # one process: the repository-relative form first, then the helper's directory; fairseq's own argument
    # parsing imports the plugin (not imported before)
    code = ("import sys; from fairseq import options; p = options.get_training_parser(); "
            "args = lambda d: ['x', '--user-dir', d, '--arch', 'diverse_transformer', '--routing-encoder-layers', "
            "'all']\n"
            "try:\n    options.parse_args_and_arch(p, args('diverse_fairseq'))\n"
            "except FileNotFoundError as e:\n    print('relative:', type(e).__name__)\n"
            "else:\n    print('relative: imported')\n"
            "print('imported before:', 'diverse_fairseq' in sys.modules)\n"
            "a = options.parse_args_and_arch(p, args(sys.argv[1])); print('imported after:', 'diverse_fairseq' in "
            "sys.modules); print(a.arch, a.routing_encoder_layers)")
    shown = _run([sys.executable, "-c", code, out.strip()], cwd=tmp_path).stdout.splitlines()
    assert shown[-1].split() == ["diverse_transformer", "all"]
    assert "imported before: False" in shown and "imported after: True" in shown, shown
    # the repository-relative form does not work from another directory: the reason for the helper
    assert "relative: FileNotFoundError" in shown, shown


@pytest.mark.slow
def test_json_training_log_gives_the_runners_numbers(workdir):
    from diverse_fairseq.tables import progress as logs

    log = (workdir / "checkpoints" / "routing" / "train.log").read_text()  # written by the console script
    assert '"train_num_updates": "3"' in log  # fairseq's JSON records, not text lines
    train, valid = logs.last_summary(log, "train"), logs.last_summary(log, "valid")
    assert train["num_updates"] == 3 and train["loss"] > 0 and train["ups"] > 0
    assert valid["loss"] > 0 and valid["num_updates"] == 3
    assert logs.model_parameters(log) > 0  # equal to the loaded model's: test_hub_interface_translates


def _scalars(event_file: Path):
    """{tag: [steps]} of the scalar summaries in a TFRecord event file (tensorboardX's protobuf classes)."""
    from tensorboardX.proto import event_pb2

    data, out, pos = event_file.read_bytes(), {}, 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
        pos += 12 + length + 4
        for value in event.summary.value:
            out.setdefault(value.tag, []).append(event.step)
    return out


@pytest.mark.slow
def test_tensorboard_logdir_writes_events(workdir):
    pytest.importorskip("tensorboardX", reason="the optional extra: pip install -e '.[tensorboard]'")
    board = workdir / "checkpoints" / "routing" / "tensorboard"
    train = _scalars(next((board / "train").glob("events.out.tfevents.*")))
    inner = _scalars(next((board / "train_inner").glob("events.out.tfevents.*")))
    valid = _scalars(next((board / "valid").glob("events.out.tfevents.*")))
    assert train["loss"] == [3] and inner["loss"] == [1, 2, 3] and valid["loss"] == [3]


@pytest.mark.slow
@pytest.mark.parametrize("model", list(MODELS))
def test_fairseq_interactive_translates(workdir, model, tmp_path):
    args = ["--user-dir", str(REPO / "diverse_fairseq"), "--source-lang", "en", "--target-lang", "de",
            "--bpe", "sentencepiece", "--beam", "2", "--max-len-b", "20", "--cpu"]
    if model == "routing":  # the console script, input on stdin (incremental decoding through routing)
        out = _run(_tool("fairseq-interactive") + [
            "data-bin/demo", *args, "--path", f"checkpoints/{model}/checkpoint_last.pt",
            "--sentencepiece-model", "data-bin/demo/spm.model"],
            cwd=workdir, stdin="\n".join(SENTENCES) + "\n").stdout
    else:  # fairseq-interactive's main in this process, the same input from a file
        (tmp_path / "input.txt").write_text("\n".join(SENTENCES) + "\n")
        out = fairseq_interactive([workdir / "data-bin" / "demo", *args,
                                   "--path", workdir / "checkpoints" / model / "checkpoint_last.pt",
                                   "--sentencepiece-model", workdir / "data-bin" / "demo" / "spm.model",
                                   "--input", tmp_path / "input.txt"])
    lines = out.splitlines()
    sources = [line.split("\t")[1] for line in lines if line.startswith("S-")]
    detok = [line.split("\t") for line in lines if line.startswith("D-")]
    assert len(sources) == 2 and all("▁" in s for s in sources)  # the input went through sentencepiece
    assert [d[0] for d in detok] == ["D-0", "D-1"] and all(d[2].strip() and "▁" not in d[2] for d in detok), lines


@pytest.mark.slow
@pytest.mark.parametrize("model", list(MODELS))
def test_hub_interface_translates(workdir, model):
    from fairseq.models.transformer import TransformerModel

    import diverse_fairseq  # noqa: F401  (registers diverse_transformer; allowlists checkpoint classes)
    from diverse_fairseq.methods.transformer import DiverseTransformerModel

    cls = DiverseTransformerModel if model == "routing" else TransformerModel
    hub = cls.from_pretrained(str(workdir / "checkpoints" / model), checkpoint_file="checkpoint_last.pt",
                              data_name_or_path=str(workdir / "data-bin" / "demo"), bpe="sentencepiece",
                              sentencepiece_model=str(workdir / "data-bin" / "demo" / "spm.model"),
                              source_lang="en", target_lang="de")
    hub.eval()
    out = hub.translate(SENTENCES, beam=2, max_len_b=20)
    assert len(out) == 2 and all(isinstance(s, str) and s.strip() and "▁" not in s for s in out), out
    assert hub.translate(SENTENCES[0], beam=2, max_len_b=20) == out[0]
    net = hub.models[0]
    assert type(net) is cls
    from diverse_fairseq.tables import progress as logs

    log = (workdir / "checkpoints" / model / "train.log").read_text()
    assert sum(p.numel() for p in net.parameters()) == logs.model_parameters(log)
    routed = [m for m in net.modules() if getattr(m, "aggregator", None) is not None]
    assert len(routed) == (2 if model == "routing" else 0)
    if model == "routing":  # stock TransformerModel.from_pretrained builds the checkpoint's own architecture
        again = TransformerModel.from_pretrained(str(workdir / "checkpoints" / model), "checkpoint_last.pt",
                                                 str(workdir / "data-bin" / "demo"), bpe="sentencepiece",
                                                 sentencepiece_model=str(workdir / "data-bin" / "demo" / "spm.model"))
        assert type(again.models[0]) is DiverseTransformerModel
        assert again.eval().translate(SENTENCES[0], beam=2, max_len_b=20) == out[0]
