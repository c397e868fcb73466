"""The audit of SaO2's lifetime ledger (division ``sao2-lifetime``, spec sao2 §10.6) from its
public entries alone: the family declares it (``Family.divisions``) and the audit calls it.

**What a reader can recompute.** Every entry states its horizon, the users enrolled and refused
at the horizon's start, ε, ``ε_life`` and the most-spent user's lifetime spend. The population
is enrolled together: a horizon's start charges ε to every enrolled user and nothing to a
refused one. So the most-spent user's number of enrolled horizons ``k`` lies between a lower
bound ``L`` (it grows by one at a start that refused nobody: every user was enrolled) and an
upper bound ``U`` (it grows by one at every start that enrolled anyone). ``recompute`` gives
``L·ε`` against ``ε_life`` (a ledger stating less has under-counted; ``L·ε > ε_life`` is a
lifetime overspend); ``verify`` checks the rest in words (``verify``'s list).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from privstream.mechanisms.accounting import DivisionSpec, UserAccount
from privstream.mechanisms.sao2 import ACCOUNTANT, DIVISION, min_batch, subgroup_digest
from privstream.mechanisms.sao2_encoding import level_lengths
from privstream.mechanisms.sao2_exsub import subgroup_law
from privstream.mechanisms.shuffle_accountant import classical_bound

RELATIVE: Final = 1e-9


def _close(a: float, b: float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=RELATIVE, abs_tol=1e-12)


def _starts(entries: Sequence[Mapping[str, Any]]) -> list[bool]:
    """Whether each entry is the first of its horizon (its horizon differs from the last)."""
    out, last = [], None
    for entry in entries:
        horizon = int(entry["details"]["horizon"])
        out.append(horizon != last)
        last = horizon
    return out


def bounds(entries: Sequence[Mapping[str, Any]]) -> list[tuple[int, int, int]]:
    """Per entry ``(slot, L, U)``: the bounds on the most-spent user's enrolled horizons."""
    low = high = 0
    out = []
    for entry, start in zip(entries, _starts(entries), strict=True):
        d = entry["details"]
        if start and int(d["enrolled"]) > 0:
            high += 1
            low += 1 if int(d["refused"]) == 0 else 0
            low = max(low, 1)
        out.append((int(entry["slot"]), low, high))
    return out


def recompute(entries: Sequence[Mapping[str, Any]]) -> list[tuple[int, float, float]]:
    """Per entry: the lifetime spend the public entries force (``L·ε``) against ``ε_life``."""
    return [
        (slot, low * float(e["details"]["epsilon"]), float(e["classes"][0]["budget"]))
        for (slot, low, _), e in zip(bounds(entries), entries, strict=True)
    ]


def verify(entries: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
    """What is inconsistent in a SaO2 ledger, per slot in words: a spend above ``U·ε`` or one
    that is not the class's ``spent``; a charge other than ε at an enrolling horizon start or
    other than 0 elsewhere; enrolled users that are not ``Σ n_h``, or enrolled plus refused
    that are not the population; a level's ``d'_h`` that is not ``d·T_h + s``, an ``m_h``
    outside ``[1, d'_h]``, weights that do not sum to 1; a stated ``ε_c`` that is not Lemma
    3.4's at ``(ε, n_h, δ)`` or a method other than ``classical-7.1``; an ``n_min``, a count of
    levels below it or a subgroup-CDF digest other than their recomputation; parameters (ε,
    ``ε_life``, ``s``, ``r``, ``T``, δ) other than the first entry's."""
    out: list[tuple[int, str]] = []
    first = _public(entries[0]) if entries else None
    starts = _starts(entries)
    for entry, start, (slot, _, high) in zip(entries, starts, bounds(entries), strict=True):
        d, one = entry["details"], entry["classes"][0]
        if _public(entry) != first:
            out.append((slot, f"parameters {_public(entry)} differ from the first entry's {first}"))
            continue
        eps = float(d["epsilon"])
        if float(one["spent"]) > high * eps * (1 + RELATIVE) + 1e-12:
            out.append((slot, f"lifetime spend {one['spent']!r} passes {high} enrolled horizons"))
        if not _close(d["lifetime_spent"], one["spent"]):
            out.append((slot, f"lifetime_spent {d['lifetime_spent']!r} but spent {one['spent']!r}"))
        want = eps if start and int(d["enrolled"]) > 0 else 0.0
        if not _close(one["charged"], want):
            out.append((slot, f"charged {one['charged']!r}, want {want!r} at this slot"))
        out.extend((slot, why) for why in _levels(d, int(one["users"])))
    return out


def _public(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    d = entry["details"]
    return (d["epsilon"], d["lifetime_epsilon"], d["s"], d["r"], d["window"], d["delta"],
            entry["classes"][0]["budget"])  # fmt: skip


def _levels(d: Mapping[str, Any], population: int) -> list[str]:
    """The per-level numbers of one entry's details that are not what its parameters give."""
    wrong = []
    n_h, m_h, d_prime = list(d["n_h"]), list(d["m_h"]), list(d["d_prime"])
    if int(d["enrolled"]) != sum(n_h):
        wrong.append(f"enrolled {d['enrolled']} but the levels hold {sum(n_h)}")
    if int(d["enrolled"]) + int(d["refused"]) not in (population, int(d["refused"])):
        wrong.append(f"enrolled {d['enrolled']} + refused {d['refused']} is not {population}")
    lengths = level_lengths(int(d["window"]), int(d["r"]))
    s = int(d["s"])
    if len(d_prime) != len(lengths) or any((dp - s) % T_h or dp <= s for dp, T_h in zip(d_prime, lengths, strict=False)):  # fmt: skip
        wrong.append(f"d'_h {d_prime} are not d·T_h + s for T_h {lengths}")
    if len(m_h) != len(d_prime) or any(not 1 <= m <= dp for m, dp in zip(m_h, d_prime, strict=False)):  # fmt: skip
        wrong.append(f"m_h {m_h} outside [1, d'_h]")
    if not math.isclose(sum(d["weights"]), 1.0, rel_tol=1e-9):
        wrong.append(f"the level weights sum to {sum(d['weights'])!r}, not 1")
    if d["accountant"] != ACCOUNTANT:
        wrong.append(f"central ε stated by {d['accountant']!r}, not {ACCOUNTANT}")
    eps, delta = float(d["epsilon"]), float(d["delta"])
    for h, (n, stated) in enumerate(zip(n_h, d["epsilon_central"], strict=True)):
        want = classical_bound(eps, int(n), delta).epsilon if n else eps
        if not _close(stated, want):
            wrong.append(f"level {h}: ε_c {stated!r} is not Lemma 3.4's {want!r} at n_h = {n}")
    return wrong + _shuffle_facts(d, n_h, m_h, d_prime, eps, delta)


def _shuffle_facts(
    d: Mapping[str, Any],
    n_h: list[int],
    m_h: list[int],
    d_prime: list[int],
    eps: float,
    delta: float,
) -> list[str]:
    """``n_min``, the count of levels below it, and each level's subgroup-CDF digest, against
    their recomputation from the entry's public parameters (spec §10.4, §10.6)."""
    wrong = []
    n_min = min_batch(eps, delta)
    if int(d["n_min"]) != n_min:
        wrong.append(f"n_min {d['n_min']} is not ⌈16 e^ε log(4/δ)⌉ = {n_min}")
    small = sum(1 for n in n_h if 0 < int(n) < n_min)
    if int(d["small_levels"]) != small:
        wrong.append(f"small_levels {d['small_levels']} but {small} levels hold 0 < n_h < {n_min}")
    s = int(d["s"])
    for h, (dp, m, digest) in enumerate(zip(d_prime, m_h, d["subgroup_cdf"], strict=True)):
        want = subgroup_digest(subgroup_law(int(dp), s, eps, int(m)).cdf)
        if digest != want:
            wrong.append(f"level {h}: subgroup CDF digest {digest!r} is not the public table's")
    return wrong


LIFETIME: Final = DivisionSpec(
    DIVISION,
    lambda _spend, _personalized: UserAccount(),
    recompute,
    summary="one account per user: ε per horizon it is enrolled in, never past ε_life",
    verify=verify,
)
