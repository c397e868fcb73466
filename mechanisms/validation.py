"""Validators every family's config shares (design §3: a ``ValueError`` naming the field, the
value and the allowed range), so a requirement, a population or a budget share means the same
thing and has the same limits in every family."""

from __future__ import annotations

import math
from collections.abc import Collection
from operator import itemgetter
from typing import Any, Final

import numpy as np

MIN_EPSILON: Final = 1e-3
MAX_EPSILON: Final = 1e6
MAX_WINDOW: Final = 100_000
"""Limits of a requirement ``(ε, w)``, the stream's and every user's: beyond them a ledger ring
would not fit in memory (w up to 2^62 was tried) or a noise scale would not be finite (ε =
1e−310). A registration outside them is refused at start."""


def check_requirement(epsilon: float, window: int, what: str) -> None:
    """Refuse a requirement outside ``[MIN_EPSILON, MAX_EPSILON] × [1, MAX_WINDOW]``."""
    if not (isinstance(epsilon, (int, float)) and MIN_EPSILON <= epsilon <= MAX_EPSILON):
        raise ValueError(
            f"{what}: epsilon must lie in [{MIN_EPSILON:g}, {MAX_EPSILON:g}], got {epsilon!r}"
        )
    if (
        isinstance(window, bool)
        or not isinstance(window, (int, np.integer))
        or not (1 <= window <= MAX_WINDOW)
    ):
        raise ValueError(f"{what}: window must be an integer in [1, {MAX_WINDOW}], got {window!r}")


def distinct_requirements(
    values: Collection[tuple[Any, Any]],
) -> list[tuple[int, tuple[Any, Any]]]:
    """Each distinct ``(ε_i, w_i)`` of a registration with the number of its first entry
    (from 1), in the table's order: a check of each pair names the same first failing entry
    as a check of every entry would, at the cost of the distinct pairs (a table of 160,000
    users has a handful). Pairs only compare equal across types (``True == 1``) when every
    window is an ``int`` and every ε an ``int`` or ``float``; otherwise every entry is kept."""
    if not values:
        return []
    windows = set(map(type, map(itemgetter(1), values)))
    if windows != {int} or not set(map(type, map(itemgetter(0), values))) <= {int, float}:
        return list(enumerate(values, start=1))
    firsts: dict[tuple[Any, Any], int] = {}
    for k, pair in enumerate(values, start=1):
        firsts.setdefault(pair, k)
    return [(k, pair) for pair, k in firsts.items()]


def check_population(population: object) -> None:
    """The registered population size ``n``: an integer ≥ 1."""
    if isinstance(population, bool) or not isinstance(population, int) or population < 1:
        raise ValueError(f"population must be an integer >= 1, got {population!r}")


def check_fraction(name: str, value: float, *, closed: bool = False) -> None:
    """A share in ``(0, 1)`` (``(0, 1]`` when ``closed``)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = number and math.isfinite(value) and value > 0 and (value <= 1 if closed else value < 1)
    if not ok:
        bound = "(0, 1]" if closed else "(0, 1)"
        raise ValueError(f"{name} must lie in {bound}, got {value!r}")
