"""The request/report protocol of ``ldp-reports`` mode (issue 23), schema version 1.

The server stage writes one ``Request`` per (stream, slot, round, purpose) to the request topic;
devices answer with one ``Report`` each to the report topic. Both are canonical JSON (sorted
keys, no spaces, no NaN), so one object has one encoding and a request's id is the digest of
its encoding::

    {"type": "privstream.request", "version": 1, "id": "<32 hex>", "stream": "country",
     "slot": 42, "round": 1, "purpose": "m1", "oracle": {"name": "GRR", "d": 4},
     "epsilon": 0.5, "delta": 0.0, "window": 10, "division": "budget",
     "select": {"rule": "all"}}

    {"type": "privstream.report", "version": 1, "request": "<32 hex>", "stream": "country",
     "slot": 42, "round": 1, "purpose": "m1", "device": "d-7f3a", "oracle": "GRR",
     "epsilon": 0.5, "value": 2}

Who is asked is a rule the device evaluates itself (``Request.asks``), never a list of ids:
``all`` (budget division: every enrolled device) or ``hash`` (population division: a device is
asked iff ``H(salt, its own id) mod modulus < threshold``). A report carries the perturbed
value only and no time finer than the slot. ``check_reports`` is the server's validation: every
report it refuses becomes a ``DeadLetter`` with one of ``PROTOCOL_REASONS``, judged on the
report, the open requests and that device's own history only, so no report changes the fate of
another device's report (and reports charge nobody: the server's ledger mirror charges when it
plans a request). The standard library only; this module imports nothing of privstream but the
event schema's dead letters.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final

from privstream.schema.events import (
    DUPLICATE,
    INVALID_TYPE,
    MALFORMED,
    MAX_EVENT_BYTES,
    MISSING_FIELD,
    OVERSIZED,
    DeadLetter,
    line_text,
)

VERSION: Final = 1
REQUEST_TYPE: Final = "privstream.request"
REPORT_TYPE: Final = "privstream.report"
OLH_PRIME: Final = (1 << 31) - 1  # = mechanisms.oracles.OLH_PRIME (a test pins the equality)
HM_SWITCH: Final = 0.61  # = mechanisms.mean.HM_SWITCH
MAX_MODULUS: Final = 1 << 32  # selection bias of `hash` at most 2^-32 per device
ORACLES: Final = ("GRR", "OUE", "OLH", "HM", "CGM")
DIVISIONS: Final = ("budget", "population")

# Machine-readable dead-letter reasons of reports (besides events' malformed_json,
# missing_field, invalid_type, oversized and duplicate_report).
UNSUPPORTED_VERSION: Final = "unsupported_version"
UNEXPECTED_FIELD: Final = "unexpected_field"
UNKNOWN_REQUEST: Final = "unknown_request"
CLOSED_ROUND: Final = "closed_round"
REPLAYED: Final = "replayed_report"
NOT_ASKED: Final = "not_asked"
ORACLE_MISMATCH: Final = "oracle_mismatch"
BUDGET_MISMATCH: Final = "budget_mismatch"
SHAPE_MISMATCH: Final = "shape_mismatch"
RATE_LIMITED: Final = "rate_limited"
PROTOCOL_REASONS: Final = (
    MALFORMED, MISSING_FIELD, INVALID_TYPE, OVERSIZED, UNSUPPORTED_VERSION, UNEXPECTED_FIELD,
    UNKNOWN_REQUEST, CLOSED_ROUND, REPLAYED, NOT_ASKED, ORACLE_MISMATCH, BUDGET_MISMATCH,
    SHAPE_MISMATCH, DUPLICATE, RATE_LIMITED,
)  # fmt: skip

_PURPOSE = re.compile(r"[A-Za-z0-9_./-]{1,64}")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_SELECT_PERSON = b"privstream-sel"
_REQUEST_PERSON = b"privstream-req"
_SALT_PERSON = b"privstream-slt"
MAX_ID_CHARS: Final = 256


class ProtocolError(ValueError):
    """A request or report the protocol refuses, with a machine-readable ``reason``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def canonical(obj: Any) -> str:
    """The one JSON text of ``obj``: sorted keys, no spaces, UTF-8 kept, NaN/∞ refused."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)  # fmt: skip


def _digest(person: bytes, parts: Iterable[bytes], key: bytes = b"") -> bytes:
    """BLAKE2b (16 bytes) over length-prefixed ``parts``: no two part lists collide."""
    h = hashlib.blake2b(key=key, digest_size=16, person=person)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


# -- field checks ------------------------------------------------------------------------------


def _int(value: Any, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(INVALID_TYPE, f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ProtocolError(INVALID_TYPE, f"{name} must be an integer {bound}, got {value}")
    return value


def _float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        raise ProtocolError(INVALID_TYPE, f"{name} must be a finite number, got {value!r}")
    return float(value)


def _finite(value: int | float) -> bool:
    """A finite float, or an integer within the float range (beyond it ``math.isfinite``
    raises ``OverflowError``, which would escape every check as an internal failure)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _text(value: Any, name: str, pattern: re.Pattern[str] | None = None) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
        raise ProtocolError(INVALID_TYPE, f"{name} must be a string of 1..{MAX_ID_CHARS} chars")
    if pattern is not None and not pattern.fullmatch(value):
        raise ProtocolError(INVALID_TYPE, f"{name} {value!r} must match {pattern.pattern}")
    return value


def _take(obj: Mapping[str, Any], name: str) -> Any:
    if name not in obj:
        raise ProtocolError(MISSING_FIELD, f"no {name!r} field")
    return obj[name]


def _check_fields(obj: Mapping[str, Any], allowed: Iterable[str], what: str) -> None:
    extra = sorted(set(obj) - set(allowed))
    if extra:
        raise ProtocolError(UNEXPECTED_FIELD, f"a {what} has no field {extra} (schema {VERSION})")


def _check_head(obj: Any, kind: str) -> Mapping[str, Any]:
    if not isinstance(obj, dict):
        raise ProtocolError(INVALID_TYPE, f"a {kind} must be a JSON object")
    if _take(obj, "type") != kind:
        raise ProtocolError(INVALID_TYPE, f"type must be {kind!r}, got {obj['type']!r}")
    version = _take(obj, "version")
    if version != VERSION or isinstance(version, bool):
        raise ProtocolError(
            UNSUPPORTED_VERSION,
            f"{kind} schema version {version!r} is not supported: this server reads version "
            f"{VERSION}; upgrade privstream or the device library so both speak one version",
        )
    return obj


# -- the oracle a request names ----------------------------------------------------------------


def olh_g(eps: float) -> int:
    """OLH's hash range ``g = max(2, round(e^ε + 1))`` (= ``mechanisms.oracles.OLH.g``)."""
    return max(2, round(math.exp(eps) + 1))


def hm_bound(eps: float) -> float:
    """The largest ``|report|`` HM can send: SR's ``(e^ε+1)/(e^ε−1)`` at or below ``HM_SWITCH``,
    else PM's ``(e^{ε/2}+1)/(e^{ε/2}−1)``, the larger (= ``mechanisms.mean``'s scales)."""
    h = math.exp(eps / 2) if eps > HM_SWITCH else math.exp(eps)
    return (h + 1) / (h - 1)


@dataclass(frozen=True)
class CgmStep:
    """The public parameters of one CGM chain step (spec cgm §4.3–§4.7): the noise ``sigma1``,
    the grid (``grid_bits``), the lag ``j``, the change bound ``C`` (``bound``), the schedule
    switches, and the public domain: ``lower``/``upper`` for scalars (``d = 1``) or
    ``center``/``radius`` for vectors. A device computes its own ``r, V, v`` from its chain."""

    sigma1: float
    grid_bits: int
    lag: int
    bound: float
    reuse: bool = True
    gap_aware: bool = False
    lower: float | None = 0.0
    upper: float | None = 1.0
    center: tuple[float, ...] | None = None
    radius: float | None = None

    def __post_init__(self) -> None:
        if _float(self.sigma1, "sigma1") <= 0 or _float(self.bound, "bound") < 0:
            raise ProtocolError(INVALID_TYPE, "sigma1 must be > 0 and bound >= 0")
        _int(self.grid_bits, "grid_bits", 8, 20)
        _int(self.lag, "lag", 1, 366)
        if not isinstance(self.reuse, bool) or not isinstance(self.gap_aware, bool):
            raise ProtocolError(INVALID_TYPE, "reuse and gap_aware must be booleans")
        ball = self.center is not None or self.radius is not None
        if ball == (self.lower is not None or self.upper is not None):
            raise ProtocolError(INVALID_TYPE, "a CGM domain is lower/upper or center/radius")
        if ball:
            [_float(c, "center") for c in self.center or (math.nan,)]
            if _float(self.radius, "radius") <= 0:
                raise ProtocolError(INVALID_TYPE, f"radius must be > 0, got {self.radius}")
        elif _float(self.lower, "lower") >= _float(self.upper, "upper"):
            raise ProtocolError(INVALID_TYPE, "lower must be below upper")

    @property
    def d(self) -> int:
        return 1 if self.center is None else len(self.center)

    def to_json(self) -> dict[str, Any]:
        out = {"sigma1": self.sigma1, "grid_bits": self.grid_bits, "lag": self.lag,
               "bound": self.bound, "reuse": self.reuse, "gap_aware": self.gap_aware}  # fmt: skip
        if self.center is None:
            return out | {"lower": self.lower, "upper": self.upper}
        return out | {"center": list(self.center), "radius": self.radius}

    @classmethod
    def from_json(cls, obj: Any) -> CgmStep:
        if not isinstance(obj, dict):
            raise ProtocolError(INVALID_TYPE, "oracle.cgm must be an object")
        _check_fields(obj, [f for f in cls.__dataclass_fields__], "CGM step")
        center = obj.get("center")
        if center is not None and not isinstance(center, list):
            raise ProtocolError(INVALID_TYPE, "cgm.center must be a list of numbers")
        kw = {k: obj[k] for k in ("lower", "upper", "radius") if k in obj}
        if center is not None:
            kw = {"lower": None, "upper": None} | kw | {"center": tuple(center)}
        req = {k: _take(obj, k) for k in ("sigma1", "grid_bits", "lag", "bound")}
        flags = {k: obj[k] for k in ("reuse", "gap_aware") if k in obj}
        return cls(**req, **flags, **kw)


@dataclass(frozen=True)
class OracleSpec:
    """The local randomiser a request asks for: ``GRR``/``OUE``/``OLH`` over ``d`` categories,
    ``HM`` for means in ``[−1, 1]`` (``d = 1``), or ``CGM`` with its chain step."""

    name: str
    d: int = 1
    cgm: CgmStep | None = None

    def __post_init__(self) -> None:
        if self.name not in ORACLES:
            raise ProtocolError(INVALID_TYPE, f"oracle must be one of {ORACLES}, got {self.name!r}")
        _int(self.d, "oracle.d", 2 if self.name in ("GRR", "OUE", "OLH") else 1, 1 << 20)
        if (self.cgm is not None) != (self.name == "CGM"):
            raise ProtocolError(INVALID_TYPE, "oracle.cgm is given with the CGM oracle only")
        if (self.name == "HM" and self.d != 1) or (self.cgm is not None and self.cgm.d != self.d):
            raise ProtocolError(INVALID_TYPE, f"oracle.d={self.d} does not fit {self.name}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "d": self.d}
        return out if self.cgm is None else out | {"cgm": self.cgm.to_json()}

    @classmethod
    def from_json(cls, obj: Any) -> OracleSpec:
        if not isinstance(obj, dict):
            raise ProtocolError(INVALID_TYPE, "oracle must be an object")
        _check_fields(obj, ("name", "d", "cgm"), "oracle")
        cgm = CgmStep.from_json(obj["cgm"]) if "cgm" in obj else None
        return cls(_take(obj, "name"), _take(obj, "d"), cgm)

    def shape_error(self, value: Any, eps: float) -> str | None:
        """Why ``value`` is not a report this oracle can send with budget ``eps`` (None: it
        is): a GRR category in ``[0, d)``; an OUE bit string of length ``d``; OLH's
        ``[a, b, y]`` with ``1 ≤ a < P``, ``0 ≤ b < P``, ``0 ≤ y < g``; an HM number within
        ``hm_bound(ε)``; CGM's ``{"x": [d numbers], "v": v ∈ (0, 1]}``."""
        if self.name == "GRR":
            return None if _is_int(value, 0, self.d - 1) else f"not a category in [0, {self.d})"
        if self.name == "OUE":
            ok = isinstance(value, str) and len(value) == self.d and set(value) <= {"0", "1"}
            return None if ok else f"not a string of {self.d} bits"
        if self.name == "OLH":
            ok = isinstance(value, list) and len(value) == 3 and _is_int(value[0], 1, OLH_PRIME - 1)
            ok = ok and _is_int(value[1], 0, OLH_PRIME - 1) and _is_int(value[2], 0, olh_g(eps) - 1)
            return None if ok else f"not [a, b, y] with a in [1, P), b in [0, P), y < {olh_g(eps)}"
        if self.name == "HM":
            ok = _is_number(value) and abs(value) <= hm_bound(eps) * (1 + 1e-9)
            return None if ok else f"not a number within ±{hm_bound(eps):.6g}"
        return _cgm_shape_error(value, self.d)


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and _finite(value)


def _cgm_shape_error(value: Any, d: int) -> str | None:
    if not isinstance(value, dict) or set(value) != {"x", "v"}:
        return 'not {"x": [...], "v": ...}'
    x, v = value["x"], value["v"]
    if not isinstance(x, list) or len(x) != d or not all(_is_number(c) for c in x):
        return f"x is not {d} finite numbers"
    return None if _is_number(v) and 0 < v <= 1 else "v is not a number in (0, 1]"


# -- who is asked ------------------------------------------------------------------------------


def selection_point(salt: bytes, device: str) -> int:
    """``H(salt, device)``: BLAKE2b's first 8 bytes as an integer in ``[0, 2^64)``."""
    return int.from_bytes(_digest(_SELECT_PERSON, (salt, device.encode()))[:8], "big")


def derive_salt(key: bytes, stream: str, slot: int, round: int, purpose: str) -> bytes:
    """The salt of one request's selection: BLAKE2b keyed with the stream's selection key over
    ``(stream, slot, round, purpose)``. A replay after a crash derives the same salt, so asks
    the same devices; without the key nobody can tell in advance who a later round asks."""
    parts = (stream.encode(), slot.to_bytes(16, "little", signed=True),
             round.to_bytes(8, "little"), purpose.encode())  # fmt: skip
    return _digest(_SALT_PERSON, parts, key=key)


@dataclass(frozen=True)
class Selection:
    """Who a request asks, as a rule each device evaluates on its own id only.

    ``rule = "all"``: every enrolled device (budget division; the device's own ledger decides
    whether it can afford the budget). ``rule = "hash"``: a device is asked iff
    ``selection_point(salt, id) mod modulus < threshold`` (population division), i.e. each
    device independently with probability ``threshold/modulus`` (up to ``2^64 mod modulus /
    2^64 < 2^−32``); the request never lists anybody."""

    rule: str = "all"
    salt: bytes = b""
    threshold: int = 0
    modulus: int = 1

    def __post_init__(self) -> None:
        if self.rule == "all":
            if self.salt or self.threshold or self.modulus != 1:
                raise ProtocolError(INVALID_TYPE, "select rule 'all' takes no salt/threshold")
            return
        if self.rule != "hash":
            raise ProtocolError(INVALID_TYPE, f"select.rule must be all or hash: {self.rule!r}")
        if not isinstance(self.salt, bytes) or len(self.salt) != 16:
            raise ProtocolError(INVALID_TYPE, "select.salt must be 16 bytes (32 hex digits)")
        _int(self.modulus, "select.modulus", 1, MAX_MODULUS)
        _int(self.threshold, "select.threshold", 0, self.modulus)

    def asks(self, device: str) -> bool:
        """Whether the device with this id is asked (its own id is all it needs)."""
        if self.rule == "all":
            return True
        return selection_point(self.salt, device) % self.modulus < self.threshold

    @property
    def rate(self) -> float:
        """The probability that any one device is asked."""
        return 1.0 if self.rule == "all" else self.threshold / self.modulus

    def to_json(self) -> dict[str, Any]:
        if self.rule == "all":
            return {"rule": "all"}
        return {"rule": "hash", "salt": self.salt.hex(), "threshold": self.threshold,
                "modulus": self.modulus}  # fmt: skip

    @classmethod
    def from_json(cls, obj: Any) -> Selection:
        if not isinstance(obj, dict):
            raise ProtocolError(INVALID_TYPE, "select must be an object")
        _check_fields(obj, ("rule", "salt", "threshold", "modulus"), "select")
        if _take(obj, "rule") == "all":
            return cls("all")
        salt = _text(_take(obj, "salt"), "select.salt", _HEX32)
        return cls(obj["rule"], bytes.fromhex(salt), _take(obj, "threshold"), _take(obj, "modulus"))


def sample_rule(salt: bytes, k: int, available: int, modulus: int = MAX_MODULUS) -> Selection:
    """The ``hash`` rule asking ``k`` of ``available`` devices in expectation (LPD/LPA's
    ``k`` users from ``U_A``): threshold ``round(k·modulus/available)``, capped at the
    modulus. The group is Binomial(``available``, ``k/available``), not exactly ``k``."""
    _int(k, "k", 0)
    _int(available, "available", 0)
    if available == 0 or k == 0:
        return Selection("hash", salt, 0, modulus)
    return Selection("hash", salt, min(modulus, round(k * modulus / available)), modulus)


# -- requests ----------------------------------------------------------------------------------

_REQUEST_FIELDS: Final = ("type", "version", "id", "stream", "slot", "round", "purpose",
                          "oracle", "epsilon", "delta", "window", "division", "select")  # fmt: skip


@dataclass(frozen=True)
class Request:
    """What one round asks: every device ``select`` asks reports once, through ``oracle``, with
    budget ``(epsilon, delta)``, for ``purpose`` (the mechanism's name for it, as
    ``mechanisms.rounds.Request.purpose``: ``m1``, ``m2``...), under a w-event budget of window
    ``window`` split by ``division`` (``budget``: every device, a share of ε; ``population``:
    a hash-selected group, the full ε). ``id`` is the digest of the canonical encoding."""

    stream: str
    slot: int
    round: int
    purpose: str
    oracle: OracleSpec
    epsilon: float
    window: int
    division: str = "budget"
    select: Selection = field(default_factory=Selection)
    delta: float = 0.0

    def __post_init__(self) -> None:
        _text(self.stream, "stream")
        _int(self.slot, "slot", 0)
        _int(self.round, "round", 1)
        _text(self.purpose, "purpose", _PURPOSE)
        if _float(self.epsilon, "epsilon") <= 0 or not 0 <= _float(self.delta, "delta") < 1:
            raise ProtocolError(INVALID_TYPE, "epsilon must be > 0 and delta in [0, 1)")
        _int(self.window, "window", 1)
        if self.division not in DIVISIONS:
            raise ProtocolError(INVALID_TYPE, f"division must be one of {DIVISIONS}")
        if (self.division == "budget") != (self.select.rule == "all"):
            raise ProtocolError(
                INVALID_TYPE, "budget division asks every device (select all); population "
                "division asks a hash-selected group (select hash)",
            )  # fmt: skip

    def asks(self, device_id: str) -> bool:
        """Whether this request asks the device ``device_id`` (what a device checks before
        it consults its own ledger)."""
        return self.select.asks(device_id)

    def body(self) -> dict[str, Any]:
        return {
            "type": REQUEST_TYPE, "version": VERSION, "stream": self.stream, "slot": self.slot,
            "round": self.round, "purpose": self.purpose, "oracle": self.oracle.to_json(),
            "epsilon": self.epsilon, "delta": self.delta, "window": self.window,
            "division": self.division, "select": self.select.to_json(),
        }  # fmt: skip

    @cached_property
    def id(self) -> str:
        """The request's digest (32 hex): BLAKE2b of its canonical body without the id."""
        return _digest(_REQUEST_PERSON, (canonical(self.body()).encode(),)).hex()

    def to_json(self) -> str:
        return canonical(self.body() | {"id": self.id})


def decode_request(line: str | bytes) -> Request:
    """The request in ``line``; a malformed one, another schema version, an unexpected field or
    an id that is not the digest of the rest raises ``ProtocolError`` naming why."""
    obj = _check_head(_load(line), REQUEST_TYPE)
    _check_fields(obj, _REQUEST_FIELDS, "request")
    req = Request(
        _take(obj, "stream"), _take(obj, "slot"), _take(obj, "round"), _take(obj, "purpose"),
        OracleSpec.from_json(_take(obj, "oracle")), _take(obj, "epsilon"),
        _take(obj, "window"), _take(obj, "division"),
        Selection.from_json(_take(obj, "select")), obj.get("delta", 0.0),
    )  # fmt: skip
    if "id" in obj and obj["id"] != req.id:
        raise ProtocolError(INVALID_TYPE, "request id is not the digest of its fields")
    return req


def _load(line: str | bytes) -> Any:
    if len(line) > MAX_EVENT_BYTES:
        raise ProtocolError(OVERSIZED, f"over {MAX_EVENT_BYTES} bytes")
    try:
        return json.loads(line_text(line), parse_constant=_no_constant, parse_float=_in_range)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(MALFORMED, f"not JSON: {exc}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _in_range(text: str) -> float:
    """A JSON number beyond the float range (``1e400``) is refused, never read as infinity:
    a report holding one could not be written back (canonical JSON has no infinity), so its
    dead letter would fail and halt the stream."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of the float range")
    return value


# -- reports -----------------------------------------------------------------------------------

_REPORT_FIELDS: Final = ("type", "version", "request", "stream", "slot", "round", "purpose",
                         "device", "oracle", "epsilon", "value")  # fmt: skip


@dataclass(frozen=True)
class Report:
    """One device's answer to one request: the request's id and coordinates, the device's
    pseudonymous id, the oracle and budget it used, and the perturbed ``value`` only (see
    ``OracleSpec.shape_error``). It carries no raw value and no time finer than the slot."""

    request: str
    stream: str
    slot: int
    round: int
    purpose: str
    device: str
    oracle: str
    epsilon: float
    value: Any

    def __post_init__(self) -> None:
        _text(self.request, "request", _HEX32)
        _text(self.stream, "stream")
        _int(self.slot, "slot", 0)
        _int(self.round, "round", 1)
        _text(self.purpose, "purpose", _PURPOSE)
        _text(self.device, "device")
        _text(self.oracle, "oracle")
        _float(self.epsilon, "epsilon")

    @classmethod
    def answering(cls, request: Request, device: str, value: Any) -> Report:
        """The report of ``device`` to ``request`` with the perturbed ``value``."""
        return cls(request.id, request.stream, request.slot, request.round, request.purpose,
                   device, request.oracle.name, request.epsilon, value)  # fmt: skip

    def to_json(self) -> str:
        return canonical({
            "type": REPORT_TYPE, "version": VERSION, "request": self.request,
            "stream": self.stream, "slot": self.slot, "round": self.round,
            "purpose": self.purpose, "device": self.device, "oracle": self.oracle,
            "epsilon": self.epsilon, "value": self.value,
        })  # fmt: skip


def decode_report(line: str | bytes) -> Report:
    """The report in ``line``; anything else raises ``ProtocolError`` naming why."""
    return _report_of(_load(line))


def _report_of(obj: Any) -> Report:
    obj = _check_head(obj, REPORT_TYPE)
    _check_fields(obj, _REPORT_FIELDS, "report")
    return Report(*(_take(obj, k) for k in _REPORT_FIELDS[2:]))


# -- the server's validation -------------------------------------------------------------------


@dataclass
class SeenReports:
    """What the server remembers between batches: the ``(request id, device)`` pairs accepted
    for open requests, each stream's last closed ``(slot, round)``, and each device's report
    attempts per stream in slot buckets (the rate limit: at most ``per_window`` attempts in any
    ``window`` consecutive slots; set it to the most requests one device can be asked in
    ``window`` slots, e.g. ``rounds × purposes × w``, so an honest device never reaches it)."""

    window: int
    per_window: int
    accepted: set[tuple[str, str]] = field(default_factory=set)
    closed: dict[str, tuple[int, int]] = field(default_factory=dict)
    attempts: dict[tuple[str, str], dict[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _int(self.window, "window", 1)
        _int(self.per_window, "per_window", 1)

    def close(self, request: Request) -> None:
        """Close ``request``'s round: later reports to it are ``closed_round`` or
        ``replayed_report``; its accepted pairs are forgotten (they can no longer repeat)."""
        key = (request.slot, request.round)
        self.closed[request.stream] = max(self.closed.get(request.stream, key), key)
        self.accepted = {p for p in self.accepted if p[0] != request.id}

    def has(self, request: str, device: str) -> bool:
        """Whether a report of ``device`` to the open ``request`` was accepted."""
        return (request, device) in self.accepted

    def add(self, request: str, device: str) -> None:
        """Remember that a report of ``device`` to the open ``request`` was accepted."""
        self.accepted.add((request, device))

    def admit(self, device: str, stream: str, slot: int, now: int) -> bool:
        """Count one attempt of ``device`` on ``stream`` (at its slot, clamped into the window
        ending at ``now``); False once the window already holds ``per_window`` attempts."""
        buckets = self.attempts.setdefault((device, stream), {})
        low = now - self.window + 1
        for old in [s for s in buckets if s < low]:
            del buckets[old]
        if sum(buckets.values()) >= self.per_window:
            return False
        bucket = min(max(slot, low), now)
        buckets[bucket] = buckets.get(bucket, 0) + 1
        return True


def check_reports(
    batch: Sequence[str | bytes | Report], open_requests: Mapping[str, Request], seen: SeenReports
) -> tuple[list[Report], list[DeadLetter]]:
    """Split ``batch`` into the reports to absorb and dead letters (reasons in
    ``PROTOCOL_REASONS``). Accepted: at most one report per (open request, device), only from
    a device the request's rule asks, only with the request's oracle, budget and value shape,
    and only while the device stays under its rate limit. Each report is judged on itself, the
    open requests and its own device's history, so no report can change another's fate, and
    none changes a charge (the ledger mirror charges when a request is planned)."""
    now = stream_now(open_requests, seen)
    accepted: list[Report] = []
    dead: list[DeadLetter] = []
    for item in batch:
        try:
            report = item if isinstance(item, Report) else decode_report(item)
        except ProtocolError as exc:
            dead.append(_dead(exc, None, item))
            continue
        reason = _judge(report, open_requests, seen, now)
        if reason is None:
            seen.add(report.request, report.device)
            accepted.append(report)
        else:
            dead.append(_dead(reason, report.stream, report))
    return accepted, dead


def stream_now(open_requests: Mapping[str, Request], seen: SeenReports) -> dict[str, int]:
    """Each known stream's current slot: its latest open or closed request's."""
    now = {stream: slot for stream, (slot, _) in seen.closed.items()}
    for req in open_requests.values():
        now[req.stream] = max(now.get(req.stream, req.slot), req.slot)
    return now


def _judge(
    report: Report, open_requests: Mapping[str, Request], seen: SeenReports, now: dict[str, int]
) -> ProtocolError | None:
    """The first reason to refuse ``report``, or None to accept it."""
    stream = report.stream if report.stream in now else "?"  # unknown streams share one bucket
    if not seen.admit(report.device, stream, report.slot, now.get(report.stream, 0)):
        return rate_limited(seen)
    return verdict(report, open_requests, seen)


def rate_limited(seen: SeenReports) -> ProtocolError:
    """Why a report over its device's rate limit is refused."""
    return ProtocolError(RATE_LIMITED, f"over {seen.per_window} reports in {seen.window} slots")


def verdict(
    report: Report, open_requests: Mapping[str, Request], seen: SeenReports
) -> ProtocolError | None:
    """The first reason after the rate limit to refuse ``report`` (its request, the rule, the
    oracle, budget and shape, a duplicate), or None to accept it; changes nothing."""
    req = open_requests.get(report.request)
    coords = (report.stream, report.slot, report.round, report.purpose)
    if req is None or (req.stream, req.slot, req.round, req.purpose) != coords:
        return _no_request(report, seen)
    if not req.asks(report.device):
        return ProtocolError(NOT_ASKED, f"request {req.id} does not ask this device")
    if report.oracle != req.oracle.name:
        return ProtocolError(ORACLE_MISMATCH, f"asked {req.oracle.name}, got {report.oracle!r}")
    if report.epsilon != req.epsilon:
        return ProtocolError(BUDGET_MISMATCH, f"asked ε={req.epsilon!r}, got {report.epsilon!r}")
    shape = req.oracle.shape_error(report.value, req.epsilon)
    if shape is not None:
        return ProtocolError(SHAPE_MISMATCH, f"{req.oracle.name} value {shape}")
    if seen.has(req.id, report.device):
        return ProtocolError(DUPLICATE, f"a second report to request {req.id}")
    return None


def _no_request(report: Report, seen: SeenReports) -> ProtocolError:
    """Why a report names no open request: an older slot than the stream's last closed round
    (a replay), that slot's closed round (late), or no request at all (forged or future)."""
    closed = seen.closed.get(report.stream)
    if closed is not None and report.slot < closed[0]:
        return ProtocolError(REPLAYED, f"slot {report.slot} is older than slot {closed[0]}")
    if closed is not None and (report.slot, report.round) <= closed:
        return ProtocolError(CLOSED_ROUND, f"round {report.round} of slot {report.slot} closed")
    return ProtocolError(UNKNOWN_REQUEST, f"no open request {report.request} for these fields")


def refused(exc: ProtocolError, item: str | bytes | Report | Close) -> DeadLetter:
    """The dead letter of a report-topic message the server refuses for ``exc``."""
    stream = None if isinstance(item, (str, bytes)) else item.stream
    if isinstance(item, Close):
        return DeadLetter(exc.reason, stream, item.to_json(), exc.detail)
    return _dead(exc, stream, item)


def _dead(exc: ProtocolError, stream: str | None, item: str | bytes | Report) -> DeadLetter:
    """The dead letter of a refused report. An unexpected field's content is left out (it could
    be a raw value a broken device leaked): its payload names the fields only."""
    if isinstance(item, Report):
        return DeadLetter(exc.reason, stream, item.to_json(), exc.detail)
    if exc.reason == UNEXPECTED_FIELD:
        return DeadLetter(exc.reason, None, canonical({"fields": exc.detail}), exc.detail)
    text = line_text(item)
    cut = text[:256] if exc.reason == OVERSIZED else text.strip()
    original = item if isinstance(item, bytes) and item != cut.encode() else None
    return DeadLetter(exc.reason, None, cut, exc.detail, original)


# -- round markers -----------------------------------------------------------------------------

CLOSE_TYPE: Final = "privstream.close"
_CLOSE_PERSON = b"privstream-cls"
_CLOSE_FIELDS: Final = ("type", "version", "stream", "slot", "round", "tag")


@dataclass(frozen=True)
class Close:
    """A round marker on the report topic, written by the clock from the server's schedule
    (``privstream clock --requests``): ``round = 0`` opens ``slot``; ``round = r ≥ 1`` closes
    round ``r`` of ``slot`` (reports after it on its partition are late). ``tag`` authenticates
    it with the clock key (``close_tag``): a writer of the report topic without the key can
    neither open nor close a round."""

    stream: str
    slot: int
    round: int
    tag: str = ""

    def __post_init__(self) -> None:
        _text(self.stream, "stream")
        _int(self.slot, "slot", 0)
        _int(self.round, "round", 0)

    def signed(self, clock_key: bytes) -> Close:
        return Close(self.stream, self.slot, self.round, close_tag(clock_key, self))

    def authentic(self, clock_key: bytes) -> bool:
        """Whether ``tag`` authenticates this marker (compared in constant time)."""
        return hmac.compare_digest(self.tag.lower(), close_tag(clock_key, self))

    def to_json(self) -> str:
        return canonical({"type": CLOSE_TYPE, "version": VERSION, "stream": self.stream,
                          "slot": self.slot, "round": self.round, "tag": self.tag})  # fmt: skip


def close_tag(clock_key: bytes, marker: Close) -> str:
    """Hex BLAKE2b keyed with the clock key over the marker's (stream, slot, round)."""
    parts = (marker.stream.encode(), marker.slot.to_bytes(16, "little", signed=True),
             marker.round.to_bytes(8, "little"))  # fmt: skip
    return _digest(_CLOSE_PERSON, parts, key=clock_key).hex()


def decode_message(line: str | bytes) -> Report | Close:
    """A report-topic message: a ``Report`` or a round marker (``Close``); anything else
    raises ``ProtocolError`` naming why."""
    obj = _load(line)
    if isinstance(obj, dict) and obj.get("type") == CLOSE_TYPE:
        _check_head(obj, CLOSE_TYPE)
        _check_fields(obj, _CLOSE_FIELDS, "round marker")
        return Close(_take(obj, "stream"), _take(obj, "slot"), _take(obj, "round"),
                     _text(_take(obj, "tag"), "tag"))  # fmt: skip
    return _report_of(obj)
