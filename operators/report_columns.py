"""The columnar state of the ``ldp-reports`` server stage (issue 23): devices as rows of a
directory, their rate limit and accepted pairs as arrays, and each open request's reports kept
as the oracle's sufficient statistic instead of ``Report`` objects.

``DeviceSeen`` is a ``schema.protocol.SeenReports`` for one stream whose per-device history
lives in arrays: ``check_reports`` (the per-report path) and ``take_columns`` (a run of
reports as ``schema.report_wire.ReportColumns``) read and write the same state, so a
report gets the same verdict whichever path it takes. ``Tally`` is what a request keeps of its
accepted reports: GRR's and OUE's counts, OLH's ``(a, b, y)`` rows, HM's values and CGM's rows
(with the devices' rows, to put them in device-id order at close).

Guarantee: as ``schema.protocol.check_reports`` (each report judged on itself, the open
requests and its own device's history; the same reason for every refusal), and a round's
answer is the one ``mechanisms.report_port.aggregate`` gives over its accepted reports. Nothing
here holds a raw value: the tallies hold perturbed reports only, the directory the devices'
pseudonyms (as the rate limit's history did before).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.report_port import (
    Answer,
    aggregate_support,
    aggregate_wire,
    wire_array,
)
from privstream.mechanisms.tasks import EstimationTask
from privstream.schema.events import DeadLetter
from privstream.schema.protocol import (
    OLH_PRIME,
    OracleSpec,
    ProtocolError,
    Request,
    SeenReports,
    olh_g,
    rate_limited,
    refused,
    stream_now,
    verdict,
)
from privstream.schema.report_wire import Key, ReportColumns

Rows = NDArray[np.int64]


@dataclass(eq=False)
class DeviceSeen(SeenReports):
    """``SeenReports`` of ``stream`` with its devices' history in arrays (module docstring):
    ``counts[row, s mod window]`` the attempts of slot ``s`` (the columns hold the window
    ending at ``latest``, the stream's current slot, which never goes back), ``got[request]``
    which rows have an accepted report to that open request. Other streams (``"?"``) keep the
    dictionary of the base class."""

    stream: str = ""
    ids: dict[str, int] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    counts: NDArray[Any] = field(default_factory=lambda: np.zeros((0, 0), np.uint16))
    latest: int = -1
    got: dict[str, NDArray[np.bool_]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        dtype = np.uint16 if self.per_window < np.iinfo(np.uint16).max else np.int64
        self.counts = np.zeros((0, self.window), dtype)

    def __getstate__(self) -> dict[str, Any]:
        """The snapshot: the arrays cut to the devices known (they grow by doubling)."""
        state = dict(self.__dict__)
        known = len(self.names)
        state["counts"] = self.counts[:known].copy()
        state["got"] = {rid: bits[:known].copy() for rid, bits in self.got.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def rows(self, devices: list[str]) -> Rows:
        """The directory rows of ``devices`` (new ones added)."""
        found = list(map(self.ids.get, devices))
        if None in found:
            for i, device in enumerate(devices):
                if found[i] is None:
                    found[i] = self._row(device)
        return np.fromiter(found, np.int64, len(found))

    def _row(self, device: str) -> int:
        row = self.ids.get(device)
        if row is None:
            row = self.ids[device] = len(self.names)
            self.names.append(device)
            if row >= self.counts.shape[0]:
                grown = np.zeros((max(64, 2 * row), self.window), self.counts.dtype)
                grown[: self.counts.shape[0]] = self.counts
                self.counts = grown
        return row

    def admit(self, device: str, stream: str, slot: int, now: int) -> bool:
        if stream != self.stream:
            return super().admit(device, stream, slot, now)
        ok = self.admit_rows(self.rows([device]), np.array([slot], np.int64), now)
        return bool(ok[0])

    def admit_rows(self, rows: Rows, slots: Rows, now: int) -> NDArray[np.bool_]:
        """Count one attempt per entry of ``rows`` (at its slot, clamped into the window
        ending at ``now``), in order: False where the window already holds ``per_window``."""
        self._roll(now)
        low = now - self.window + 1
        rank = _occurrence(rows)
        ok: NDArray[np.bool_] = (
            self.counts[rows].sum(axis=1, dtype=np.int64) + rank < self.per_window
        )
        where = (rows[ok], np.clip(slots[ok], low, now) % self.window)
        if rank.any():
            np.add.at(self.counts, where, 1)
        else:
            self.counts[where] += 1
        return ok

    def _roll(self, now: int) -> None:
        """Empty the columns of the slots that leave the window ending at ``now``."""
        for s in range(max(self.latest + 1, now - self.window + 1), now + 1):
            self.counts[:, s % self.window] = 0
        self.latest = max(self.latest, now)

    def has(self, request: str, device: str) -> bool:
        row, bits = self.ids.get(device), self.got.get(request)
        return row is not None and bits is not None and row < len(bits) and bool(bits[row])

    def add(self, request: str, device: str) -> None:
        self.mark(request, self.rows([device]))

    def accepted_rows(self, request: str, rows: Rows) -> NDArray[np.bool_]:
        bits = self.got.get(request)
        return np.zeros(len(rows), bool) if bits is None else self._bits(request)[rows]

    def mark(self, request: str, rows: Rows) -> None:
        self._bits(request)[rows] = True

    def _bits(self, request: str) -> NDArray[np.bool_]:
        bits = self.got.get(request)
        if bits is None or len(bits) < self.counts.shape[0]:
            grown = np.zeros(self.counts.shape[0], bool)
            if bits is not None:
                grown[: len(bits)] = bits
            bits = self.got[request] = grown
        return bits

    def close(self, request: Request) -> None:
        super().close(request)
        self.got.pop(request.id, None)


def _occurrence(rows: Rows) -> Rows:
    """For each entry, how many earlier entries hold the same row."""
    order = np.argsort(rows, kind="stable")
    ranked = rows[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    lengths = np.diff(np.r_[starts, len(rows)])
    out = np.empty(len(rows), np.int64)
    out[order] = np.arange(len(rows)) - np.repeat(starts, lengths)
    return out


@dataclass(eq=False)
class Tally:
    """One open request's accepted reports as its oracle's sufficient statistic (module
    docstring); ``len`` is their number."""

    spec: OracleSpec
    m: int = 0
    counts: NDArray[np.int64] | None = None
    parts: list[NDArray[Any]] = field(default_factory=list)
    rows: list[Rows] = field(default_factory=list)

    def __len__(self) -> int:
        return self.m

    def add(self, rows: Rows, wire: NDArray[Any]) -> None:
        """Add the reports of directory ``rows`` with their wire values ``wire``."""
        self.m += len(rows)
        name, d = self.spec.name, self.spec.d
        if name in ("GRR", "OUE"):
            counts = np.bincount(wire, minlength=d) if name == "GRR" else wire.sum(axis=0)
            self.counts = counts.astype(np.int64) + (0 if self.counts is None else self.counts)
        else:
            self.parts.append(wire)
            self.rows.append(rows)

    def answer(self, request: Request, task: EstimationTask, names: list[str]) -> Answer:
        """The round's answer: ``aggregate`` (or CGM's ``report_rows``) over these reports."""
        spec, eps = request.oracle, request.epsilon
        if spec.name in ("GRR", "OUE"):
            counts = np.zeros(spec.d, np.int64) if self.counts is None else self.counts
            return aggregate_support(spec, eps, task, counts.astype(np.float64), self.m)
        empty = wire_array(spec, [])
        wire = np.concatenate(self.parts) if self.parts else empty
        if spec.name in ("HM", "CGM"):  # float sums: in device-id order, as always
            rows = np.concatenate(self.rows) if self.rows else np.zeros(0, np.int64)
            wire = wire[sorted(range(len(rows)), key=lambda i: names[rows[i]])]
            if spec.name == "CGM":
                return np.asarray(wire, np.float64).reshape(self.m, spec.d + 1)
        return aggregate_wire(spec, eps, task, wire, self.m)


def take_columns(
    run: ReportColumns,
    requests: dict[str, Request],
    seen: DeviceSeen,
    tallies: dict[str, Tally],
) -> list[DeadLetter]:
    """Judge ``run`` as ``check_reports`` judges its reports one by one, add the accepted ones
    to their requests' ``tallies`` and return the dead letters, in order."""
    now = stream_now(requests, seen)[run.stream]
    rows = seen.rows(run.devices())
    groups = run.groups()
    slots = np.zeros(len(rows), np.int64)
    for key, idx in groups:
        slots[idx] = key[2]
    admitted = seen.admit_rows(rows, slots, now)
    accepted = np.zeros(len(rows), bool)
    values = run.values()
    for key, idx in groups:
        req = requests.get(key[0])
        if req is not None and _matches(key, req):
            _take_group(req, idx[admitted[idx]], rows, values, run, seen, tallies, accepted)
    dead = []
    for i in np.flatnonzero(~accepted).tolist():
        report = run.report(i)
        why = rate_limited(seen) if not admitted[i] else verdict(report, requests, seen)
        if why is None:
            raise AssertionError("a report the columns refused passes every check")
        dead.append(refused(why, report))
    return dead


def _matches(key: Key, req: Request) -> bool:
    """Whether reports with these shared fields answer ``req`` with its oracle and budget."""
    _, stream, slot, round_, purpose, oracle, epsilon = key
    coords = (req.stream, req.slot, req.round, req.purpose)
    return coords == (stream, slot, round_, purpose) and (oracle, epsilon) == (
        req.oracle.name, req.epsilon)  # fmt: skip


def _take_group(
    req: Request,
    idx: NDArray[np.intp],
    rows: Rows,
    values: list[Any],
    run: ReportColumns,
    seen: DeviceSeen,
    tallies: dict[str, Tally],
    accepted: NDArray[np.bool_],
) -> None:
    """Accept the reports ``idx`` of one request that the rule asks, of the right shape and
    the first of their device to it."""
    if req.select.rule != "all":
        devices = run.devices()
        idx = idx[np.fromiter((req.asks(devices[i]) for i in idx.tolist()), bool, len(idx))]
    mine_values = values if len(idx) == len(values) else [values[i] for i in idx.tolist()]
    ok, wire = wire_of(req.oracle, req.epsilon, mine_values)
    idx = idx[ok]
    mine = rows[idx]
    first = np.zeros(len(idx), bool)
    first[np.unique(mine, return_index=True)[1]] = True
    keep = first & ~seen.accepted_rows(req.id, mine)
    seen.mark(req.id, mine[keep])
    tallies[req.id].add(mine[keep], wire[keep])
    accepted[idx[keep]] = True


def wire_of(spec: OracleSpec, eps: float, values: list[Any]) -> tuple[NDArray[np.bool_], Any]:
    """Which ``values`` have the shape ``spec.shape_error`` accepts, and those values as the
    oracle's wire array; vectorised for the usual GRR, OUE and OLH runs."""
    try:
        fast = _wire_fast(spec, eps, values)
    except (OverflowError, ValueError, TypeError):
        fast = None
    if fast is not None:
        return fast
    ok = np.array([spec.shape_error(v, eps) is None for v in values], bool)
    return ok, wire_array(spec, list(itertools.compress(values, ok)))


def _wire_fast(
    spec: OracleSpec, eps: float, values: list[Any]
) -> tuple[NDArray[np.bool_], Any] | None:
    """``wire_of`` without a Python step per value, or None where the types call for it."""
    m, d = len(values), spec.d
    if m == 0 or set(map(type, values)) != {"GRR": {int}, "OUE": {str}, "OLH": {list}}.get(
        spec.name
    ):
        return None
    if spec.name == "GRR":
        grr = np.fromiter(values, np.int64, m)
        ok = (grr >= 0) & (grr < d)
        return ok, grr[ok]
    if spec.name == "OUE":
        codes = np.frombuffer("".join(values).encode(), np.uint8)
        if set(map(len, values)) != {d} or len(codes) != m * d:
            return None
        bits = (codes - ord("0")).reshape(m, d)
        ok = np.asarray((bits <= 1).all(axis=1))
        return ok, bits[ok].astype(bool)
    flat = list(itertools.chain.from_iterable(values))
    if set(map(len, values)) != {3} or set(map(type, flat)) != {int}:
        return None
    olh = np.fromiter(flat, np.int64, 3 * m).reshape(m, 3)
    a, b, y = olh[:, 0], olh[:, 1], olh[:, 2]
    ok = (a >= 1) & (a < OLH_PRIME) & (b >= 0) & (b < OLH_PRIME) & (y >= 0) & (y < olh_g(eps))
    return ok, olh[ok]


__all__ = ["DeviceSeen", "ProtocolError", "Tally", "take_columns", "wire_of"]
