"""Read the numbers a table reports out of fairseq-train's own log lines (``--log-format simple``)."""

import re
from typing import Dict, Optional

_PARAMS = re.compile(r"num\. shared model params: ([\d,]+) \(num\. trained: ([\d,]+)\)")
_FIELD = re.compile(r"\| (\w+) ([-0-9.e+]+)")


def model_parameters(log: str) -> Optional[int]:
    """Trained parameters as fairseq prints them at start-up."""
    found = _PARAMS.findall(log)
    return int(found[-1][1].replace(",", "")) if found else None


def last_summary(log: str, subset: str) -> Dict[str, float]:
    """The last end-of-epoch summary of ``subset`` (``train`` or ``valid``) as a name → number dict.

    Accepts both fairseq's console lines (``... | train | epoch 001 | loss ...``) and its ``--log-file`` lines
    (``epoch 001 | loss ...`` for training, ``epoch 001 | valid on 'valid' subset | loss ...``).
    """
    def is_summary(line):
        if not re.search(r"(^|\| )epoch \d+ \|", line) or "| loss " not in line or "train_inner" in line:
            return False
        is_valid = "valid on '" in line or "| valid |" in line
        return is_valid if subset == "valid" else not is_valid

    lines = [line for line in log.splitlines() if is_summary(line)]
    if not lines:
        return {}
    return {k: float(v) for k, v in _FIELD.findall(lines[-1])}
