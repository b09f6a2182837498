"""Validation of the comma-separated name options shared by the plugins (``--disagreement-terms``,
``--disagreement-attention``, ``--repulsive-attention``, ``--repulsive-projections``)."""

from typing import Iterable, Sequence, Tuple, Union


def parse_names(value: Union[str, Iterable, None], allowed: Sequence[str], flag: str) -> Tuple[str, ...]:
    """The names in ``value`` (a comma-separated string, or a list given through hydra) in the canonical
    order of ``allowed``, without duplicates. Raises ``ValueError`` naming ``flag`` when ``value`` is empty
    or holds a name outside ``allowed``."""
    if isinstance(value, str):
        names = [n.strip() for n in value.split(",") if n.strip()]
    else:  # a list given through hydra
        names = [str(n).strip() for n in (value or [])]
        names = [n for n in names if n]
    if not names:
        raise ValueError(f"{flag} is empty; choose one or more of {', '.join(allowed)}")
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ValueError(f"{flag}: unknown value(s) {', '.join(unknown)}; choose from {', '.join(allowed)}")
    return tuple(n for n in allowed if n in names)
