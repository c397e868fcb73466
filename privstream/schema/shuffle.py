"""The messages of SaO2 behind a shuffler (issue 25), schema version 1: the server's task, the
devices' reports, and the shuffler's batches. Canonical JSON (``protocol.canonical``), the
standard library only: the device library, the shuffler and the server all read this module.

Three trust domains, three messages (docs/shuffler.md)::

    server  ─▶ request topic : Sao2Task   one per (stream, horizon): the public parameters
    devices ─▶ report topic  : Sao2Report one per (device, level block end): ExSub symbols
    shuffler ─▶ shuffled topic: Batch     one per (stream, horizon, level, block): the symbol
                                          counts c± of every report of the block, and the
                                          manifest (batch size n, n_min, policy); no identifier

A device's level is a public rule it evaluates on its own id (``Sao2Task.level_of``: a keyed
hash under the task's public salt, split by the level weights), so the server never sends a
list of ids and cannot steer a device's level after seeing its data. A block of level ``h``
ends at the horizon's slots ``τ ≡ 0 (mod r^h)``; every device of the level reports at every
block end, with no symbol if ExSub emits none, so the batch size is the level's reporting
population and the report times are data-independent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from privstream.client.sao2 import lengths, level_of, task_digest
from privstream.schema.events import INVALID_TYPE, MALFORMED
from privstream.schema.protocol import (
    ProtocolError,
    _check_fields,
    _check_head,
    _float,
    _int,
    _take,
    _text,
    canonical,
)

VERSION: Final = 1
TASK_TYPE: Final = "privstream.sao2.task"
REPORT_TYPE: Final = "privstream.sao2.report"
BATCH_TYPE: Final = "privstream.shuffled"
POLICIES: Final = ("forward", "drop", "below_min")
"""A batch's manifest policy: ``forward`` (n ≥ n_min), ``drop`` (n < n_min, nothing forwarded),
``below_min`` (n < n_min, forwarded anyway by the operator's choice; counted and alerted)."""
_HEX = re.compile(r"[0-9a-f]{32}")
_KINDS = ("onehot", "bits")


def _ints(value: Any, name: str, low: int) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise ProtocolError(INVALID_TYPE, f"{name} must be a non-empty list of integers")
    return tuple(_int(v, f"{name}[]", low) for v in value)


@dataclass(frozen=True)
class Sao2Task:
    """One horizon of one SaO2 stream, as the server publishes it (spec sao2 §2, §10.2): the
    slots ``first_slot .. first_slot + T − 1``, fan-out ``r``, change bound ``s``, ``d`` bits of
    ``kind``, ε per horizon and the devices' lifetime ε, ``m_h`` and the level weights ``W_h``
    per level, and the public ``salt`` of the level rule."""

    stream: str
    horizon: int
    first_slot: int
    T: int
    r: int
    s: int
    d: int
    kind: str
    epsilon: float
    lifetime_epsilon: float
    m: tuple[int, ...]
    weights: tuple[float, ...]
    salt: str

    def __post_init__(self) -> None:
        _text(self.stream, "stream")
        for name, low in (
            ("horizon", 0),
            ("first_slot", 1),
            ("T", 1),
            ("r", 2),
            ("s", 1),
            ("d", 1),
        ):
            _int(getattr(self, name), name, low)
        if self.kind not in _KINDS:
            raise ProtocolError(INVALID_TYPE, f"kind must be one of {_KINDS}, got {self.kind!r}")
        _float(self.epsilon, "epsilon")
        if not 0 < self.epsilon <= self.lifetime_epsilon:
            raise ProtocolError(INVALID_TYPE, "need 0 < epsilon <= lifetime_epsilon")
        if len(self.m) != len(self.weights) or len(self.m) != len(self.lengths):
            raise ProtocolError(
                INVALID_TYPE, f"m and weights need one entry per level ({len(self.lengths)})"
            )
        if any(w < 0 for w in self.weights) or abs(sum(self.weights) - 1) > 1e-9:
            raise ProtocolError(INVALID_TYPE, "the level weights must be >= 0 and sum to 1")
        _text(self.salt, "salt", _HEX)

    @property
    def lengths(self) -> tuple[int, ...]:
        """``T_h = ⌊T / r^h⌋`` for every level (``r^h ≤ T``)."""
        return lengths(self.T, self.r)

    @property
    def id(self) -> str:
        """The digest of the task's canonical encoding (what reports and batches name)."""
        return task_digest(self._body())

    def level_of(self, device: str) -> int:
        """The device's level: ``u = H(salt, device)`` as a uniform in [0, 1), then the first
        level whose cumulative weight passes ``u`` (a public rule; the server draws ``salt``
        from its keyed randomness before any report, independently of the data). The device
        library's one implementation (``client.sao2.level_of``)."""
        return level_of(self.weights, self.salt, device)

    def block_end(self, level: int, block: int) -> int:
        """The slot at which block ``block`` (1-based) of ``level`` ends."""
        return int(self.first_slot - 1 + block * self.r**level)

    def ending(self, slot: int) -> list[tuple[int, int]]:
        """The ``(level, block)`` pairs whose block ends at ``slot`` (none outside the horizon)."""
        tau = slot - self.first_slot + 1
        if not 1 <= tau <= self.T:
            return []
        return [(h, tau // self.r**h) for h in range(len(self.lengths)) if tau % self.r**h == 0]

    def _body(self) -> dict[str, Any]:
        return {"type": TASK_TYPE, "version": VERSION, "stream": self.stream,
                "horizon": self.horizon, "first_slot": self.first_slot, "T": self.T,
                "r": self.r, "s": self.s, "d": self.d, "kind": self.kind,
                "epsilon": self.epsilon, "lifetime_epsilon": self.lifetime_epsilon,
                "m": list(self.m), "weights": list(self.weights), "salt": self.salt}  # fmt: skip

    def to_json(self) -> str:
        return canonical({**self._body(), "id": self.id})

    @classmethod
    def from_obj(cls, obj: Any) -> Sao2Task:
        o = _check_head(obj, TASK_TYPE)
        _check_fields(o, (*cls.__dataclass_fields__, "type", "version", "id"), "SaO2 task")
        weights = _take(o, "weights")
        if not isinstance(weights, list):
            raise ProtocolError(INVALID_TYPE, "weights must be a list of numbers")
        task = cls(_take(o, "stream"), _take(o, "horizon"), _take(o, "first_slot"), _take(o, "T"),
                   _take(o, "r"), _take(o, "s"), _take(o, "d"), _take(o, "kind"),
                   _float(_take(o, "epsilon"), "epsilon"),
                   _float(_take(o, "lifetime_epsilon"), "lifetime_epsilon"),
                   _ints(_take(o, "m"), "m", 1),
                   tuple(_float(w, "weights[]") for w in weights), _take(o, "salt"))  # fmt: skip
        if o.get("id", task.id) != task.id:
            raise ProtocolError(MALFORMED, "the task's id is not the digest of its encoding")
        return task


Symbols = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Sao2Report:
    """One device's report at the end of one block of its level: the ExSub symbols
    ``(coordinate in [0, d), sign ±1)`` the block emitted (possibly none)."""

    task: str
    stream: str
    horizon: int
    level: int
    block: int
    device: str
    symbols: Symbols

    def to_json(self) -> str:
        return canonical({"type": REPORT_TYPE, "version": VERSION, "task": self.task,
                          "stream": self.stream, "horizon": self.horizon, "level": self.level,
                          "block": self.block, "device": self.device,
                          "symbols": [list(s) for s in self.symbols]})  # fmt: skip

    @classmethod
    def from_obj(cls, obj: Any) -> Sao2Report:
        o = _check_head(obj, REPORT_TYPE)
        _check_fields(o, (*cls.__dataclass_fields__, "type", "version"), "SaO2 report")
        raw = _take(o, "symbols")
        if not isinstance(raw, list):
            raise ProtocolError(INVALID_TYPE, "symbols must be a list of [coordinate, sign]")
        symbols = tuple(_symbol(s) for s in raw)
        return cls(_text(_take(o, "task"), "task", _HEX), _text(_take(o, "stream"), "stream"),
                   _int(_take(o, "horizon"), "horizon", 0), _int(_take(o, "level"), "level", 0),
                   _int(_take(o, "block"), "block", 1), _text(_take(o, "device"), "device"),
                   symbols)  # fmt: skip

    def fits(self, task: Sao2Task) -> str | None:
        """Why the report does not fit ``task`` (None: it does): another task, a level other
        than the device's own, a block beyond the level's, a coordinate outside ``[0, d)``, a
        coordinate twice, or more symbols than ``m_h``."""
        if (self.task, self.stream, self.horizon) != (task.id, task.stream, task.horizon):
            return "unknown_task"
        if self.level != task.level_of(self.device):
            return "wrong_level"
        if self.block > task.lengths[self.level]:
            return "no_such_block"
        coords = [c for c, _ in self.symbols]
        if any(not 0 <= c < task.d for c in coords) or len(set(coords)) != len(coords):
            return "shape_mismatch"
        if len(coords) > task.m[self.level]:
            return "too_many_symbols"
        return None


def _symbol(value: Any) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise ProtocolError(INVALID_TYPE, "a symbol is [coordinate, sign]")
    coord, sign = _int(value[0], "coordinate", 0), value[1]
    if sign not in (1, -1) or isinstance(sign, bool):
        raise ProtocolError(INVALID_TYPE, f"a symbol's sign is 1 or -1, got {sign!r}")
    return coord, int(sign)


REPORT_REASONS: Final = ("unknown_task", "wrong_level", "no_such_block", "shape_mismatch",
                         "too_many_symbols", "duplicate_report", "late_report",
                         "not_countable")  # fmt: skip
"""Why the shuffler refuses a device report (each a dead letter on its own topic)."""


@dataclass(frozen=True)
class Batch:
    """What the shuffler forwards for one block of one level: the manifest (``n`` reports from
    ``n`` distinct devices, ``n_min``, ``policy``, the shuffler that formed it) and, unless
    dropped, the counts ``plus[i]``/``minus[i]`` of the symbols ``i₊``/``i₋``. A function of the
    reports' multiset only: no identifier, order or time finer than the block's slot."""

    task: str
    stream: str
    horizon: int
    level: int
    block: int
    slot: int
    n: int
    n_min: int
    policy: str
    plus: tuple[int, ...] | None
    minus: tuple[int, ...] | None
    shuffler: str

    @property
    def key(self) -> str:
        """The batch's Kafka key: one per block, so a re-forwarded batch is the same record."""
        return f"{self.stream}/{self.horizon}/{self.level}/{self.block}"

    def to_json(self) -> str:
        return canonical({"type": BATCH_TYPE, "version": VERSION, "task": self.task,
                          "stream": self.stream, "horizon": self.horizon, "level": self.level,
                          "block": self.block, "slot": self.slot, "n": self.n,
                          "n_min": self.n_min, "policy": self.policy,
                          "plus": None if self.plus is None else list(self.plus),
                          "minus": None if self.minus is None else list(self.minus),
                          "shuffler": self.shuffler})  # fmt: skip

    @classmethod
    def from_obj(cls, obj: Any) -> Batch:
        o = _check_head(obj, BATCH_TYPE)
        _check_fields(o, (*cls.__dataclass_fields__, "type", "version"), "shuffled batch")
        policy = _take(o, "policy")
        if policy not in POLICIES:
            raise ProtocolError(INVALID_TYPE, f"policy must be one of {POLICIES}, got {policy!r}")
        plus, minus = (_counts(_take(o, k), k) for k in ("plus", "minus"))
        if (plus is None) != (policy == "drop") or (minus is None) != (plus is None):
            raise ProtocolError(MALFORMED, "counts are null exactly when the batch was dropped")
        return cls(_text(_take(o, "task"), "task", _HEX), _text(_take(o, "stream"), "stream"),
                   _int(_take(o, "horizon"), "horizon", 0), _int(_take(o, "level"), "level", 0),
                   _int(_take(o, "block"), "block", 1), _int(_take(o, "slot"), "slot", 1),
                   _int(_take(o, "n"), "n", 0), _int(_take(o, "n_min"), "n_min", 1), policy,
                   plus, minus, _text(_take(o, "shuffler"), "shuffler"))  # fmt: skip


def _counts(value: Any, name: str) -> tuple[int, ...] | None:
    return None if value is None else _ints(value, name, 0)


def decode(line: bytes | str, kind: type[Any]) -> Any:
    """One message of ``kind`` (``Sao2Task``, ``Sao2Report`` or ``Batch``) from its JSON text;
    ``ProtocolError`` names what is wrong."""
    import json

    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        raise ProtocolError(MALFORMED, "not a JSON object") from None
    return kind.from_obj(obj)


def counts_of(reports: Sequence[Sao2Report], d: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The symbol counts ``(c₊, c₋)`` of a block's reports (what a counts-only shuffler
    forwards, spec §10.4)."""
    plus, minus = [0] * d, [0] * d
    for report in reports:
        for coord, sign in report.symbols:
            (plus if sign > 0 else minus)[coord] += 1
    return tuple(plus), tuple(minus)


REPORTS_TYPE: Final = "privstream.shuffled.reports"
COUNTABLE: Final = ("GRR", "OUE")
"""Oracles whose server needs only counts (GRR: reports per value; OUE: set bits per
coordinate): their reports can go through the shuffler."""


@dataclass(frozen=True)
class ReportBatch:
    """What the shuffler forwards for one ``ldp-reports`` request (``protocol.Request``) once
    its round closed on every partition: the manifest (``n`` distinct devices, ``n_min``,
    ``policy``, the shuffler) and, unless dropped, the counts the oracle's estimator needs — a
    function of the reports' multiset only."""

    request: str
    stream: str
    slot: int
    round: int
    oracle: str
    n: int
    n_min: int
    policy: str
    counts: tuple[int, ...] | None
    shuffler: str

    @property
    def key(self) -> str:
        return f"{self.stream}/{self.slot}/{self.round}/{self.request}"

    def to_json(self) -> str:
        return canonical({"type": REPORTS_TYPE, "version": VERSION, "request": self.request,
                          "stream": self.stream, "slot": self.slot, "round": self.round,
                          "oracle": self.oracle, "n": self.n, "n_min": self.n_min,
                          "policy": self.policy,
                          "counts": None if self.counts is None else list(self.counts),
                          "shuffler": self.shuffler})  # fmt: skip

    @classmethod
    def from_obj(cls, obj: Any) -> ReportBatch:
        o = _check_head(obj, REPORTS_TYPE)
        _check_fields(o, (*cls.__dataclass_fields__, "type", "version"), "shuffled report batch")
        policy, oracle = _take(o, "policy"), _take(o, "oracle")
        if policy not in POLICIES or oracle not in COUNTABLE:
            raise ProtocolError(INVALID_TYPE, f"policy {policy!r} or oracle {oracle!r} unknown")
        counts = _counts(_take(o, "counts"), "counts")
        if (counts is None) != (policy == "drop"):
            raise ProtocolError(MALFORMED, "counts are null exactly when the batch was dropped")
        return cls(_text(_take(o, "request"), "request", _HEX), _text(_take(o, "stream"), "stream"),
                   _int(_take(o, "slot"), "slot", 1), _int(_take(o, "round"), "round", 1), oracle,
                   _int(_take(o, "n"), "n", 0), _int(_take(o, "n_min"), "n_min", 1), policy,
                   counts, _text(_take(o, "shuffler"), "shuffler"))  # fmt: skip


def report_counts(oracle: str, d: int, values: Sequence[Any]) -> tuple[int, ...]:
    """The counts of accepted GRR/OUE report values: reports per value, or set bits per
    coordinate (OUE values are lists of d bits)."""
    out = [0] * d
    for value in values:
        if oracle == "GRR":
            out[int(value)] += 1
        else:
            for i, bit in enumerate(value):
                out[i] += int(bit)
    return tuple(out)
