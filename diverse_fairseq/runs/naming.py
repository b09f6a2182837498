"""Readable names of runs: the methods a run trains with (:func:`method_label`, from its final fairseq-train
arguments), which name its default save directory ``CHECKPOINTS/<DATASET>_<SETTING>-<methods>-<hash>``
(:func:`default_save_dir`; ``NAME`` replaces the methods) and label it in ``make significance``.
"""

import re
from pathlib import Path
from typing import Optional

from ..methods.disagreement.criterion import TERMS
from ..methods.options import parse_names
from ..methods.routing.options import ROUTING_DEFAULTS, ROUTING_PLACEMENTS
from .env_checks import bad

#: a NAME: a folder name's characters, as a dataset's name may have them
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
#: joins the methods of a run that combines several (disagreement_out+routing_em+repulsive_svgd)
JOIN = "+"


def method_label(args) -> str:
    """The methods of the run that fairseq-train's parsed arguments ``args`` describe, ``""`` for none: the
    disagreement terms (``disagreement_out``, ``disagreement_sub_pos``; Li et al. EMNLP 2018), the routing algorithm
    where a layer is routed (``routing_em``, ``routing_simple``; NAACL 2019) and the particle update of
    ``repulsive_adam`` (``repulsive_svgd``, ``_spos``, ``_sgld``; EMNLP 2020), joined by :data:`JOIN`. The values
    are the effective ones (an architecture's defaults included: ``routing_transformer_*`` routes)."""
    parts = []
    if str(getattr(args, "criterion", "")).endswith("_with_disagreement"):
        try:
            terms = parse_names(args.disagreement_terms, TERMS, "--disagreement-terms")
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        parts.append("disagreement_" + "_".join(terms))
    if any(getattr(args, dest, None) not in (None, "", "none") for dest, _, _ in ROUTING_PLACEMENTS):
        parts.append("routing_" + (getattr(args, "routing_type", None) or ROUTING_DEFAULTS["routing_type"]))
    if getattr(args, "optimizer", None) == "repulsive_adam":
        parts.append(f"repulsive_{args.repulsive_method}")
    return JOIN.join(parts)


def parse_name(name: str, text) -> str:
    """``NAME``: the user's name of a run (a folder name's characters: letters, digits, ``_ . + -``)."""
    if not _NAME.fullmatch(str(text)):
        raise bad(name, text, "use letters, digits, '_', '.', '+' or '-', starting with a letter or digit (it "
                              "names the save directory)")
    return str(text)


def default_save_dir(checkpoints, dataset: str, setting: str, identity_hash: str, method: str,
                     name: Optional[str] = None) -> Path:
    """``checkpoints/<dataset>_<setting>-<name or method>-<identity_hash>``; without either
    ``<dataset>_<setting>-<identity_hash>``, the name every run had before methods were named, which is also kept
    for a run of a method that an earlier version trained there (the same identity: the same run)."""
    base = Path(checkpoints) / f"{dataset}_{setting}"
    unlabelled = Path(f"{base}-{identity_hash}")
    label = name or method
    if not label:
        return unlabelled
    labelled = Path(f"{base}-{label}-{identity_hash}")
    return unlabelled if not name and unlabelled.is_dir() and not labelled.exists() else labelled
