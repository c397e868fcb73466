"""A personalized ledger entry's privacy classes with their per-slot split (for the tests).

Schema 2 keeps each class's per-slot ``charged`` in the class and its split into the
dissimilarity calculation (``ε_dc``) and the publication (``ε_pub``) in the entry's personalized
``details``; ``class_rows`` joins them back, class by class, checking they agree."""

from __future__ import annotations

from dataclasses import dataclass

from privstream.mechanisms.contract import LedgerEntry
from privstream.mechanisms.personalized import PersonalizedLedgerDetails


@dataclass(frozen=True)
class Row:
    """One privacy class of a ledger entry and its charge at the entry's slot, split."""

    window: int
    epsilon: float
    users: int
    epsilon_dc: float
    epsilon_pub: float
    window_spent: float


def class_rows(entry: LedgerEntry) -> tuple[Row, ...]:
    """The entry's classes in order, each with its split; a class's ``charged`` must be the
    split's sum exactly."""
    split = entry.details
    assert isinstance(split, PersonalizedLedgerDetails)
    out = []
    for c, dc, pub in zip(entry.classes, split.epsilon_dc, split.epsilon_pub, strict=True):
        assert c.charged == dc + pub, (c, dc, pub)
        out.append(Row(c.scope, c.budget, c.users, dc, pub, c.spent))
    return tuple(out)
