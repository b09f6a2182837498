"""One options layer: every command's options are dataclass fields, as fairseq generates its parser from its
dataclasses. A field made by :func:`option` carries its environment variable, its help and the parser of its kind
of value (:mod:`.env_checks`); :func:`add_options` adds a dataclass's fields to an argparse parser (``--field-name``,
the help ending in ``[VARIABLE]``), and :func:`resolve` turns flag, else variable, else the field's default into a
checked, typed instance. A bad value raises SystemExit naming ``VAR (--flag)`` (``VAR`` alone for a command that
has no flag for it, such as ``scripts/train.sh``), the value and what to use, before any work starts.

Only a command's ``main()`` reads ``sys.argv`` and ``os.environ``; it hands them to :func:`resolve` and passes the
typed instance down. :func:`misspelled_variables` warns of a variable that is not one of ours but is spelled like
one (``TRAIN_ARG`` for ``TRAIN_ARGS``): ours are every field's variable (:func:`our_variables`) and the documented
variables of the shell scripts and the Makefile (:data:`SCRIPT_VARIABLES`).
"""

import argparse
from dataclasses import MISSING, Field, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Set, Type, TypeVar

from . import env_checks

T = TypeVar("T")
#: a field's parser: ``parse(label, text) -> value``; ``label`` (``VAR (--flag)``) names the option in its error
Parse = Callable[[str, str], Any]


# ----------------------------------------------------------------------- one parser per kind of value
def text(label: str, value: str) -> str:
    return value


def path(label: str, value: str) -> Path:
    return Path(value)


def integer(minimum: int = 0, maximum: Optional[int] = None) -> Parse:
    """An integer in ``minimum .. maximum``."""
    return lambda label, value: env_checks.parse_int(label, value, minimum, maximum)


def number(minimum: Optional[float] = None) -> Parse:
    """A finite number (``>= minimum`` when given)."""
    return lambda label, value: env_checks.parse_float(label, value, minimum)


def choice(choices: Sequence[str]) -> Parse:
    """One of ``choices``, exactly."""
    return lambda label, value: env_checks.parse_choice(label, value, tuple(choices))


def word(on: str) -> Parse:
    """A switch whose variable is ``VAR=on`` (``CWMT=skip``): True; any other text is refused."""
    return lambda label, value: env_checks.parse_choice(label, value, (on,)) == on


switch = env_checks.parse_flag  # 1 (on) or 0 (off)
words = env_checks.parse_words  # flags in one variable, split as the shell would
seeds = env_checks.parse_seeds  # a count N (1..N) or a comma-separated list


# ------------------------------------------------------------------------------------ the field
def option(var: Optional[str], help: str, default: Any = None, parse: Parse = text, *, flag: Optional[str] = None,
           store_true: bool = False, metavar: Optional[str] = None, default_factory: Any = MISSING,
           **extra) -> Field:
    """A dataclass field that is an option: ``--field-name`` (or ``flag``) on a command line, else the environment
    variable ``var`` (None: none), else ``default``. ``parse(label, text)`` checks and converts the text of either.
    ``store_true``: a flag without a value (``--cpu``); its variable is still parsed (``CPU=1``). ``extra``: more
    metadata for the command's own use."""
    metadata = {"var": var, "help": help, "parse": parse, "flag": flag, "store_true": store_true,
                "metavar": metavar, **extra}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def gpus_option():
    """``GPUS``: one field for ``scripts/train.sh`` and the table runner. The launch that cannot see the GPUs of the
    machine that trains (a SLURM node) needs it given."""
    return option("GPUS", "GPUs per run (per node), the first N visible ones; 0: the CPU; unset: every GPU visible to "
                          "the process that trains (the CPU when it sees none)", None, integer(0))


def options_of(cls) -> List[Field]:
    """The fields of dataclass ``cls`` made by :func:`option`."""
    return [f for f in fields(cls) if "parse" in f.metadata]


def flag_of(f: Field) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def label(f: Field, flags: bool = True) -> str:
    """How an error names the option: ``VAR (--flag)``; ``VAR`` without ``flags``; ``--flag`` without a variable."""
    var = f.metadata["var"]
    if var is None:
        return flag_of(f)
    return f"{var} ({flag_of(f)})" if flags else var


def variables(cls) -> List[str]:
    """The environment variables of the options of ``cls``."""
    return [f.metadata["var"] for f in options_of(cls) if f.metadata["var"]]


def add_options(parser: argparse.ArgumentParser, *classes) -> argparse.ArgumentParser:
    """Add the options of each dataclass in ``classes`` to ``parser``; each parses to None where not given, so that
    :func:`resolve` can tell a flag given from its variable."""
    for cls in classes:
        for f in options_of(cls):
            var = f.metadata["var"]
            help = f.metadata["help"] + (f" [{var}]" if var else "")
            kind = {"action": "store_true"} if f.metadata["store_true"] else {"metavar": f.metadata["metavar"] or var}
            parser.add_argument(flag_of(f), dest=f.name, default=None, help=help, **kind)
    return parser


def _default(f: Field):
    return f.default_factory() if f.default_factory is not MISSING else f.default


def resolve(cls: Type[T], env: Mapping[str, str], args: Optional[argparse.Namespace] = None, **given) -> T:
    """An instance of ``cls``: the fields in ``given`` as given; every option from its flag in ``args`` (the
    :func:`add_options` parser's result; None: a command without flags), else its variable in ``env`` (unset or
    empty: not given), else the field's default; the flag's or variable's text checked by the field's parser
    (SystemExit naming ``VAR (--flag)``). An empty flag value (``--jobs ''``) is the field's default."""
    values = dict(given)
    for f in options_of(cls):
        if f.name in given:
            continue
        name, parse, var = label(f, flags=args is not None), f.metadata["parse"], f.metadata["var"]
        flagged = getattr(args, f.name, None) if args is not None else None
        if flagged is True and f.metadata["store_true"]:
            values[f.name] = True
        elif flagged is not None:
            values[f.name] = _default(f) if flagged == "" else parse(name, flagged)
        elif var and env_checks.get(env, var) is not None:
            values[f.name] = parse(name, env[var])
    return cls(**values)


# ------------------------------------------------------------------------ misspelled variables
#: variables read by the shell scripts and the Makefile (documented in their headers and ``make help``), besides
#: the fields' variables: scripts/*.sh (PYTHON; install.sh's VENV, TORCH_VERSION, TORCH_CPU_INDEX;
#: build_demo_corpus.sh's DEMO_*), the Makefile's own variables, scripts/experiments/kernel_probe.py's PROBE_EVERY
SCRIPT_VARIABLES = ("PYTHON", "VENV", "TORCH_VERSION", "TORCH_CPU_INDEX", "DEMO_PACKAGES", "DEMO_WORK", "DEMO_DEBS",
                    "DEMO_OUT", "PYTEST_ARGS", "SETTING", "ARGS", "CHECKPOINT", "INPUTS", "N", "OUTPUT", "REF",
                    "BASELINE", "SYSTEM", "PROBE_EVERY")
#: prefixes of variables that other programs set or read (SLURM inside a job and its input variables, CUDA, NCCL,
#: OpenMP, MKL, locales, Python, pytest, conda, MPI): never taken for a misspelling of ours
FOREIGN_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SACCT_", "CUDA_", "NCCL_", "NVIDIA_", "OMP_",
                    "MKL_", "KMP_", "LC_", "XDG_", "PYTHON", "PYTEST_", "CONDA", "OMPI_", "PMI_", "PMIX_", "TORCH",
                    "HF_", "SSH_", "GIT_", "MAKE")


def option_classes() -> list:
    """The dataclasses that hold every command's options (a test checks that no other class in the package
    declares an :func:`option`)."""
    from ..data.prepare import PrepareOptions
    from ..data.progress import ProgressOptions
    from ..data.senteval import DownloadOptions
    from ..evaluate import EvalRequest
    from ..probing import ProbingFiles
    from ..tables.check import CheckOptions
    from ..tables.options import TableOptions
    from ..tables.slurm import SlurmOptions
    from .paths import DataBin
    from .plan import TrainOptions, TrainRequest

    return [TrainOptions, TrainRequest, TableOptions, EvalRequest, DataBin, PrepareOptions, ProgressOptions,
            CheckOptions, DownloadOptions, ProbingFiles, SlurmOptions]


def our_variables() -> Set[str]:
    """Every environment variable of the project: the fields' (:func:`option_classes`) and :data:`SCRIPT_VARIABLES`."""
    return {v for cls in option_classes() for v in variables(cls)} | set(SCRIPT_VARIABLES)


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest insertions, deletions and substitutions that turn ``a`` into ``b``."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def resembles(name: str, ours: Iterable[str]) -> Optional[str]:
    """The variable of ``ours`` that ``name`` (not one of them) is probably a misspelling of, or None: compared in
    upper case, the same name in another case, or one at most one edit away from a name of 4 to 9 letters (two
    from 10 letters); names that other programs use (:data:`FOREIGN_PREFIXES`) never are. Short names need the
    exact letters: ``_`` (bash's) is one edit from ``N``, ``TERM`` two from ``BEAM``."""
    upper = name.upper()
    if name in ours or upper.startswith(FOREIGN_PREFIXES):
        return None
    allowed = {v: 0 if len(v) <= 3 else 1 if len(v) <= 9 else 2 for v in ours}
    close = sorted((d, v) for v in ours if abs(len(v) - len(upper)) <= allowed[v]
                   and (d := edit_distance(upper, v)) <= allowed[v])
    return close[0][1] if close else None


def misspelled_variables(env: Mapping[str, str], ours: Optional[Set[str]] = None,
                         foreign: Optional[Mapping[str, str]] = None) -> List[str]:
    """Warnings for the variables of ``env`` that look like misspellings of ours (they would be silently
    ignored), each naming the variable it resembles; where that one is another command's (``foreign``: {name: what
    to use instead}), also what to use instead."""
    ours, foreign = our_variables() if ours is None else ours, foreign or {}
    found = ((name, resembles(name, ours)) for name in sorted(env))
    return [f"{name}={env[name]!r} is not a variable of diverse-fairseq and is ignored: did you mean {like}?"
            + (f" ({like} is not read by this command either: use {foreign[like]})" if like in foreign else "")
            for name, like in found if like]


def warn_misspelled(env: Mapping[str, str], prefix: str, file=None, foreign: Optional[Mapping[str, str]] = None):
    """Print :func:`misspelled_variables`' warnings, each as ``[prefix] warning: ...`` (before any work), to
    ``file`` (default: stdout)."""
    for warning in misspelled_variables(env, foreign=foreign):
        print(f"[{prefix}] warning: {warning}", file=file, flush=True)
