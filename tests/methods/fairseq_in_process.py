"""fairseq-train, fairseq-generate, fairseq-interactive and fairseq-preprocess in the test's own process, their log
returned as text.

A fairseq subprocess pays ~6 s of CPU for importing torch and fairseq before it does anything; the methods' tests
whose subject is a method (not the command line, which the workflow's tests run as a subprocess) call the commands'
``main`` in process instead, on the same arguments. What a run changes in the process is put back afterwards: the
root logger's level, the handlers of every logger (a ``--log-file``'s), the random number generators, torch's thread
count (one, as the subprocesses of ``conftest.run_cli`` get), fairseq's metrics, the best validation score that
fairseq keeps between calls as function attributes and its tensorboard writers, as the product's own in-process
training puts them back (``diverse_fairseq.training.forget_fairseq_state``).
"""

import contextlib
import io
import logging
import random
import traceback

import numpy as np
import torch

#: the log format of fairseq_cli/train.py (``| train_inner |`` is what the tests' ``parse_log`` looks for)
LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"


class FairseqFailed(AssertionError):
    """A run that raised: ``text`` is its log followed by the traceback (what the subprocess would have printed)."""

    def __init__(self, command, args, text):
        super().__init__(f"fairseq-{command} {' '.join(args)} failed\n--- log ---\n{text[-6000:]}")
        self.text = text


@contextlib.contextmanager
def _isolated(log):
    """The product's own isolation of a fairseq ``main`` in process (``fairseq_main_logging``, with the root logger at
    INFO exactly, and ``forget_fairseq_state``), and the random number generators and torch's threads put back."""
    from diverse_fairseq.runs.cli_logging import fairseq_main_logging
    from diverse_fairseq.training import forget_fairseq_state

    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
    threads = torch.get_num_threads()
    states = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
    torch.set_num_threads(1)
    try:
        with fairseq_main_logging(handler):
            logging.getLogger().setLevel(logging.INFO)  # put back on exit
            forget_fairseq_state()  # imports fairseq_cli.train: after the handler above (see _run)
            yield
    finally:
        forget_fairseq_state()
        torch.set_num_threads(threads)
        torch.random.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])


def _run(command, args):
    args = [str(a) for a in args]
    log = io.StringIO()
    with _isolated(log):  # imported here: fairseq_cli's modules call logging.basicConfig when imported
        import fairseq_cli.generate
        import fairseq_cli.interactive
        import fairseq_cli.preprocess
        import fairseq_cli.train
        from fairseq import options
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf

        try:
            with contextlib.redirect_stdout(log):  # fairseq-generate prints its hypotheses
                if command == "train":
                    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(),
                                                                                     args))
                    fairseq_cli.train.main(cfg)
                elif command == "interactive":
                    fairseq_cli.interactive.main(options.parse_args_and_arch(
                        options.get_interactive_generation_parser(), args))
                elif command == "preprocess":
                    fairseq_cli.preprocess.main(options.get_preprocessing_parser().parse_args(args))
                else:
                    fairseq_cli.generate.main(options.parse_args_and_arch(options.get_generation_parser(), args))
        except (Exception, SystemExit):
            raise FairseqFailed(command, args, log.getvalue() + traceback.format_exc()) from None
    return log.getvalue()


def fairseq_train(args):
    """``fairseq-train args`` (with ``--data-buffer-size 0``, as ``conftest.run_cli`` adds) in this process; its
    log. Raises :class:`FairseqFailed` if it fails."""
    args = [str(a) for a in args]
    return _run("train", args if "--data-buffer-size" in args else [*args, "--data-buffer-size", "0"])


def fairseq_generate(args):
    """``fairseq-generate args`` in this process: its output (hypotheses and log). Raises :class:`FairseqFailed` if
    it fails."""
    return _run("generate", args)


def fairseq_interactive(args):
    """``fairseq-interactive args`` in this process, its input read from the file that ``--input`` names: its output
    (``S-``, ``H-``, ``D-`` lines and log). Raises :class:`FairseqFailed` if it fails."""
    args = [str(a) for a in args]
    if "--input" not in args:
        raise ValueError("fairseq_interactive reads its input from a file: add --input FILE to the arguments")
    return _run("interactive", args)


def fairseq_preprocess(args):
    """``fairseq-preprocess args`` in this process; its log. Raises :class:`FairseqFailed` if it fails."""
    return _run("preprocess", args)
