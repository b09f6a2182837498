"""The one parser per kind of value that the entry points read from environment variables (or their options).

Each returns the parsed value or raises ``SystemExit`` naming the variable (and its option, where there is one),
the bad value and the accepted values, so that a typo stops a run before any work starts.
"""

import math
import shlex
from typing import List, Mapping, Optional, Sequence


def bad(name: str, value, accepted: str) -> SystemExit:
    """The error for ``name=value``: ``accepted`` says what to use instead."""
    return SystemExit(f"error: {name}={value!r} is not valid: {accepted}")


def get(env: Mapping[str, str], name: str) -> Optional[str]:
    """``env[name]``, or ``None`` when it is unset or empty (an empty variable means "the default")."""
    return env.get(name) or None


def parse_int(name: str, text, minimum: int = 0, maximum: Optional[int] = None) -> int:
    """An integer in ``minimum .. maximum`` (decimal digits, optionally with a leading minus sign)."""
    value = str(text).strip()
    number = int(value) if value.lstrip("-").isdigit() and value.count("-") <= 1 else None
    if number is None or number < minimum or (maximum is not None and number > maximum):
        kind = f"an integer from {minimum} to {maximum}" if maximum is not None else {
            0: "a non-negative integer (0, 1, 2, ...)", 1: "a positive integer (1, 2, ...)"}.get(
            minimum, f"an integer >= {minimum}")
        raise bad(name, text, f"use {kind}")
    return number


def parse_float(name: str, text, minimum: Optional[float] = None) -> float:
    """A finite number (``>= minimum`` when given)."""
    try:
        number = float(str(text).strip())
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or (minimum is not None and number < minimum):
        raise bad(name, text, "use a finite number" + (f" >= {minimum:g}" if minimum is not None else ""))
    return number


def parse_choice(name: str, text, choices: Sequence[str]) -> str:
    """One of ``choices``, exactly."""
    if text not in choices:
        var = name.split(" ")[0]
        options = [f"{var}={c}" for c in choices]
        listing = options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]
        raise bad(name, text, f"use {listing} (exactly, lower case)")
    return text


def parse_flag(name: str, text) -> bool:
    """A switch: ``1`` (on) or ``0`` (off); unset or empty is off."""
    if text in (None, ""):
        return False
    value = str(text).strip()
    if value not in ("0", "1"):
        raise bad(name, text, f"use {name.split(' ')[0]}=1 to turn it on, 0 or unset to leave it off")
    return value == "1"


def parse_seeds(name: str, text) -> list:
    """A count N (seeds 1..N) or a comma-separated list of distinct positive integers."""
    seeds = [int(s) if s.isdigit() else 0 for s in (s.strip() for s in str(text).split(","))]
    if min(seeds) < 1 or len(seeds) != len(set(seeds)):
        raise bad(name, text, "use a count (3: seeds 1, 2, 3) or a comma-separated list of distinct positive "
                              "integers (1,2,5)")
    return seeds if "," in str(text) else list(range(1, seeds[0] + 1))


def parse_words(name: str, text) -> list:
    """Command-line flags in one variable (``TRAIN_ARGS='--lr 1e-3'``), split as the shell would."""
    try:
        return shlex.split(text or "")
    except ValueError as e:  # an unbalanced quote
        raise bad(name, text, f"use flags quoted as on a command line ({e})") from None


def foreign_variables(env: Mapping[str, str], instead: Mapping[str, str], reader: str) -> List[str]:
    """Warnings for the variables of ``instead`` (``{name: what to use instead}``) set in ``env``: they belong to
    another command, and ``reader`` (the command warning) does not read them."""
    return [f"{name}={env[name]} is not read by {reader}: use {use}" for name, use in instead.items()
            if get(env, name) is not None]
