"""Read the numbers a table reports out of fairseq-train's ``--log-format json`` output.

With ``--log-format json`` fairseq writes each progress record as one JSON object per line: the periodic
``train_inner`` records (``{"epoch": 1, "update": 0.5, "loss": "7.7", ...}``) and the end-of-epoch summaries,
whose keys carry the subset's name (``{"epoch": 1, "train_loss": "7.715", "train_num_updates": "3", ...}``,
``{"epoch": 1, "valid_loss": ...}``). In a ``--log-file`` a line is the JSON object alone; on the console it
follows fairseq's ``date | INFO | train | `` prefix. Both are read. The parameter count is not a progress
record: it is fairseq_cli.train's start-up line ``num. shared model params: ... (num. trained: ...)``.

Text logs of ``--log-format simple`` are not read: the runner keeps every finished run's numbers in its
``train.json`` and never parses an old log again, and a resumed run is finished by a process that writes JSON.
"""

import json
import re
from typing import Dict, Iterator, Optional

_PARAMS = re.compile(r"num\. shared model params: ([\d,]+) \(num\. trained: ([\d,]+)\)")


def model_parameters(log: str) -> Optional[int]:
    """Trained parameters as fairseq prints them at start-up (the last start-up of the log)."""
    found = _PARAMS.findall(log)
    return int(found[-1][1].replace(",", "")) if found else None


def records(log: str) -> Iterator[Dict]:
    """Every JSON object that a line of ``log`` holds, after an optional fairseq logging prefix."""
    for line in log.splitlines():
        start = line.find("{")
        if start < 0 or not line.rstrip().endswith("}"):
            continue
        try:
            record = json.loads(line[start:])
        except ValueError:
            continue  # a line that only looks like JSON (fairseq's start-up configuration dump is a Python dict)
        if isinstance(record, dict):
            yield record


def number(value) -> Optional[float]:
    """``value`` as a float (fairseq's JSON logs hold numbers as strings), or None."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def last_summary(log: str, subset: str) -> Dict[str, float]:
    """The last end-of-epoch summary of ``subset`` (``train`` or ``valid``) as a name → number dict, with the
    subset prefix removed (``train_num_updates`` → ``num_updates``); {} if the log has none."""
    if subset not in ("train", "valid"):
        raise ValueError(f"subset={subset!r} is not valid: use 'train' or 'valid'")
    prefix = subset + "_"
    last = None
    for record in records(log):
        if prefix + "loss" in record:
            last = record
    if last is None:
        return {}
    out = {}
    for key, value in last.items():
        if key.startswith(prefix) and number(value) is not None:
            out[key[len(prefix):]] = number(value)
    return out
