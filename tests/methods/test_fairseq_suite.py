"""fairseq's own tests with this project's classes swapped in for fairseq's (and no method on).

The sdist of the installed fairseq-fixed carries fairseq's ``tests/`` (without the ``tests/utils.py`` that most of
them import). It is downloaded at test time with pip into a cache directory (``$DIVERSE_FAIRSEQ_CACHE``, default
``~/.cache/diverse-fairseq``) and reused from there; nothing of it is kept in this repository. The self-contained
files, ``test_export.py`` (TorchScript export of the attention and of the Transformer) and
``test_multihead_attention.py``, run in a pytest subprocess with the plugin ``tests/methods/fairseq_swap.py``,
which swaps our classes in and records every attention, layer, encoder and decoder built. The properties of
fairseq's other tests (generation, inference dropout, checkpoints) are checked against stock fairseq in
test_fairseq_compat.py.
"""

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIST = "fairseq-fixed"
SUITE = ("test_export.py", "test_multihead_attention.py")
#: pip's words for an index it could not reach (then the test is skipped, not failed)
UNREACHABLE = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
               "Network is unreachable", "Name or service not known", "ConnectTimeout", "ReadTimeoutError")
OURS = {"DiverseMultiheadAttention", "DiverseTransformerEncoderLayer", "DiverseTransformerDecoderLayer",
        "DiverseTransformerEncoder", "DiverseTransformerDecoder"}


def cache_dir() -> Path:
    return Path(os.environ.get("DIVERSE_FAIRSEQ_CACHE") or Path.home() / ".cache" / "diverse-fairseq")


def fairseq_sdist() -> Path:
    """The sdist of the installed fairseq-fixed, from the cache or downloaded into it with pip."""
    version = importlib.metadata.version(DIST)
    directory = cache_dir() / "sdist"
    name = f"{DIST.replace('-', '_')}-{version}.tar.gz"
    if (directory / name).is_file():
        return directory / name
    directory.mkdir(parents=True, exist_ok=True)
    # --no-build-isolation: pip prepares the sdist's metadata with the torch installed here, not a downloaded one
    cmd = [sys.executable, "-m", "pip", "download", f"{DIST}=={version}", "--no-deps", "--no-binary", DIST,
           "--no-build-isolation", "--disable-pip-version-check", "-d", str(directory)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not (directory / name).is_file():
        output = done.stdout + done.stderr
        if any(marker in output for marker in UNREACHABLE):
            pytest.skip(f"the package index cannot be reached to download the {DIST} {version} sdist "
                        f"({' '.join(cmd)})")
        raise AssertionError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{output[-3000:]}")
    return directory / name


def extract_tests(sdist: Path, target: Path) -> Path:
    """fairseq's test files ``SUITE`` from ``sdist`` into ``target/tests``."""
    tests = target / "tests"
    tests.mkdir(parents=True)
    with tarfile.open(sdist) as archive:
        members = {Path(m.name).name: m for m in archive.getmembers() if Path(m.name).parent.name == "tests"
                   and Path(m.name).parent.parent.parent == Path(".")}
        for name in SUITE:
            if name not in members:
                raise AssertionError(f"{sdist.name} has no tests/{name}")
            (tests / name).write_bytes(archive.extractfile(members[name]).read())
    return tests


def test_fairseqs_export_and_attention_tests_pass_with_our_classes(tmp_path):
    tests = extract_tests(fairseq_sdist(), tmp_path / "suite")
    record = tmp_path / "built.json"
    # the xformers parity tests need the xformers package; without it they fail on stock fairseq as well
    deselect = [] if importlib.util.find_spec("xformers") else ["-k", "not xformers"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "methods"), str(REPO)]),
           "FAIRSEQ_SWAP_RECORD": str(record)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "fairseq_swap", "-p", "no:cacheprovider",
                           "--rootdir", str(tests.parent), *deselect, *[str(tests / n) for n in SUITE]],
                          cwd=tests.parent, env=env, capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    summary = done.stdout.strip().splitlines()[-1]  # pytest's summary line (plugins may warn on stderr after it)
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    assert int(summary.split(" passed")[0].split()[-1]) >= 9, summary  # 5 export + 4 attention tests on stock
    built = json.loads(record.read_text())
    assert OURS <= set(built), f"our classes were not all built: {built}"
    assert set(built) <= OURS, f"stock classes were built despite the swap: {built}"
