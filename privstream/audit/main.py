"""``privstream audit``: an independent check of what a flow published.

It reads the releases and ledger entries a flow wrote — JSON-lines files (``privstream run
--out/--ledger-out``) or Kafka topics, read from the beginning until nothing new arrives for
``idle_seconds`` (Tansu's high watermarks cannot be trusted) — and checks, from the JSON alone:

1. ``complete_slots``: every (stream, mechanism) has its release and ledger entry at every slot
   from its first to its last (or to ``expect_slots``), except after a halt record
   ``{"kind": "halt", "stream", "mechanism", "slot", "reason"}`` in the ledger, and except the
   slots ``first..last`` of a recorded gap ``{"kind": "gap", "stream", "mechanism", "first",
   "last", "reason"}`` (a new incarnation's cooldown: anything published inside it fails);
2. ``unique_payloads``: no release id (``stream/mechanism/slot`` for ledger entries) carries
   two different payloads; identical copies (at-least-once output) are counted, not failed;
3. ``window_budget``: budget division — every privacy class's per-slot ``charged`` summed over
   the class's window is within its ε (one class for the families whose users share one
   requirement, one per class for personalized mechanisms); population division — a window
   holds at most n reporting users (``population``, from the details' ``users_m1`` +
   ``users_m2``) and a reporting user spends ε; user division (one account per user, CGM) —
   the most-charged user's ``spent`` is within the class's ε, never falls within its
   scope (the stream, or each period), never passes the charges so far nor stays below the
   slot's charge;
4. ``population_accountant``: the stream's mechanisms together stay within the population's ε
   per class key at every slot, unless the entries are marked ``evaluation`` (a user-division
   mechanism contributes its declared, bounded spend);
5. ``declared_spend``: every class's ``spent`` (and, population division, ``charged``
   and the details' ``window_users``; user division, the details' ``mu_spent`` as its square
   root) and every ``population_spent`` an entry declares equals the recomputation
   (1e-9 relative);
6. ``no_user_ids``: no output carries a raw user id field (``user``, ``user_id``, a list of
   ``users``; at the top, in ``details`` or in a class); ``well_formed``: every line is a
   release or ledger record of schema 3 (``SCHEMA``: the one release envelope, measure-neutral
   names) or of schema 2 (its old names read as the new ones, ``READABLE``); a record of
   another schema is refused, naming it.

Nothing of the operators, the mechanisms' ledgers or the population accountant is imported:
the audit shares no code with what it audits (``privstream.audit.checks`` recomputes all).
The lines are decoded into this module's own minimal schema records, not into
``privstream.mechanisms.contract``'s classes, so a bug in how the flow builds or serialises
them cannot hide itself. Only the Kafka client plumbing of ``privstream.connectors.kafka``
(``KafkaSettings``, ``require_topics``, ``consumer_config``) is reused.
"""

from __future__ import annotations

import argparse
import json
import math
import operator
import sys
import time
from collections.abc import Callable, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray

from privstream.audit.checks import (
    F64,
    I64,
    MAX_SLOT,
    PROBLEM_LIMIT,
    SLOT_BITS,
    AccountantCounts,
    Bools,
    ClassTable,
    Findings,
    LedgerTable,
    Published,
    SlotCounts,
    WindowCounts,
    check_accountant,
    check_slots,
    check_windows,
    close,
    keyed_mechanism,
    pair_release_id,
)
from privstream.audit.claims import (
    APPROXIMATE,
    NULLIFIED,
    PUBLISH,
    ClaimCounts,
    Expectation,
    FlowPlan,
    check_expected,
    check_flags,
    check_flow,
    check_sources,
    check_stated,
)
from privstream.audit.summary import summary
from privstream.schema.keys import release_id

CHECKS = (
    "well_formed", "complete_slots", "unique_payloads", "window_budget", "declared_spend",
    "population_accountant", "no_user_ids", "secure_noise", "not_evaluation",
    "repeated_publications", "stated_guarantee", "expected_budget", "flow_file",
    "something_read",
)  # fmt: skip
"""Every check of the report, in its order (``flow_file`` only with ``--config``): the names of
``privstream_audit_check_passed{check}`` and of the README's and deploy/README's lists."""
PROGRESS_SECONDS = 2.0
_UNSET: Any = msgspec.UNSET


# The published schema, written again on purpose (the fields ``mechanisms.contract`` writes,
# and the raw-id fields no output may carry): the auditor must not decode with the classes of
# the code it audits. Only what the checks read is declared; other fields are ignored.

SCHEMA = 3
"""The version of the release and ledger envelopes this audit reads (``schema`` in every
record): one envelope for every family, the guarantee as data, per-family ``details``, and
measure-neutral names (a class's ``scope``/``budget``/``spent``, ``population_budget`` and
``population_spent``; docs/accounting.md)."""

READABLE = (2, 3)
"""The schemas read: 2 is 3 under its old names (a class's ``window``/``epsilon``/
``window_spent``, ``population_epsilon``/``population_window_spent``), from topics written
before the rename; ``_ENTRY_V2`` decodes them into the same records."""


class _Guarantee(msgspec.Struct, frozen=True, gc=False):
    """A mechanism's declared guarantee: its measure's parameters and its scope's window
    (hashable: equal guarantees are one, compared field by field)."""

    measure: str
    scope: str
    model: str
    epsilon: float | None = None
    delta: float | None = None
    mu: float | None = None
    rho: float | None = None
    window: int | None = None
    length: int | None = None
    budget: float | None = None
    """A family's own measure states its additive budget here (``guarantees.budget_of``)."""
    unit: str | None = None
    """... and the unit a person reads it in (its charge type's ``symbol``)."""

    def text(self) -> str:
        """The guarantee in words, e.g. ``pure ε=1 over window w=10 (ldp)``."""
        params = [
            f"{name}={value:g}"
            for name, value in (("ε", self.epsilon), ("δ", self.delta), ("μ", self.mu),
                                ("ρ", self.rho), (self.unit or "budget", self.budget))
            if value is not None
        ]  # fmt: skip
        scope = self.scope
        if self.window is not None:
            scope += f" w={self.window}"
        if self.length is not None:
            scope += f" length={self.length}"
        return f"{self.measure} {' '.join(params)} over {scope} ({self.model})"


class _Screened(msgspec.Struct, gc=False):
    """A release's ``details``: only screened for raw user ids."""

    user: Any = _UNSET
    user_id: Any = _UNSET
    users: Any = _UNSET


class _Details(msgspec.Struct, gc=False):
    """A ledger entry's ``details``: the audit reads LDP-IDS's per-slot reports (population
    division is checked from them) and CGM's ``mu_spent`` (user division), and screens every
    family's for raw user ids."""

    epsilon_m1: float | None = None
    epsilon_m2: float | None = None
    users_m1: int | None = None
    users_m2: int | None = None
    window_users: int | None = None
    mu_spent: float | None = None
    user: Any = _UNSET
    user_id: Any = _UNSET
    users: Any = _UNSET


class _ClassSpend(msgspec.Struct, gc=False):
    scope: int
    budget: float
    users: int | list[Any]
    charged: float
    spent: float
    user: Any = _UNSET
    user_id: Any = _UNSET


class _ClassSpendV2(msgspec.Struct, gc=False):
    """A schema-2 class: the same attributes under their old names."""

    scope: int = msgspec.field(name="window")
    budget: float = msgspec.field(name="epsilon")
    users: int | list[Any]
    charged: float
    spent: float = msgspec.field(name="window_spent")
    user: Any = _UNSET
    user_id: Any = _UNSET


class _Entry(msgspec.Struct, gc=False):
    stream: str
    mechanism: str
    slot: int
    guarantee: _Guarantee
    division: str
    classes: tuple[_ClassSpend, ...]
    details: _Details
    schema: int | None = None
    population_budget: float | None = None
    population_spent: float | None = None
    evaluation: bool = False
    insecure_seed: bool = False
    user: Any = _UNSET
    user_id: Any = _UNSET
    users: Any = _UNSET


class _EntryV2(msgspec.Struct, gc=False):
    """A schema-2 ledger entry: ``_Entry``'s attributes under their old names."""

    stream: str
    mechanism: str
    slot: int
    guarantee: _Guarantee
    division: str
    classes: tuple[_ClassSpendV2, ...]
    details: _Details
    schema: int | None = None
    population_budget: float | None = msgspec.field(name="population_epsilon", default=None)
    population_spent: float | None = msgspec.field(name="population_window_spent", default=None)
    evaluation: bool = False
    insecure_seed: bool = False
    user: Any = _UNSET
    user_id: Any = _UNSET
    users: Any = _UNSET


class _Halt(msgspec.Struct):
    """A halt or gap record (or another kind, skipped with a note)."""

    kind: str
    stream: str
    slot: int | None = None
    first: int | None = None
    last: int | None = None
    mechanism: str | None = None
    reason: str = ""
    schema: int | None = None


class _Release(msgspec.Struct, gc=False):
    release_id: str
    stream: str
    mechanism: str
    slot: int
    strategy: str
    estimate: list[float]
    source_slot: int | None
    guarantee: _Guarantee
    details: _Screened
    schema: int | None = None
    insecure_seed: bool = False
    evaluation: bool = False
    key: dict[str, str] | None = None
    user: Any = _UNSET
    user_id: Any = _UNSET
    users: Any = _UNSET


class _Versioned(msgspec.Struct):
    schema: Any = None


_RELEASE = msgspec.json.Decoder(_Release)
_ENTRY = msgspec.json.Decoder(_Entry)
_ENTRY_V2 = msgspec.json.Decoder(_EntryV2)
_OLDER = {id(_ENTRY): _ENTRY_V2}
"""The decoder of the older schema's names, tried on a line the current one refuses."""
_HALT = msgspec.json.Decoder(_Halt)
_VERSIONED = msgspec.json.Decoder(_Versioned)
_STRATEGIES = {"publish": PUBLISH, "approximate": APPROXIMATE, "nullified": NULLIFIED}


def _keyed_id(stream: str, mechanism: str, slot: int, key: dict[str, str] | None) -> str | None:
    """The release id a release must name: with its key parts (None: parts no id can carry)."""
    try:
        return release_id(stream, mechanism, slot, *(key or {}).values())
    except (ValueError, TypeError):
        return None


def _estimate_hash(estimate: list[float]) -> int:
    """A keyed hash (SipHash, keyed per process) of an estimate's float64 bit patterns: equal
    exactly when the values are equal bit for bit, however the JSON spelled them."""
    return hash(np.asarray(estimate, dtype=np.float64).tobytes())


def _budget(guarantee: _Guarantee) -> float:
    """The guarantee's additive budget, in the unit the ledgers count: ε of a pure or an
    approximate measure, μ² of Gaussian DP (it composes in squares), ρ of zCDP; NaN for an
    unknown measure or a missing parameter; a family's own measure states it (``budget``)."""
    g = guarantee
    value = {
        "pure": g.epsilon, "approx": g.epsilon, "gaussian": None if g.mu is None else g.mu**2,
        "zcdp": g.rho,
    }.get(g.measure, g.budget)  # fmt: skip
    return math.nan if value is None else float(value)


def _budgets(guarantees: Sequence[_Guarantee]) -> F64:
    """``_budget`` of every guarantee of a batch (a batch of pure ε read as one column)."""
    measures = tuple(map(operator.attrgetter("measure"), guarantees))
    if measures.count("pure") == len(measures):
        return _optional(tuple(map(operator.attrgetter("epsilon"), guarantees)))
    return _floats([_budget(g) for g in guarantees])


def _decode_any(decoder: msgspec.json.Decoder[Any], line: bytes) -> Any:
    """Decode ``line`` with ``decoder``; a line it refuses that is of schema 2 is decoded with
    the old names (``READABLE``). The current decoder's error stands otherwise."""
    try:
        return decoder.decode(line)
    except msgspec.ValidationError:
        older = _OLDER.get(id(decoder))
        if older is None:
            raise
        try:
            record = older.decode(line)
        except msgspec.DecodeError:
            record = None
        if record is None or record.schema != 2:
            raise
        return record


def _undecodable(line: bytes, source: str, exc: msgspec.DecodeError) -> str:
    """Why a line is no record of ``source``: another schema when it names one (or none),
    else the decoder's error."""
    try:
        problem = _schema_problem(_VERSIONED.decode(line).schema)
    except msgspec.DecodeError:
        problem = None
    return problem or f"not a {source} record: {exc}"


def _schema_problem(schema: Any) -> str | None:
    """Why a record's ``schema`` is not the one this audit reads, or None."""
    if schema in READABLE:
        return None
    if schema is None:
        return f"no schema field (a privstream output from before schema {READABLE[0]})"
    readable = " and ".join(map(str, READABLE))
    return f"schema {schema!r}, but this audit reads schemas {readable}"


def _raw_id_field(record: Any) -> str | None:
    """The name of a field of ``record`` that looks like a raw user id, if it has one."""
    if record.user is not _UNSET:
        return "user"
    if record.user_id is not _UNSET:
        return "user_id"
    if type(record.users) is list:
        return "users"
    return None


def _parts(record: Any) -> tuple[Any, ...]:
    """A release or ledger entry and the objects nested in it: its details, its classes."""
    return (record, record.details, *getattr(record, "classes", ()))


class Collector:
    """What the checks need from the published lines, kept as columns while they are read.

    Lines are taken in batches (decoded one by one, their fields extracted and validated as
    NumPy columns). Only the first copy of each id is kept; a later copy counts as a duplicate,
    and as a conflicting one when its bytes differ (outputs are canonical JSON, so a replayed
    release is byte-identical). Problems found while reading are kept per check (the first 50).
    """

    def __init__(self, batch: int = 8192) -> None:
        self.batch = batch
        self.pairs: dict[tuple[str, str], int] = {}
        self._names: list[tuple[str, str]] = []
        self._stream_ids: dict[str, int] = {}
        self._mechanism_ids: dict[str, int] = {}
        self._pair_table = np.zeros((0, 0), dtype=np.int64)
        self.lines = {"release": 0, "ledger": 0}
        self.duplicates = 0
        self.conflicting = 0
        self.malformed = 0
        self.user_fields = 0
        self.problems: dict[str, list[tuple[str, str, str]]] = {
            "well_formed": [], "unique_payloads": [], "no_user_ids": []
        }  # fmt: skip
        self.notes: list[str] = []
        self._pending: dict[str, list[bytes]] = {"release": [], "ledger": []}
        self._seen: dict[str, dict[int, int]] = {"release": {}, "ledger": {}}
        self._variants: dict[tuple[str, int], set[int]] = {}
        self._releases: list[dict[str, NDArray[Any]]] = []
        self._entries: list[dict[str, NDArray[Any]]] = []
        self._declared: dict[str, list[dict[str, Any]]] = {}
        """A family's own division's entries by its name, as published (``DivisionSpec``)."""
        self._classes: list[dict[str, NDArray[Any]]] = []
        self._rows = 0
        self._halts: dict[tuple[str, str | None], int] = {}
        self._gaps: dict[tuple[str, str], set[tuple[int, int]]] = {}
        self._unknown_kinds: set[str] = set()
        self._guarantee_ids: dict[_Guarantee, int] = {}

    def _gids(self, guarantees: Sequence[_Guarantee]) -> I64:
        """The id of every guarantee (equal guarantees share one)."""
        ids = self._guarantee_ids
        return np.array([ids.setdefault(g, len(ids)) for g in guarantees], dtype=np.int64)

    @property
    def records(self) -> int:
        """Lines taken so far."""
        return sum(map(self.taken, self.lines))

    def taken(self, source: str) -> int:
        """Lines of ``source`` taken so far, processed or still pending."""
        return self.lines[source] + len(self._pending[source])

    @property
    def distinct(self) -> dict[str, int]:
        """Distinct release ids and ledger ids read."""
        self.flush()
        return {source: len(seen) for source, seen in self._seen.items()}

    def take(self, source: str, payloads: list[bytes]) -> None:
        """Take lines of ``source`` (``"release"`` or ``"ledger"``: entries and halt records),
        each one JSON object with surrounding whitespace stripped."""
        pending = self._pending[source]
        pending.extend(payloads)
        if len(pending) >= self.batch:
            self._take_releases() if source == "release" else self._take_ledger()

    def flush(self) -> None:
        """Process the lines still pending."""
        self._take_releases()
        self._take_ledger()

    def _problem(self, check: str, kind: str, ident: str, detail: str) -> None:
        kept = self.problems[check]
        if len(kept) < PROBLEM_LIMIT:
            kept.append((kind, ident, detail))

    def _malformed(self, source: str, line: int, detail: str) -> None:
        self.malformed += 1
        self._problem("well_formed", "malformed", f"{source} #{line}", detail)

    def _pair(self, stream: str, mechanism: str) -> int:
        key = (stream, mechanism)
        index = self.pairs.get(key)
        if index is None:
            index = self.pairs[key] = len(self._names)
            self._names.append(key)
            s = self._stream_ids.setdefault(stream, len(self._stream_ids))
            m = self._mechanism_ids.setdefault(mechanism, len(self._mechanism_ids))
            table = np.full((len(self._stream_ids), len(self._mechanism_ids)), -1, dtype=np.int64)
            table[: self._pair_table.shape[0], : self._pair_table.shape[1]] = self._pair_table
            table[s, m] = index
            self._pair_table = table
        return index

    def _name(self, pair: int, slot: int) -> str:
        return pair_release_id(self._names[pair], slot)

    def _decode(
        self, decoder: Any, lines: list[bytes], numbers: list[int], source: str
    ) -> tuple[list[Any], list[bytes], list[int]]:
        """The decodable lines' records, bytes and line numbers; the others are malformed.
        Each line is decoded once."""
        records: list[Any] = []
        keep = np.ones(len(lines), dtype=np.bool_)
        for i, line in enumerate(lines):
            try:
                records.append(_decode_any(decoder, line))
            except msgspec.DecodeError as exc:
                keep[i] = False
                self._malformed(source, numbers[i], _undecodable(line, source, exc))
        if keep.all():
            return records, lines, numbers
        return records, _select(lines, keep), _select(numbers, keep)

    def _first_copies(self, source: str, pair: I64, slot: I64, lines: list[bytes]) -> I64:
        """Positions of the lines that are the first copy of their id; counts the others as
        duplicates, conflicting when their bytes differ from an earlier copy's."""
        seen = self._seen[source]
        keys = ((pair << SLOT_BITS) | slot).tolist()
        batch = dict(zip(keys, map(hash, lines), strict=True))
        if len(batch) == len(keys) and seen.keys().isdisjoint(batch):
            seen.update(batch)  # the usual batch: no copy of anything
            return np.arange(len(keys), dtype=np.int64)
        first = []
        for i, (key, line) in enumerate(zip(keys, lines, strict=True)):
            digest, previous = hash(line), seen.get(key)
            if previous is None:
                seen[key] = digest
                first.append(i)
            else:
                self._copy(source, key, previous, digest)
        return np.array(first, dtype=np.int64)

    def _copy(self, source: str, key: int, previous: int, digest: int) -> None:
        self.duplicates += 1
        if previous == digest:
            return
        variants = self._variants.setdefault((source, key), {previous})
        if digest not in variants:
            variants.add(digest)
            self.conflicting += 1
            what = "release" if source == "release" else "ledger entry"
            self._problem(
                "unique_payloads",
                "conflicting_duplicate",
                self._name(key >> SLOT_BITS, key & (MAX_SLOT - 1)),
                f"{what} published with {len(variants)} different payloads",
            )

    def _user_fields(
        self, fields: dict[str, tuple[Any, ...]], records: list[Any], pair: I64, what: str
    ) -> None:
        """Count and report records with a field that looks like a raw user id."""
        for i in _id_field_rows(fields, records):
            record = records[i]
            name = next(n for n in map(_raw_id_field, _parts(record)) if n is not None)
            self.user_fields += 1
            detail = f"{what} has a field {name!r} that looks like a raw user id"
            ident = self._name(int(pair[i]), record.slot)
            self._problem("no_user_ids", "raw_user_field", ident, detail)

    def _pairs_of(self, streams: tuple[str, ...], mechanisms: tuple[str, ...]) -> I64:
        """The pair index of every (stream, mechanism), registering new pairs: names are looked
        up one column at a time (no tuple per record), pairs in a (stream, mechanism) table."""
        stream = list(map(self._stream_ids.get, streams))
        mechanism = list(map(self._mechanism_ids.get, mechanisms))
        if None not in stream and None not in mechanism:
            pairs = self._pair_table[
                np.array(stream, dtype=np.int64), np.array(mechanism, dtype=np.int64)
            ]
            if pairs.size == 0 or pairs.min() >= 0:
                return pairs
        return np.array(
            [self._pair(*key) for key in zip(streams, mechanisms, strict=True)], dtype=np.int64
        )

    def _pending_lines(self, source: str) -> tuple[list[bytes], list[int]]:
        """Take the pending lines of ``source`` and their 1-based line numbers."""
        lines, self._pending[source] = self._pending[source], []
        first = self.lines[source] + 1
        self.lines[source] += len(lines)
        return lines, list(range(first, first + len(lines)))

    def _take_releases(self) -> None:
        lines, numbers = self._pending_lines("release")
        if not lines:
            return
        records, lines, where = self._decode(_RELEASE, lines, numbers, "release")
        fields = _fields(_Release, records)
        slot, epsilon = _ints(fields["slot"]), _budgets(fields["guarantee"])
        ids = map(_keyed_id, fields["stream"], fields["mechanism"], fields["slot"], fields["key"])
        named = np.array(list(map(operator.eq, fields["release_id"], ids)), dtype=np.bool_)
        good = named & (slot >= 0) & (slot < MAX_SLOT) & (epsilon > 0) & (epsilon < math.inf)
        good &= np.array([s in READABLE for s in fields["schema"]], dtype=np.bool_)
        good &= np.array([s in _STRATEGIES for s in fields["strategy"]], dtype=np.bool_)
        for i in np.flatnonzero(~good).tolist():
            self._malformed("release", where[i], _schema_problem(records[i].schema) or (
                f"release_id {records[i].release_id!r} is not stream/mechanism/slot with "
                "0 <= slot < 2**40, the guarantee's budget is not positive and finite, or "
                f"the strategy {records[i].strategy!r} is not one of {', '.join(_STRATEGIES)}"
            ))  # fmt: skip
        if not good.all():
            records, lines = _select(records, good), _select(lines, good)
            fields, slot, epsilon = _fields(_Release, records), slot[good], epsilon[good]
        keyed = tuple(map(keyed_mechanism, fields["mechanism"], fields["key"]))
        pair = self._pairs_of(fields["stream"], keyed)
        self._user_fields(fields, records, pair, "release")
        first = self._first_copies("release", pair, slot, lines)
        columns = {"pair": pair, "slot": slot, "epsilon": epsilon, **self._claims(fields)}
        self._releases.append({name: column[first] for name, column in columns.items()})

    def _claims(self, fields: dict[str, tuple[Any, ...]]) -> dict[str, NDArray[Any]]:
        """What a batch of releases claims: strategy, source slot (−1: none), a keyed hash of
        the estimate's values, whether the estimate is all zeros, the guarantee's id and the
        flags."""
        strategy = np.array([_STRATEGIES[s] for s in fields["strategy"]], dtype=np.int64)
        estimates = fields["estimate"]
        return {
            "strategy": strategy,
            "source": _counts(fields["source_slot"]),
            "estimate": np.array(list(map(_estimate_hash, estimates)), dtype=np.int64),
            "zero": np.array([not any(e) for e in estimates], dtype=np.bool_),
            "gid": self._gids(fields["guarantee"]),
            "insecure": np.array(fields["insecure_seed"], dtype=np.bool_),
            "evaluation": np.array(fields["evaluation"], dtype=np.bool_),
        }

    def _take_ledger(self) -> None:
        lines, numbers = self._pending_lines("ledger")
        if not lines:
            return
        lines, numbers = self._take_records(lines, numbers)
        records, lines, where = self._decode(_ENTRY, lines, numbers, "ledger")
        fields = _fields(_Entry, records)
        classes, class_ok = _class_columns(fields["classes"])
        columns, known = _entry_columns(fields, classes)
        columns["gid"] = self._gids(fields["guarantee"])
        columns["insecure"] = np.array(fields["insecure_seed"], dtype=np.bool_)
        good = _valid_entries(columns, known, classes, class_ok)
        for i in np.flatnonzero(~good).tolist():
            r = records[i]
            problem = _entry_problem(r) or "a field out of range"
            self._malformed("ledger", where[i], f"{r.stream}/{r.mechanism}/{r.slot}: {problem}")
        rows = np.flatnonzero(good)
        if rows.size < good.size:
            records, lines = _select(records, good), _select(lines, good)
            fields = _fields(_Entry, records)
        names = _declared_divisions()
        for record, line in zip(records, lines, strict=True):
            if record.division in names:
                self._declared.setdefault(record.division, []).append(json.loads(line))
        pair = self._pairs_of(fields["stream"], fields["mechanism"])
        columns["pair"] = np.full(good.size, -1, dtype=np.int64)
        columns["pair"][rows] = pair
        self._user_fields(fields, records, pair, "ledger entry")
        first = self._first_copies("ledger", pair, columns["slot"][rows], lines)
        self._keep_entries(columns, classes, rows[first])

    def _keep_entries(
        self, columns: dict[str, NDArray[Any]], classes: dict[str, NDArray[Any]], keep: I64
    ) -> None:
        """Keep the entries at batch positions ``keep`` (valid first copies) and their classes."""
        row = np.full(columns["slot"].size, -1, dtype=np.int64)
        row[keep] = self._rows + np.arange(keep.size)
        self._rows += keep.size
        self._entries.append({name: column[keep] for name, column in columns.items()})
        target = row[classes["row"]]
        kept = target >= 0
        self._classes.append({name: column[kept] for name, column in classes.items()})
        self._classes[-1]["row"] = target[kept]

    def _take_records(
        self, lines: list[bytes], numbers: list[int]
    ) -> tuple[list[bytes], list[int]]:
        """Take the records of another kind than ``ledger`` (halts, others) among ledger lines;
        the entries (or malformed lines) and their numbers are returned. An entry as the flows
        write it is told by its ``"kind":"ledger"`` without decoding it twice."""
        rest, where = [], []
        for line, number in zip(lines, numbers, strict=True):
            if _ENTRY_KIND in line or not self._take_record(line, number):
                rest.append(line)
                where.append(number)
        return rest, where

    def _take_record(self, payload: bytes, number: int) -> bool:
        """Take a halt record (or skip another kind of record, with a note); False when the
        line is no record of another kind (an entry, or no record at all)."""
        try:
            rec = _HALT.decode(payload)
        except msgspec.DecodeError:
            return False
        if rec.kind == "ledger":
            return False
        problem = _schema_problem(rec.schema)
        if problem is not None:
            self._malformed("ledger", number, f"{rec.kind} record: {problem}")
        elif rec.kind == "gap":
            return self._take_gap(rec, number)
        elif rec.kind == "halt" and rec.slot is None:
            self._malformed("ledger", number, "halt record without a slot")
        elif rec.kind == "halt":
            slot, key = int(rec.slot or 0), (rec.stream, rec.mechanism)
            if key not in self._halts and len(self._halts) < PROBLEM_LIMIT:
                who = f"{rec.stream}/{rec.mechanism}" if rec.mechanism else f"stream {rec.stream}"
                self.notes.append(f"{who} halted at slot {slot}: {rec.reason}")
            self._halts[key] = min(slot, self._halts.get(key, slot))
        elif rec.kind not in self._unknown_kinds:
            self._unknown_kinds.add(rec.kind)
            self.notes.append(f"ledger records of kind {rec.kind!r} are not audited")
        return True

    def _take_gap(self, rec: _Halt, number: int) -> bool:
        """Take a gap record: a mechanism's deliberate gap ``first..last`` (a new incarnation's
        cooldown), noted once per gap."""
        if rec.mechanism is None or rec.first is None or rec.last is None or rec.first > rec.last:
            self._malformed("ledger", number, "gap record without a mechanism and slots")
            return True
        gaps = self._gaps.setdefault((rec.stream, rec.mechanism), set())
        if (rec.first, rec.last) not in gaps and len(self.notes) < PROBLEM_LIMIT:
            self.notes.append(
                f"{rec.stream}/{rec.mechanism} released nothing for slots {rec.first}..{rec.last} "
                f"on purpose: {rec.reason}"
            )
        gaps.add((rec.first, rec.last))
        return True

    def finish(self) -> Published:
        """The collected columns as the checks' tables (pending lines are processed first)."""
        self.flush()
        halts: dict[int, int] = {}
        for (stream, mechanism), slot in self._halts.items():
            if mechanism is None:
                targets = [p for (s, _), p in self.pairs.items() if s == stream]
            else:
                targets = [self._pair(stream, mechanism)]
            for p in targets:
                halts[p] = min(slot, halts.get(p, slot))
        releases = _concatenate(self._releases, _RELEASE_DTYPES)
        release_epsilon = np.full(len(self._names), math.nan)
        stated, first = np.unique(releases["pair"], return_index=True)  # each pair's first
        release_epsilon[stated] = releases["epsilon"][first]
        ledger = _concatenate(self._entries, _ENTRY_DTYPES)
        # one scheme per mechanism: plain only when every entry of it is (a uniform baseline
        # whose second class joined later is classwise throughout)
        throughout = np.ones(len(self._names), dtype=np.bool_)
        np.logical_and.at(throughout, ledger["pair"], ledger["plain"])
        ledger["plain"] = throughout[ledger["pair"]]
        return Published(
            pairs=list(self._names),
            release_pair=releases["pair"],
            release_slot=releases["slot"],
            release_epsilon=release_epsilon,
            ledger=LedgerTable(**ledger),
            classes=ClassTable(**_concatenate(self._classes, _CLASS_DTYPES)),
            halts=halts,
            gaps={self._pair(s, m): sorted(g) for (s, m), g in self._gaps.items()},
            releases=releases,
            guarantees=[
                (g.measure, _budget(g), g.delta or 0.0, g.text()) for g in self._guarantee_ids
            ],
            declared=dict(self._declared),
        )


_COUNT_LIMIT = 1 << 40
"""Windows and user counts must stay below this (their int64 window sums cannot overflow)."""
_RELEASE_DTYPES: dict[str, Any] = {
    "pair": np.int64, "slot": np.int64, "epsilon": np.float64, "strategy": np.int64,
    "source": np.int64, "estimate": np.int64, "zero": np.bool_, "gid": np.int64,
    "insecure": np.bool_, "evaluation": np.bool_,
}  # fmt: skip
_ENTRY_KIND = b'"kind":"ledger"'
_ENTRY_DTYPES: dict[str, Any] = {
    "pair": np.int64, "slot": np.int64, "population_division": np.bool_,
    "user_division": np.bool_, "period": np.int64, "mu_spent": np.float64, "plain": np.bool_,
    "epsilon": np.float64, "window": np.int64, "m1": np.float64, "m2": np.float64,
    "users1": np.int64, "users2": np.int64, "window_users": np.int64,
    "pop_epsilon": np.float64, "pop_spent": np.float64, "evaluation": np.bool_,
    "insecure": np.bool_, "gid": np.int64, "declared_division": np.bool_,
}  # fmt: skip
_CLASS_DTYPES: dict[str, Any] = {
    "row": np.int64, "window": np.int64, "epsilon": np.float64, "charged": np.float64,
    "spent": np.float64,
}  # fmt: skip


def _ints(values: Sequence[int]) -> I64:
    """An int64 column; values beyond ±2**40 (JSON integers may be any size) become −1."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        fitting = [v if -_COUNT_LIMIT < v < _COUNT_LIMIT else -1 for v in values]
        return np.array(fitting, dtype=np.int64)


def _floats(values: Sequence[float]) -> F64:
    return np.array(values, dtype=np.float64)


def _select(items: list[Any], mask: Bools) -> list[Any]:
    return [x for x, keep in zip(items, mask.tolist(), strict=True) if keep]


def _concatenate(chunks: list[dict[str, NDArray[Any]]], dtypes: dict[str, Any]) -> dict[str, Any]:
    if not chunks:
        return {name: np.zeros(0, dtype=dtype) for name, dtype in dtypes.items()}
    return {name: np.concatenate([chunk[name] for chunk in chunks]) for name in dtypes}


def _fields(kind: type[msgspec.Struct], records: list[Any]) -> dict[str, tuple[Any, ...]]:
    """The records' fields as columns."""
    return {name: tuple(map(operator.attrgetter(name), records)) for name in kind.__struct_fields__}


def _optional(values: Sequence[float | None]) -> F64:
    """A float column where None (a field a run from an earlier version lacks) is NaN."""
    return np.array(
        [math.nan if v is None else v for v in values] if None in values else values,
        dtype=np.float64,
    )


def _counts(values: Sequence[int | None]) -> I64:
    """An int64 column of optional counts; None (a field the family does not write) is −1."""
    return _ints([-1 if v is None else v for v in values])


def _entry_columns(
    fields: dict[str, tuple[Any, ...]], classes: dict[str, NDArray[Any]]
) -> tuple[dict[str, NDArray[Any]], Bools]:
    """A batch of entries as columns, and which of them are of the audited schema and name a
    known division. ``window`` is the guarantee's (0 for a scope without one); the LDP-IDS
    details are NaN or −1 where a family does not write them, CGM's ``mu_spent`` NaN."""
    division = fields["division"]
    population = np.array(list(map("population".__eq__, division)), dtype=np.bool_)
    user = np.array(list(map("user".__eq__, division)), dtype=np.bool_)
    names = _declared_divisions()
    declared = np.array([d in names for d in division], dtype=np.bool_)
    known = population | user | declared
    known |= np.array(list(map("budget".__eq__, division)), dtype=np.bool_)
    known &= np.array([v in READABLE for v in fields["schema"]], dtype=np.bool_)
    guarantees, details = fields["guarantee"], fields["details"]

    def detail(name: str) -> tuple[Any, ...]:
        return tuple(map(operator.attrgetter(name), details))

    slot = _ints(fields["slot"])
    columns = {
        "slot": slot,
        "population_division": population,
        "epsilon": _budgets(guarantees),
        "window": _ints([0 if g.window is None else g.window for g in guarantees]),
        "m1": _optional(detail("epsilon_m1")),
        "m2": _optional(detail("epsilon_m2")),
        "users1": _counts(detail("users_m1")),
        "users2": _counts(detail("users_m2")),
        "window_users": _counts(detail("window_users")),
        "pop_epsilon": _optional(fields["population_budget"]),
        "pop_spent": _optional(fields["population_spent"]),
        "evaluation": np.array(fields["evaluation"], dtype=np.bool_),
        "user_division": user,
        "declared_division": declared,
        "period": _ints(list(map(_period, guarantees))) if user.any() else np.zeros_like(slot),
        "mu_spent": _optional(detail("mu_spent")),
    }
    scope = np.array([g.scope == "window" for g in guarantees], dtype=np.bool_)
    columns["plain"], columns["own"] = _single_requirement(columns, classes, scope)
    return columns, known


def _period(guarantee: _Guarantee) -> int:
    """The slots after which a user-division guarantee's scope renews: 0 for the whole stream,
    the length of a period scope, −1 for a scope a per-user account is not checked under."""
    length = guarantee.length
    if guarantee.scope == "stream":
        return 0
    if guarantee.scope == "period" and length is not None and 1 <= length < _COUNT_LIMIT:
        return length
    return -1


def _single_requirement(
    columns: dict[str, NDArray[Any]], classes: dict[str, NDArray[Any]], window_scope: Bools
) -> tuple[Bools, Bools]:
    """Entries whose users all share one requirement (``plain``): a w-event guarantee and
    exactly one class, of its window (LDP-IDS, or a uniform baseline over one class), or user
    division and one class (CGM); the population accountant keys them by the population's
    declared ε whatever budget the class states. ``own``: of those, the ones whose class
    states the guarantee's budget."""
    entries = columns["slot"].size
    count = np.bincount(classes["row"], minlength=entries)
    single = np.flatnonzero(count[classes["row"]] == 1)
    rows = classes["row"][single]
    plain, own = np.zeros(entries, dtype=np.bool_), np.zeros(entries, dtype=np.bool_)
    plain[rows] = window_scope[rows] & (classes["window"][single] == columns["window"][rows])
    plain[rows] |= columns["user_division"][rows]
    own[rows] = plain[rows] & close(classes["epsilon"][single], columns["epsilon"][rows])
    return plain, own


def _class_columns(
    classes: tuple[tuple[_ClassSpend, ...], ...],
) -> tuple[dict[str, NDArray[Any]], Bools]:
    """The privacy classes of a batch's entries (``row``: the entry's batch position), and
    which of them are in range."""
    flat = list(chain.from_iterable(classes))

    def column(name: str) -> tuple[Any, ...]:
        return tuple(map(operator.attrgetter(name), flat))

    sizes = np.array([len(x) for x in classes], dtype=np.int64)
    columns = {
        "row": np.repeat(np.arange(sizes.size, dtype=np.int64), sizes),
        "window": _ints(column("scope")),
        "epsilon": _floats(column("budget")),
        "charged": _floats(column("charged")),
        "spent": _floats(column("spent")),
    }
    window, epsilon = columns["window"], columns["epsilon"]
    ok = (window >= 0) & (window < _COUNT_LIMIT) & (epsilon > 0) & (epsilon < math.inf)
    return columns, ok & (np.minimum(columns["charged"], columns["spent"]) >= 0)


def _any_id_field(records: list[Any]) -> bool:
    """Whether any of ``records`` has a field that looks like a raw user id (screened in C)."""
    for name in ("user", "user_id"):
        if tuple(map(operator.attrgetter(name), records)).count(_UNSET) != len(records):
            return True
    return list in map(type, map(operator.attrgetter("users"), records))


def _id_field_rows(fields: dict[str, tuple[Any, ...]], records: list[Any]) -> list[int]:
    """Positions of the records (or their details or classes) with a field like a raw user
    id."""
    candidates: set[int] = set()
    for name in ("user", "user_id", "users"):
        column = fields[name]
        if column.count(_UNSET) != len(column):
            candidates.update(i for i, v in enumerate(column) if v is not _UNSET)
    details = list(fields["details"])
    if _any_id_field(details):
        candidates.update(i for i, d in enumerate(details) if _raw_id_field(d))
    classes = fields.get("classes", ())
    if _any_id_field(list(chain.from_iterable(classes))):
        candidates.update(i for i, c in enumerate(classes) if any(map(_raw_id_field, c)))
    return sorted(i for i in candidates if any(map(_raw_id_field, _parts(records[i]))))


def _valid_entries(
    columns: dict[str, NDArray[Any]],
    known: Bools,
    classes: dict[str, NDArray[Any]],
    class_ok: Bools,
) -> Bools:
    """Which entries of a batch can be audited (``_entry_problem`` says why not, one by one).
    A population-division entry needs one class, the guarantee's, and the LDP-IDS details; a
    user-division entry one class of the guarantee's budget and a stream or period scope."""
    c = columns
    ok = known & (c["slot"] >= 0) & (c["slot"] < MAX_SLOT)
    ok &= (c["epsilon"] > 0) & (c["epsilon"] < math.inf)
    ok &= (c["window"] >= 0) & (c["window"] < _COUNT_LIMIT)
    population = c["own"] & (c["window"] >= 1) & (c["m1"] >= 0) & (c["m2"] >= 0)
    for name in ("users1", "users2", "window_users"):
        population &= (c[name] >= 0) & (c[name] < _COUNT_LIMIT)
    ok &= ~c["population_division"] | population
    ok &= ~c["user_division"] | (c["own"] & (c["period"] >= 0))
    ok &= np.isnan(c["pop_epsilon"]) | ((c["pop_epsilon"] > 0) & (c["pop_epsilon"] < math.inf))
    ok &= np.isnan(c["pop_spent"]) | (c["pop_spent"] >= 0)
    ok[classes["row"][~class_ok]] = False
    unscoped = classes["window"] == 0  # a scope of no window: only a family's own division
    ok[classes["row"][unscoped & ~c["declared_division"][classes["row"]]]] = False
    return ok


def _entry_problem(rec: _Entry) -> str | None:
    """Why a decoded ledger entry cannot be audited, or None (``_valid_entries``, in words)."""
    window, budget = rec.guarantee.window, _budget(rec.guarantee)
    problem = _schema_problem(rec.schema)
    if problem is not None:
        return problem
    if rec.division not in ("budget", "population", "user", *_declared_divisions()):
        return (
            f"division {rec.division!r} is neither budget, population nor user, nor declared "
            "by a discovered family (Family.divisions)"
        )
    if not (0 <= rec.slot < MAX_SLOT and (window is None or 1 <= window < _COUNT_LIMIT)):
        return "slot outside [0, 2**40) or the guarantee's window outside [1, 2**40)"
    if not 0 < budget < math.inf:
        return "the guarantee's budget is not positive and finite"
    pe, ps = rec.population_budget, rec.population_spent
    if (pe is not None and not 0 < pe < math.inf) or (ps is not None and ps < 0):
        return "population_budget not positive and finite, or negative population spend"
    lowest = 0 if rec.division in _declared_divisions() else 1  # 0: no window (lifetime)
    for c in rec.classes:
        if not (lowest <= c.scope < _COUNT_LIMIT and 0 < c.budget < math.inf):
            return (
                f"class (scope={c.scope}, budget={c.budget}) out of range: a scope in "
                "[1, 2**40) slots (0, no window, only in a family's own division) and a "
                "positive finite budget"
            )
        if min(c.charged, c.spent) < 0:
            return f"class (scope={c.scope}, budget={c.budget}) has a negative spend"
    if rec.division == "user":
        return _user_problem(rec)
    return _population_problem(rec) if rec.division == "population" else None


def _declared_divisions() -> frozenset[str]:
    """The divisions a discovered family declares with an audit of its own
    (``DivisionSpec.recompute``); the built-in three are audited here."""
    from privstream.families.registry import families
    from privstream.mechanisms.accounting import DIVISIONS

    families()  # discovery registers the families' divisions
    return frozenset(name for name, d in DIVISIONS.items() if d.recompute is not None)


def _user_problem(rec: _Entry) -> str | None:
    """Why a user-division entry cannot be audited, or None."""
    if _period(rec.guarantee) < 0:
        return "user division needs a stream scope or a period scope of length in [1, 2**40)"
    if len(rec.classes) != 1 or not close(rec.classes[0].budget, _budget(rec.guarantee)):
        return "user division needs one class, of the guarantee's budget"
    return None


def _population_problem(rec: _Entry) -> str | None:
    """Why a population-division entry cannot be audited, or None."""
    d, window, budget = rec.details, rec.guarantee.window, _budget(rec.guarantee)
    one = rec.classes[0] if len(rec.classes) == 1 else None
    own = one is not None and one.scope == window and bool(close(one.budget, budget))
    if rec.guarantee.scope != "window" or not own:
        return "population division needs a w-event guarantee and one class, of its (w, ε)"
    spends, counts = (d.epsilon_m1, d.epsilon_m2), (d.users_m1, d.users_m2, d.window_users)
    if None in spends or None in counts:
        return (
            "population division needs the details epsilon_m1, epsilon_m2, users_m1, "
            "users_m2 and window_users"
        )
    if min(x for x in spends if x is not None) < 0:
        return "negative spend"
    if not all(c is not None and 0 <= c < _COUNT_LIMIT for c in counts):
        return "user counts outside [0, 2**40)"
    return None


# -- reading -------------------------------------------------------------------------------------


class Progress:
    """A progress line on stderr every ``PROGRESS_SECONDS`` while a long read goes on: the
    lines taken so far (pending ones included), or, before the first, that it still waits."""

    def __init__(self) -> None:
        self.started = self.shown = time.monotonic()

    def __call__(self, collector: Collector) -> None:
        now = time.monotonic()
        if now - self.shown < PROGRESS_SECONDS:
            return
        self.shown = now
        print(progress_line(collector, now - self.started), file=sys.stderr, flush=True)


def progress_line(collector: Collector, seconds: float) -> str:
    """What the audit has read after ``seconds``: never "read 0 lines" before the first."""
    if not collector.records:
        return f"audit: nothing read yet after {seconds:.0f} s, waiting for the first line"
    rate = collector.records / max(seconds, 1e-9)
    return (
        f"audit: read {collector.taken('release'):,} release and "
        f"{collector.taken('ledger'):,} ledger lines ({rate:,.0f}/s)"
    )


def read_files(
    releases: str | Path, ledger: str | Path, progress: Callable[[Collector], None] | None = None
) -> Collector:
    """Collect a run's JSON-lines outputs (``FileNotFoundError`` for a missing file)."""
    for path in (releases, ledger):
        if not Path(path).is_file():
            raise FileNotFoundError(f"no such file: {path}")
    collector = Collector()
    for path, source in ((releases, "release"), (ledger, "ledger")):
        with open(path, "rb") as lines:
            while chunk := lines.readlines(1 << 22):
                collector.take(source, [x for x in map(bytes.strip, chunk) if x])
                if progress is not None:
                    progress(collector)
    return collector


def read_topics(
    settings: Any,
    release_topic: str,
    ledger_topic: str,
    idle_seconds: float = 2.0,
    progress: Callable[[Collector], None] | None = None,
) -> Collector:
    """Collect a run's release and ledger topics (``settings``: ``KafkaSettings``) from the
    beginning, until no message has arrived for ``idle_seconds``: the end of a topic is not
    asked of the broker (Tansu's high watermarks are wrong). A missing topic is
    ``TopicMissing`` (never created), an unreadable one ``ConnectionError``."""
    from privstream.connectors.kafka import read_until_idle

    if release_topic == ledger_topic:
        raise ValueError("the release and ledger topics must differ")
    collector = Collector()
    sources = {release_topic: "release", ledger_topic: "ledger"}
    tombstones = 0
    for messages in read_until_idle(settings, [release_topic, ledger_topic], idle_seconds):
        batch, empty = _values(messages, sources)
        tombstones += empty
        for source, values in batch.items():
            collector.take(source, values)
        if progress is not None:
            progress(collector)
    if tombstones:
        collector.notes.append(f"{tombstones} empty messages (tombstones) skipped")
    return collector


def _values(messages: list[Any], sources: dict[str, str]) -> tuple[dict[str, list[bytes]], int]:
    """The stripped values of ``messages`` per source (``sources``: topic → source) and how
    many were empty (tombstones)."""
    batch: dict[str, list[bytes]] = {"release": [], "ledger": []}
    empty = 0
    for message in messages:
        value = (message.value() or b"").strip()
        if value:
            batch[sources[message.topic() or ""]].append(value)
        else:
            empty += 1
    return batch, empty


# -- the report ----------------------------------------------------------------------------------


def _check(failures: int, detail: str) -> dict[str, Any]:
    """A check that holds when it counted no failure."""
    return {"ok": failures == 0, "count": failures, "detail": detail}


def _checks(
    collector: Collector,
    pub: Published,
    slots: SlotCounts,
    windows: WindowCounts,
    accountant: AccountantCounts,
    population: int | None,
) -> dict[str, dict[str, Any]]:
    """Every check's verdict, count and detail (``something_read`` aside)."""
    return {
        "well_formed": _check(collector.malformed, (
            f"{collector.lines['release']} release and {collector.lines['ledger']} ledger "
            f"lines read, {collector.malformed} not of the schema"
        )),
        "complete_slots": _check(slots.missing + slots.after_halt + slots.in_gap, (
            f"{slots.expected} slots expected over {len(pub.pairs)} (stream, mechanism) pairs, "
            f"{slots.missing} missing, {slots.halted} pairs halted, {slots.after_halt} "
            f"outputs after a halt, {slots.gap_slots} slots of recorded gaps, {slots.in_gap} "
            "outputs inside one"
        )),
        "unique_payloads": _check(collector.conflicting, (
            f"{collector.duplicates} duplicate copies (at-least-once output), "
            f"{collector.conflicting} with a payload that differs from an earlier copy"
        )),
        "window_budget": _check(windows.over_budget + windows.over_users + windows.user_spends, (
            f"{windows.over_budget} windows over a mechanism's or class's budget, "
            f"{windows.over_users} over n={population} users, {windows.user_spends} per-user "
            "spends their charges cannot explain"
        )),
        "declared_spend": _check(windows.mismatches + accountant.mismatches, (
            f"{windows.mismatches} declared window spends or user counts and "
            f"{accountant.mismatches} population_spent differ from the recomputation"
        )),
        "population_accountant": _check(accountant.over_budget, (
            f"{accountant.over_budget} (stream, class, slot) windows over the population's budget"
        )),
        "no_user_ids": _check(collector.user_fields, (
            f"{collector.user_fields} outputs with a raw user id field"
        )),
    }  # fmt: skip


def _claim_checks(claims: ClaimCounts, expect: Expectation) -> dict[str, dict[str, Any]]:
    """The verdicts of the checks on what the outputs claim (``privstream.audit.claims``)."""
    checks = {
        "secure_noise": _check(claims.insecure, (
            "insecure-seed outputs allowed (--allow-insecure-seed): a test run, not private"
            if expect.allow_insecure_seed else
            f"{claims.insecure} releases and ledger entries marked insecure_seed"
        )),
        "not_evaluation": _check(claims.evaluation, (
            "evaluation outputs allowed (--allow-evaluation): together over the budget"
            if expect.allow_evaluation else
            f"{claims.evaluation} releases and ledger entries marked evaluation"
        )),
        "repeated_publications": _check(claims.repeats, (
            f"{claims.repeats} approximate/nullified releases that do not repeat their source "
            "publication exactly, or publications not at their slot or not charged"
        )),
        "stated_guarantee": _check(claims.stated, (
            f"{claims.stated} releases stating another guarantee or flags than their ledger "
            "entry, or (stream, slot)s whose mechanisms' budgets sum over the population's ε"
        )),
        "expected_budget": _check(claims.budget, claims.budget_detail),
    }  # fmt: skip
    if expect.flow is not None:
        checks["flow_file"] = _check(
            claims.flow,
            (
                f"{claims.flow} streams not in {expect.flow.path} or entries whose population budget "
                "is not the file's share × ε"
            ),
        )
    return checks


def _judge_claims(
    pub: Published, accountant: AccountantCounts, expect: Expectation, findings: Findings
) -> ClaimCounts:
    """Run the claim checks (``privstream.audit.claims``)."""
    claims = ClaimCounts()
    check_flags(pub, expect, findings, claims)
    check_sources(pub, findings, claims)
    check_stated(pub, findings, claims)
    if expect.flow is not None:
        check_flow(pub, expect.flow, findings, claims)
    check_expected(pub, accountant.streams, expect, findings, claims)
    return claims


def audit(
    collector: Collector,
    *,
    population: int | None = None,
    expect_slots: int | None = None,
    expect: Expectation | None = None,
) -> dict[str, Any]:
    """Run every check over what ``collector`` read; the report ``privstream audit`` prints.

    ``ok`` holds exactly when every check holds. ``problems`` are the first 50 found (in the
    order of the checks), ``notes`` say what could not be checked and why. ``expect``: what the
    operator expects (budget, allowed insecure or evaluation outputs, the flow file); without
    an expected budget ``expected_budget`` fails.
    """
    expect = expect or Expectation()
    pub = collector.finish()
    findings = Findings(notes=list(collector.notes))

    def replay(check: str) -> None:
        for kind, ident, detail in collector.problems[check]:
            findings.add(kind, ident, detail)

    replay("well_formed")
    slots = check_slots(pub, expect_slots, findings)
    replay("unique_payloads")
    windows = check_windows(pub, population, findings)
    accountant = check_accountant(pub, findings)
    replay("no_user_ids")
    claims = _judge_claims(pub, accountant, expect, findings)
    if population is None and bool(pub.ledger.population_division.any()):
        findings.notes.append(
            "population-division windows not checked against n: give --population N"
        )
    distinct = collector.distinct
    read = distinct["release"] + distinct["ledger"]
    checks = {
        **_checks(collector, pub, slots, windows, accountant, population),
        **_claim_checks(claims, expect),
    }
    # An empty output is no evidence of a healthy run (a wrong topic, a run that never wrote).
    checks["something_read"] = {
        "ok": read > 0,
        "count": read,
        "detail": "releases and ledger entries read" if read else "nothing was read",
    }
    return {
        "ok": all(c["ok"] for c in checks.values()),
        "checks": checks,
        "counts": _report_counts(collector, pub, slots, windows, accountant, claims, checks),
        "budget": _report_budget(pub, expect, claims),
        "problems": findings.problems,
        "notes": findings.notes,
    }


def _report_budget(pub: Published, expect: Expectation, claims: ClaimCounts) -> dict[str, Any]:
    """The budget expected (ε, δ: ``--max-epsilon``/``--max-delta`` or the flow file's), the
    budget found (all streams composed at their worst slot, as ε at the expected δ; ``None``
    when it could not be composed) and every distinct guarantee stated, in its own units."""
    return {
        "expected": {"epsilon": expect.epsilon, "delta": expect.delta},
        "found": {"epsilon": claims.worst if claims.composed else None},
        "guarantees": [text for _measure, _budget, _delta, text in pub.guarantees],
    }


def _report_counts(
    collector: Collector,
    pub: Published,
    slots: SlotCounts,
    windows: WindowCounts,
    accountant: AccountantCounts,
    claims: ClaimCounts,
    checks: dict[str, Any],
) -> dict[str, int]:
    """The report's counts: what was read and what each check found."""
    distinct = collector.distinct
    return {
        "releases": distinct["release"],
        "ledger_entries": distinct["ledger"],
        "streams": len({stream for stream, _ in pub.pairs}),
        "mechanisms": len(set(pub.bases)),
        "slots_expected": slots.expected,
        "missing_slots": slots.missing,
        "halted": slots.halted,
        "duplicates": collector.duplicates,
        "conflicting_duplicates": collector.conflicting,
        "windows_over_budget": windows.over_budget,
        "windows_over_users": windows.over_users,
        "population_over_budget": accountant.over_budget,
        "declared_mismatches": checks["declared_spend"]["count"],
        "insecure_outputs": claims.insecure,
        "evaluation_outputs": claims.evaluation,
        "unfaithful_repeats": claims.repeats,
        "stated_mismatches": claims.stated,
        "over_expected_budget": claims.budget,
    }


def collect(args: argparse.Namespace) -> Collector:
    """Read what ``privstream audit``'s flags name: two files, or two topics."""
    progress = None if args.no_progress else Progress()
    files, topics = (args.releases, args.ledger), (args.release_topic, args.ledger_topic)
    if any(files) and any(topics):
        raise ValueError("audit files (--releases, --ledger) or topics, not both")
    if any(files):
        if not all(files):
            raise ValueError("a file audit needs both --releases FILE and --ledger FILE")
        return read_files(args.releases, args.ledger, progress)
    if not all(topics):
        raise ValueError(
            "name what to audit: --releases FILE --ledger FILE, or --release-topic TOPIC "
            "--ledger-topic TOPIC with --bootstrap"
        )
    from privstream.connectors.kafka import KafkaSettings

    settings = KafkaSettings.from_options(args.bootstrap, args.kafka_config)
    return read_topics(settings, args.release_topic, args.ledger_topic, args.idle_seconds, progress)


def _flow_plan(path: str) -> tuple[FlowPlan, int]:
    """The flow file's population budget, streams' shares and n (``flow_config.load``,
    imported here only: the audit's checks share no code with the flows)."""
    from privstream.flows.config import load

    flow = load(path)
    population = flow.population
    delta = getattr(population, "delta", None)  # a flow file may state the population's δ
    plan = FlowPlan(
        epsilon=population.epsilon,
        window=population.window,
        shares={s.name: s.share for s in flow.streams},
        delta=None if delta is None else float(delta),
        path=str(path),
    )
    return plan, population.users


def expectation(args: argparse.Namespace) -> tuple[Expectation, int | None]:
    """What ``privstream audit``'s flags expect of the outputs, and n (``--population``, else
    the flow file's)."""
    flow, users = (None, None) if args.config is None else _flow_plan(args.config)
    expect = Expectation(
        max_epsilon=args.max_epsilon,
        max_delta=args.max_delta,
        allow_insecure_seed=args.allow_insecure_seed,
        allow_evaluation=args.allow_evaluation,
        flow=flow,
    )
    return expect, args.population if args.population is not None else users


JSON_STDOUT = "-"
"""``--json`` without a file (or ``--json -``): the JSON report on stdout instead of the
summary."""


def main(args: argparse.Namespace) -> int:
    """``privstream audit``: print the summary (``privstream.audit.summary``; the JSON report
    with ``--json``, or the summary and the report in ``--json FILE``); 0 when every check
    holds, 1 when one fails (input errors raise: the CLI turns them into 2). With
    ``--metrics-port`` the verdict is served for ``--linger`` seconds afterwards (also when
    the inputs could not be read: then it says the audit failed)."""
    from privstream.audit.metrics import AuditMetrics

    started = time.perf_counter()
    metrics = (
        None if args.metrics_port is None else AuditMetrics(args.metrics_port, args.metrics_addr)
    )
    try:
        expect, population = expectation(args)
        collector = collect(args)
    except Exception:
        if metrics is not None:
            metrics.record(None, time.time())
            metrics.linger(args.linger)
        raise
    report = audit(collector, population=population, expect_slots=args.expect_slots, expect=expect)
    text = json.dumps(report, indent=2)
    print(text if args.json == JSON_STDOUT else summary(report))
    if args.json not in (None, JSON_STDOUT):
        Path(args.json).write_text(text + "\n")
    failed = [name for name, check in report["checks"].items() if not check["ok"]]
    print(
        f"audit: {'FAILED ' + ', '.join(failed) if failed else 'ok'} "
        f"({collector.records:,} lines in {time.perf_counter() - started:.1f} s)",
        file=sys.stderr,
    )
    if metrics is not None:
        metrics.record(report, time.time())
        metrics.linger(args.linger)
    return 0 if report["ok"] else 1
