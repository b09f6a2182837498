"""Binarize a segmented parallel corpus with fairseq-preprocess (``fairseq_cli.preprocess``, in-process)."""

import logging
import shutil
from pathlib import Path

from .progress import heartbeat


def preprocess_args(src: str, tgt: str, trainpref, validpref, testpref, destdir, joined_dictionary: bool,
                    workers: int):
    """The fairseq-preprocess command line for this corpus."""
    args = [
        "--source-lang", src, "--target-lang", tgt,
        "--trainpref", str(trainpref), "--validpref", str(validpref), "--testpref", str(testpref),
        "--destdir", str(destdir), "--workers", str(workers),
    ]
    return args + (["--joined-dictionary"] if joined_dictionary else [])


def binarize(src: str, tgt: str, trainpref: Path, validpref: Path, testpref: Path, destdir: Path,
             joined_dictionary: bool, workers: int = 2, log=print) -> Path:
    """Run fairseq-preprocess into ``destdir.binarizing`` and return that directory.

    The caller adds its own files there and renames it to ``destdir``, so ``destdir`` only ever holds
    a complete dataset. fairseq runs in this process (it is already imported by then; a subprocess
    would pay for importing torch and fairseq again).
    """
    from fairseq import options
    from fairseq_cli import preprocess

    destdir = Path(destdir)
    tmp = destdir.with_name(destdir.name + ".binarizing")
    if tmp.exists():
        shutil.rmtree(tmp)
    argv = preprocess_args(src, tgt, trainpref, validpref, testpref, tmp, joined_dictionary, workers)
    log("  fairseq-preprocess " + " ".join(argv))
    args = options.get_preprocessing_parser().parse_args(argv)
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        with heartbeat("fairseq-preprocess", log=log):
            preprocess.main(args)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        for handler in root.handlers[:]:  # preprocess.main adds a log file handler per call
            if handler not in before:
                root.removeHandler(handler)
                handler.close()
    return tmp
