"""SaO2's device side behind a shuffler (spec sao2 §3.1, §3.2, §4.3, §4.4, §10.2, §10.3; issue 25):
the standard library only.

The server publishes one task per stream and horizon (``privstream.schema.shuffle.Sao2Task``, as
its JSON object); the device reads it as a plain dict, checks it and recomputes its id, finds
its own level with the task's public rule (a keyed BLAKE2b of its id under the task's salt, split
by the level weights: the server names no device), and, if its own lifetime ledger holds one more
horizon, charges it and runs the horizon: at every slot it takes its current value (a category
index or a bitmask; no new value carries the last one forward, and a device that never had one
reads ``x = 0``), clips the stream to ``s`` changes (CLIP-STREAM), and at every end of a block of
its level (``τ ≡ 0 mod r^h``) forms the residue (Algorithm 1) and runs that block's step of online
ExSub (Algorithm 4), sending one report (``Sao2Report``'s JSON object) with the block's symbols
``(coordinate in [0, d), sign)``, possibly none.

It is the device path of the server's simulation, ``mechanisms.sao2_encoding.ExSubDevice``
(``LevelEncoder`` + ``OnlineExSubUser``): the same subgroup table (exact integer binomials, the
same float formulas, bit for bit), the same draws in the same order (a uniform is
``bits(53)/2^53``), so fed the same uniforms both emit the same symbols
(tests/client/test_sao2_device.py).

**Privacy.** User-level ε-LDP per horizon: the symbols a device sends over a horizon are the real
part of one ``(d·T_h + s, s, ε, m_h)``-ExSub output of its clipped stream (stub symbols are never
sent, post-processing), and the level and the report times (every block end of the level, with
or without symbols) do not depend on the data. The device's own lifetime ledger charges ε at a
horizon's start and refuses a horizon that would take the stream past its lifetime ε (pinned at
the first enrolment: a server cannot raise it), so the device is ε_life-LDP over the stream's
life whatever the server asks. Randomness is the OS CSPRNG by default; the subgroup ``(a, b)`` is
drawn on the device (erratum A5). Reports carry the device id (the shuffler strips it), never a
raw value.

**Store.** With a ``FileStore`` (a file of its own), the ledger and the running horizon's state are
written before ``begin`` returns and before a block's report is returned, so a restarted device
resumes its horizon (``begin`` with the same task) and never draws a sent block twice; the clip
state between block ends is not written: a restart there only changes the input it randomises
(still at most ``s`` changes).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, Final

from privstream.client.ledger import RELATIVE_TOLERANCE, Refusal
from privstream.client.randomizers import Randomness, SystemRandomness, uniform
from privstream.client.store import FileStore, StoreError

VERSION: Final = 1
TASK_TYPE: Final = "privstream.sao2.task"
REPORT_TYPE: Final = "privstream.sao2.report"
KINDS: Final = ("onehot", "bits")
BITS_LIMIT: Final = 52
"""The widest bitmask (as the server's ``BinaryTask``)."""
MAX_ID_CHARS: Final = 256
MAX_D_PRIME: Final = 1 << 22
"""The largest ExSub domain ``d'_h`` the device runs (its work per horizon is ``O(d'_h)``)."""
_HEX = re.compile(r"[0-9a-f]{32}")
_TASK_FIELDS: Final = ("type", "version", "stream", "horizon", "first_slot", "T", "r", "s", "d",
                       "kind", "epsilon", "lifetime_epsilon", "m", "weights", "salt")  # fmt: skip
_INT_LOW: Final = {"horizon": 0, "first_slot": 1, "T": 1, "r": 2, "s": 1, "d": 1}
_STORE_KEY: Final = "sao2"


def canonical(obj: Any) -> str:
    """The one JSON text of ``obj`` (= ``privstream.schema.protocol.canonical``)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)  # fmt: skip


def task_digest(body: Mapping[str, Any]) -> str:
    """The task id: BLAKE2b-128 (person ``ps-sao2-task``) of the length-prefixed canonical body
    (= ``Sao2Task.id``)."""
    part = canonical(dict(body)).encode()
    h = hashlib.blake2b(digest_size=16, person=b"ps-sao2-task")
    h.update(len(part).to_bytes(8, "little"))
    h.update(part)
    return h.hexdigest()


def lengths(T: int, r: int) -> tuple[int, ...]:
    """``T_h = ⌊T / r^h⌋`` for every level ``h`` with ``r^h ≤ T``."""
    out, width = [], 1
    while width <= T:
        out.append(T // width)
        width *= r
    return tuple(out)


def level_of(weights: Sequence[float], salt: str, device: str) -> int:
    """The device's level (= ``Sao2Task.level_of``): ``u = H(salt, device)`` as a uniform in
    ``[0, 1)``, then the first level whose cumulative weight passes ``u``. Public and
    data-independent: the salt is drawn by the server before any report."""
    h = hashlib.blake2b(digest_size=8, person=b"ps-sao2-level", key=bytes.fromhex(salt))
    h.update(device.encode())
    u = int.from_bytes(h.digest(), "big") / 2**64
    total = 0.0
    for level, w in enumerate(weights):
        total += w
        if u < total:
            return level
    return max(i for i, w in enumerate(weights) if w > 0)


# -- the task --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskView:
    """A checked task: its public parameters, ``body`` (the fields the id digests) and ``id``."""

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
    id: str

    @property
    def body(self) -> dict[str, Any]:
        return {"type": TASK_TYPE, "version": VERSION, "stream": self.stream,
                "horizon": self.horizon, "first_slot": self.first_slot, "T": self.T,
                "r": self.r, "s": self.s, "d": self.d, "kind": self.kind,
                "epsilon": self.epsilon, "lifetime_epsilon": self.lifetime_epsilon,
                "m": list(self.m), "weights": list(self.weights), "salt": self.salt}  # fmt: skip

    def d_prime(self, level: int) -> int:
        """``d'_h = d·T_h + s`` (spec §4.1: ``s`` stub coordinates)."""
        return self.d * lengths(self.T, self.r)[level] + self.s


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"the task's {name} must be a number")
    try:
        out = float(value)
    except OverflowError:
        raise ValueError(f"the task's {name} must be a finite number") from None
    if not math.isfinite(out):
        raise ValueError(f"the task's {name} must be a finite number")
    return out


def read_task(obj: Any) -> TaskView:
    """The task the server published (its JSON object), checked as ``Sao2Task.from_obj`` does
    and as far as the device relies on it (``m_h ≤ d'_h ≤ MAX_D_PRIME``); the id is recomputed
    and a stated ``id`` must equal it. ``ValueError`` names what is wrong."""
    if not isinstance(obj, Mapping):
        raise ValueError("a SaO2 task must be a JSON object")
    extra = sorted(set(obj) - {*_TASK_FIELDS, "id"})
    missing = [k for k in _TASK_FIELDS if k not in obj]
    if extra or missing:
        raise ValueError(f"a SaO2 task has no field {extra} and needs {missing}")
    if obj["type"] != TASK_TYPE or obj["version"] != VERSION or isinstance(obj["version"], bool):
        raise ValueError(f"not a {TASK_TYPE} of version {VERSION}")
    for name, low in _INT_LOW.items():
        if not _is_int(obj[name]) or obj[name] < low:
            raise ValueError(f"the task's {name} must be an integer >= {low}")
    for name in ("stream", "salt"):
        if not isinstance(obj[name], str) or not 0 < len(obj[name]) <= MAX_ID_CHARS:
            raise ValueError(f"the task's {name} must be a string of 1..{MAX_ID_CHARS} chars")
    if not _HEX.fullmatch(obj["salt"]) or obj["kind"] not in KINDS:
        raise ValueError(f"the task's salt must be 32 hex digits and its kind one of {KINDS}")
    raw_m, raw_w = obj["m"], obj["weights"]
    if not isinstance(raw_m, list) or not isinstance(raw_w, list):
        raise ValueError("the task's m and weights must be lists")
    weights = tuple(_number(w, "weights[]") for w in raw_w)
    if not all(_is_int(v) for v in raw_m):
        raise ValueError("the task's m must list integers")
    view = TaskView(obj["stream"], obj["horizon"], obj["first_slot"], obj["T"], obj["r"],
                    obj["s"], obj["d"], obj["kind"], _number(obj["epsilon"], "epsilon"),
                    _number(obj["lifetime_epsilon"], "lifetime_epsilon"), tuple(raw_m), weights,
                    obj["salt"], "")  # fmt: skip
    _check_shape(view)
    digest = task_digest(view.body)
    if obj.get("id", digest) != digest:
        raise ValueError("the task's id is not the digest of its encoding")
    return dataclasses.replace(view, id=digest)


def _check_shape(view: TaskView) -> None:
    """The checks of ``Sao2Task.__post_init__`` the device relies on, and its own bounds."""
    if not 0 < view.epsilon <= view.lifetime_epsilon:
        raise ValueError("the task needs 0 < epsilon <= lifetime_epsilon")
    if view.kind == "bits" and view.d > BITS_LIMIT:
        raise ValueError(f"a bitmask task holds at most {BITS_LIMIT} bits")
    H = len(lengths(view.T, view.r))
    if len(view.m) != H or len(view.weights) != H:
        raise ValueError(f"the task's m and weights need one entry per level ({H})")
    if any(w < 0 for w in view.weights) or abs(sum(view.weights) - 1) > 1e-9:
        raise ValueError("the level weights must be >= 0 and sum to 1")
    for h, m in enumerate(view.m):
        if not 1 <= m <= view.d_prime(h) <= MAX_D_PRIME:
            raise ValueError(f"level {h}: need 1 <= m_h <= d'_h <= {MAX_D_PRIME}")


# -- ExSub's public subgroup table (spec §4.2, §4.3) -----------------------------------------


def _comb(a: int, b: int) -> int:
    """``C(a, b)``, 0 outside ``0 ≤ b ≤ a`` (spec §0)."""
    return math.comb(a, b) if 0 <= b <= a else 0


@dataclass(frozen=True)
class SubgroupTable:
    """The law of the subgroup ``(a, b)`` = (#trues, #reverses): ``pairs`` in the server's order
    (``a`` then ``b`` ascending, empty subgroups left out) and the CDF (last entry exactly 1)."""

    pairs: tuple[tuple[int, int], ...]
    cdf: tuple[float, ...]

    def draw(self, u: float) -> tuple[int, int]:
        """Inverse CDF (= ``SubgroupLaw.draw``): the first pair whose CDF entry exceeds ``u``."""
        return self.pairs[min(bisect.bisect_right(self.cdf, u), len(self.pairs) - 1)]


@lru_cache(maxsize=256)
def subgroup_table(d_prime: int, s: int, eps: float, m: int) -> SubgroupTable:
    """``P(a, b) = l(a, b)·w(a)/Ω``, ``l(a, b) = C(s,a)·C(s−a,b)·C(d'−s,c)·2^c``, ``w(0) = e^{−ε}``
    else 1 (spec §4.3, erratum A2), with ``C1 = 2^m C(d', m)``, ``C2 = Σ_k C(s,k)·C(d'−s,m−k)
    ·2^{m−k}`` and ``Ω/C1 = (C1 − C2)/C1 + e^{−ε}·C2/C1`` in exact integers, then the same float
    operations as ``mechanisms.sao2_exsub`` (so the CDF is the server's, bit for bit). Public."""
    if not (1 <= s < d_prime and 1 <= m <= d_prime and eps > 0 and math.isfinite(eps)):
        raise ValueError("ExSub needs 1 <= s < d', 1 <= m <= d' and a finite ε > 0")
    z, q = d_prime - s, math.exp(-eps)
    C1 = 2**m * _comb(d_prime, m)
    C2 = sum(_comb(s, k) * _comb(z, m - k) * 2 ** (m - k) for k in range(min(s, m) + 1))
    omega = (C1 - C2) / C1 + q * (C2 / C1)
    pairs, cdf, total = [], [], 0.0
    for a in range(min(s, m) + 1):
        for b in range(min(s, m) - a + 1):
            c = m - a - b
            size = _comb(s, a) * _comb(s - a, b) * _comb(z, c) * 2**c
            if size:
                pairs.append((a, b))
                total += (size / C1) * (1.0 if a else q) / omega
                cdf.append(total)
    cdf[-1] = 1.0
    return SubgroupTable(tuple(pairs), tuple(cdf))


# -- one horizon's run (spec §10.3) ----------------------------------------------------------


@dataclass
class Run:
    """One horizon at the device's level (secret: it reveals the clipped stream). CLIP-STREAM's
    budget and ``x̃`` (its ones), ``pred`` (the ones at the last block end), the slots and blocks
    done, and Algorithm 4's counters: ``a, b, c`` trues, reverses and falses still to emit,
    ``rem_nz``/``rem_z`` support and zero coordinates still to visit."""

    task: TaskView
    level: int
    budget: int
    clipped: list[int]
    pred: list[int]
    tau: int
    block: int
    a: int
    b: int
    c: int
    rem_nz: int
    rem_z: int

    @classmethod
    def start(cls, task: TaskView, level: int, rng: Randomness) -> Run:
        """A fresh horizon: the subgroup drawn from the public table with one uniform of the
        device's own randomness (as ``OnlineExSubUser``)."""
        d_prime, m = task.d_prime(level), task.m[level]
        a, b = subgroup_table(d_prime, task.s, task.epsilon, m).draw(uniform(rng))
        return cls(task, level, task.s, [], [], 0, 0, a, b, m - a - b, task.s, d_prime - task.s)

    def advance(self, ones: Sequence[int]) -> list[int] | None:
        """The next slot (``ones``: the set bits of ``x_τ``): CLIP-STREAM (§3.1: the differing
        bits accepted in ascending order while budget lasts, = ``LevelEncoder``), then at a
        block end the residue ``x̃_τ − pred`` over the ``d`` bits (Algorithm 1), else None."""
        self.tau += 1
        if self.budget > 0:
            held = set(self.clipped)
            accepted = sorted(held.symmetric_difference(ones))[: self.budget]
            self.budget -= len(accepted)
            self.clipped = sorted(held.symmetric_difference(accepted))
        if self.tau % self.task.r**self.level:
            return None
        self.block += 1
        residue = [0] * self.task.d
        now, before = set(self.clipped), set(self.pred)
        for i in now - before:
            residue[i] = 1
        for i in before - now:
            residue[i] = -1
        self.pred = list(self.clipped)
        return residue

    def randomise(self, residue: Sequence[int], rng: Randomness) -> list[tuple[int, int]]:
        """Algorithm 4 (spec §4.4, corrected; = ``OnlineExSubUser.block``) on one block: per
        coordinate, test first then decrement; the symbols ``(i in [0, d), sign)``."""
        out: list[tuple[int, int]] = []
        for i, v in enumerate(residue):
            if v == 0:
                if self.rem_z <= 0:
                    raise ValueError("more zero coordinates than d' − s")
                if uniform(rng) * self.rem_z < self.c:
                    out.append((i, 1 if uniform(rng) < 0.5 else -1))
                    self.c -= 1
                self.rem_z -= 1
            else:
                if self.rem_nz <= 0:
                    raise ValueError("more than s non-zeros: the stream was not clipped")
                need = self.a + self.b
                if uniform(rng) * self.rem_nz < need:
                    true = uniform(rng) * need < self.a
                    out.append((i, v if true else -v))
                    self.a, self.b = (self.a - 1, self.b) if true else (self.a, self.b - 1)
                self.rem_nz -= 1
        return out

    def to_state(self) -> dict[str, Any]:
        names = ("level", "budget", "clipped", "pred", "tau", "block", "a", "b", "c", "rem_nz",
                 "rem_z")  # fmt: skip
        return {"task": {**self.task.body, "id": self.task.id}} | {
            k: getattr(self, k) for k in names
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Run:
        """Rebuild from :meth:`to_state`; ``ValueError`` on a malformed field."""
        task = read_task(state["task"])
        ints = [state[k] for k in ("level", "budget", "tau", "block", "a", "b", "c", "rem_nz",
                                   "rem_z")]  # fmt: skip
        sets = [state["clipped"], state["pred"]]
        ok = all(_is_int(v) and v >= 0 for v in ints) and ints[0] < len(task.m)
        if not ok or not all(isinstance(x, list) and all(map(_is_int, x)) for x in sets):
            raise ValueError("malformed SaO2 run")
        level, budget, tau, block, a, b, c, rem_nz, rem_z = ints
        return cls(task, level, budget, list(sets[0]), list(sets[1]), tau, block, a, b, c,
                   rem_nz, rem_z)  # fmt: skip


def ones_of(value: int, d: int, kind: str) -> list[int]:
    """The set bits of a value: ``[c]`` for a category ``c ∈ [0, d)``, the bits of a mask
    ``< 2^d``; ``ValueError`` (never naming the value) outside the domain."""
    top = d if kind == "onehot" else 1 << d
    if not _is_int(value) or not 0 <= value < top:
        raise ValueError(f"a SaO2 value must be an integer in [0, {top})")
    if kind == "onehot":
        return [value]
    return [i for i in range(d) if value >> i & 1]


# -- the device ------------------------------------------------------------------------------


@dataclass
class Account:
    """One stream's lifetime account: ε charged per enrolled horizon and the pinned ``ε_life``."""

    lifetime_epsilon: float
    charges: dict[int, float]

    def refuse(self, task: TaskView) -> Refusal | None:
        """Why enrolling in ``task`` would break the account: not a newer horizon (``stale``),
        or ``Σ ε + ε > ε_life·(1 + 1e−9)`` in exact rational arithmetic (``exhausted``)."""
        last = max(self.charges, default=-1)
        if task.horizon <= last:
            return Refusal("stale", f"horizon {task.horizon}: already enrolled up to {last}")
        spent = sum((Fraction(e) for e in self.charges.values()), Fraction(0))
        limit = Fraction(self.lifetime_epsilon) * (1 + Fraction(RELATIVE_TOLERANCE))
        if spent + Fraction(task.epsilon) > limit:
            return Refusal("exhausted", f"ε {float(spent):g} of {self.lifetime_epsilon:g} spent, "
                                        f"{task.epsilon:g} asked")  # fmt: skip
        return None


class Sao2Device:
    """A device's SaO2 side (module docstring): ``begin(task)`` enrols in a horizon, ``push(slot,
    value)`` feeds a slot's value (None: carry the last one forward) and returns the reports of
    the block ends it reached. One horizon per stream at a time; several streams may run.

    ``store``: a ``FileStore`` of its own (None: in memory, a restart starts afresh);
    ``rng``: the OS CSPRNG by default; ``max_lifetime_epsilon``: the device's own cap on any
    stream's ``ε_life``. ``refusal``: why the last ``begin`` or ``push`` refused (else None)."""

    def __init__(self, device_id: str, store: FileStore | None = None,
                 rng: Randomness | None = None,
                 max_lifetime_epsilon: float | None = None) -> None:  # fmt: skip
        if not isinstance(device_id, str) or not 0 < len(device_id) <= MAX_ID_CHARS:
            raise ValueError(f"a device id is a string of 1..{MAX_ID_CHARS} chars")
        self.device_id, self.store, self.cap = device_id, store, max_lifetime_epsilon
        self.rng: Randomness = rng if rng is not None else SystemRandomness()
        self.accounts: dict[str, Account] = {}
        self.runs: dict[str, Run] = {}
        self.last: dict[str, int] = {}
        self.refusal: Refusal | None = None
        self._broken: str | None = None
        if store is not None:
            self._load(store)

    def begin(self, task: Mapping[str, Any]) -> bool:
        """Enrol in ``task``'s horizon (True), resume it after a restart (True), or refuse
        (False, ``refusal`` says why: ``store``, ``invalid``, ``policy``, ``stale``,
        ``exhausted``). Enrolling charges ε and persists before returning; a horizon of the
        stream still running is abandoned (it reports no more)."""
        self.refusal = None
        if self._broken is not None:
            return self._refuse("store", self._broken)
        try:
            view = read_task(task)
        except (ValueError, TypeError) as exc:
            return self._refuse("invalid", str(exc))
        running = self.runs.get(view.stream)
        if running is not None and running.task.id == view.id:
            return True
        if self.cap is not None and view.lifetime_epsilon > self.cap * (1 + RELATIVE_TOLERANCE):
            return self._refuse("policy", f"ε_life {view.lifetime_epsilon:g} above the "
                                          f"device's {self.cap:g}")  # fmt: skip
        account = self.accounts.get(view.stream, Account(view.lifetime_epsilon, {}))
        account.lifetime_epsilon = min(account.lifetime_epsilon, view.lifetime_epsilon)
        refusal = account.refuse(view)
        if refusal is not None:
            self.refusal = refusal
            return False
        account.charges[view.horizon] = view.epsilon
        self.accounts[view.stream] = account
        self.runs[view.stream] = Run.start(view, view_level(view, self.device_id), self.rng)
        last = self.last.get(view.stream)
        if last is not None and not _fits(last, view):
            del self.last[view.stream]  # outside the new task's domain: reads as no value
        return self._persist() or self._refuse("store", str(self._broken))

    def push(self, slot: int, value: int | None, stream: str | None = None) -> list[dict[str, Any]]:
        """Slot ``slot``'s value (a category index or bitmask; None: none new) for ``stream``
        (None: the device's only stream). Slots the device skipped carry the last value
        forward. Returns the report of every block end of its level reached (possibly none);
        ``ValueError`` on an old slot or a value outside the task's domain (never named)."""
        self.refusal = None
        name = self._stream(stream)
        if not _is_int(slot) or slot < 0:
            raise ValueError("a slot is a non-negative integer")
        run = self.runs.get(name)
        if value is not None:
            if run is not None:
                ones_of(value, run.task.d, run.task.kind)
            elif not _is_int(value) or value < 0:
                raise ValueError("a SaO2 value must be a non-negative integer")
        if self._broken is not None:
            self._refuse("store", self._broken)
            return []
        if run is None:
            if value is not None:
                self.last[name] = value
            return []
        reports = self._advance(run, slot, value)
        if (reports or name not in self.runs) and not self._persist():
            self._refuse("store", str(self._broken))
            return []
        return reports

    def _advance(self, run: Run, slot: int, value: int | None) -> list[dict[str, Any]]:
        """Every slot of ``run`` up to ``slot``: the skipped ones with the carried value."""
        task, name = run.task, run.task.stream
        done = task.first_slot - 1 + run.tau  # the last slot the run processed
        if run.tau and slot <= done:
            raise ValueError(f"slot {slot} already pushed (the run is at slot {done})")
        if slot < task.first_slot:  # before the horizon: the value is only kept
            if value is not None:
                self.last[name] = value
            return []
        reports = []
        for t in range(max(done + 1, task.first_slot), min(slot, task.first_slot + task.T - 1) + 1):
            if t == slot and value is not None:
                self.last[name] = value
            last = self.last.get(name)
            residue = run.advance([] if last is None else ones_of(last, task.d, task.kind))
            if residue is not None:
                reports.append(self._report(run, run.randomise(residue, self.rng)))
        if value is not None:
            self.last[name] = value
        if run.tau >= task.T:
            del self.runs[name]
        return reports

    def _report(self, run: Run, symbols: list[tuple[int, int]]) -> dict[str, Any]:
        """The block's report (= ``Sao2Report.to_json``'s object)."""
        return {"type": REPORT_TYPE, "version": VERSION, "task": run.task.id,
                "stream": run.task.stream, "horizon": run.task.horizon, "level": run.level,
                "block": run.block, "device": self.device_id,
                "symbols": [[i, sign] for i, sign in symbols]}  # fmt: skip

    def _stream(self, stream: str | None) -> str:
        if stream is not None:
            return stream
        names = set(self.runs) | set(self.accounts) | set(self.last)
        if len(names) != 1:
            raise ValueError(f"the device holds {len(names)} streams: name the stream")
        return next(iter(names))

    def _refuse(self, reason: str, message: str) -> bool:
        self.refusal = Refusal(reason, message)
        return False

    def to_state(self) -> dict[str, Any]:
        accounts = {n: {"lifetime_epsilon": a.lifetime_epsilon,
                        "charges": {str(h): e for h, e in sorted(a.charges.items())}}
                    for n, a in sorted(self.accounts.items())}  # fmt: skip
        runs = {n: r.to_state() for n, r in sorted(self.runs.items())}
        return {_STORE_KEY: {"accounts": accounts, "runs": runs, "last": dict(self.last)}}

    def _persist(self) -> bool:
        """Write the state before anything leaves; a failed write breaks the device."""
        if self.store is None:
            return True
        try:
            self.store.save(self.to_state())
        except StoreError as exc:
            self._broken = str(exc)
            return False
        return True

    def _load(self, store: FileStore) -> None:
        try:
            state = store.load()
            if set(state) - {_STORE_KEY}:
                raise ValueError("not a SaO2 store")
            body = state.get(_STORE_KEY, {"accounts": {}, "runs": {}, "last": {}})
            for name, a in body["accounts"].items():
                charges = {int(h): float(e) for h, e in a["charges"].items()}
                if not all(math.isfinite(e) and e > 0 for e in charges.values()):
                    raise ValueError("malformed charge")
                self.accounts[str(name)] = Account(float(a["lifetime_epsilon"]), charges)
            self.runs = {str(n): Run.from_state(r) for n, r in body["runs"].items()}
            self.last = {str(n): v for n, v in body["last"].items() if _is_int(v)}
        except StoreError as exc:
            self._broken = str(exc)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._broken = f"SaO2 store {store.path} is malformed ({exc}): refusing to report"


def view_level(task: TaskView, device: str) -> int:
    """The device's level in ``task`` (:func:`level_of` with the task's weights and salt)."""
    return level_of(task.weights, task.salt, device)


def _fits(value: int, task: TaskView) -> bool:
    try:
        ones_of(value, task.d, task.kind)
    except ValueError:
        return False
    return True
