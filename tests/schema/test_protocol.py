"""The request/report protocol of ``ldp-reports`` (``privstream/schema/protocol.py``): canonical
JSON round trips, the hash-range selection rule and its group size, and ``check_reports``'s
dead letters for every lying-device case."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privstream.mechanisms import mean, oracles
from privstream.schema.events import DUPLICATE, MALFORMED
from privstream.schema.protocol import (
    BUDGET_MISMATCH,
    CLOSED_ROUND,
    MAX_MODULUS,
    NOT_ASKED,
    ORACLE_MISMATCH,
    PROTOCOL_REASONS,
    RATE_LIMITED,
    REPLAYED,
    SHAPE_MISMATCH,
    UNEXPECTED_FIELD,
    UNKNOWN_REQUEST,
    UNSUPPORTED_VERSION,
    CgmStep,
    OracleSpec,
    ProtocolError,
    Report,
    Request,
    SeenReports,
    Selection,
    check_reports,
    decode_report,
    decode_request,
    derive_salt,
    hm_bound,
    olh_g,
    sample_rule,
)

KEY = b"selection-key-16"


def _budget(slot: int = 3, round: int = 1, purpose: str = "m1", oracle: str = "GRR") -> Request:
    return Request("country", slot, round, purpose, OracleSpec(oracle, 4), 0.25, 10)


def _population(k: int = 30, available: int = 100, slot: int = 3) -> Request:
    salt = derive_salt(KEY, "country", slot, 1, "m2")
    return Request("country", slot, 1, "m2", OracleSpec("OLH", 4), 1.0, 10, "population",
                   sample_rule(salt, k, available))  # fmt: skip


def _cgm() -> Request:
    step = CgmStep(0.8, 14, 2, 0.05, center=(0.0, 1.0), radius=2.0, lower=None, upper=None)
    return Request("taxi", 7, 1, "cgm", OracleSpec("CGM", 2, step), 1.0, 48, delta=1e-5)


REQUESTS = [
    _budget(),
    _budget(oracle="OUE"),
    _population(),
    Request("temp", 0, 2, "m2", OracleSpec("HM"), 0.5, 5),
    _cgm(),
    Request("taxi", 1, 1, "cgm", OracleSpec("CGM", 1, CgmStep(1.0, 12, 1, 0.1)), 2.0, 48),
]
VALUES = {
    "GRR": 3,
    "OUE": "0110",
    "OLH": [5, 7, 2],
    "HM": -1.5,
    "CGM": {"x": [0.2, -3.5], "v": 0.4},
}


def _value(req: Request) -> object:
    v = VALUES[req.oracle.name]
    return {"x": [0.2], "v": 1.0} if req.oracle.name == "CGM" and req.oracle.d == 1 else v


# -- encoding ----------------------------------------------------------------------------------


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: f"{r.oracle.name}-{r.division}")
def test_a_request_round_trips_through_its_one_canonical_json(req: Request) -> None:
    text = req.to_json()
    assert decode_request(text) == req
    assert decode_request(text).to_json() == text
    obj = json.loads(text)
    assert text == json.dumps(obj, sort_keys=True, separators=(",", ":"))
    assert obj["id"] == req.id and len(req.id) == 32
    # the same request written with other key order and spacing reads back to the same bytes
    assert decode_request(json.dumps(obj, indent=2)).to_json() == text


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: f"{r.oracle.name}-{r.division}")
def test_a_report_round_trips_and_holds_no_time_finer_than_the_slot(req: Request) -> None:
    rep = Report.answering(req, "dev-1", _value(req))
    text = rep.to_json()
    assert decode_report(text) == rep and decode_report(text).to_json() == text
    assert set(json.loads(text)) == {"type", "version", "request", "stream", "slot", "round",
                                     "purpose", "device", "oracle", "epsilon", "value"}  # fmt: skip


def test_the_id_digests_every_field_so_a_changed_request_has_another_id() -> None:
    base = _budget()
    others = [_budget(slot=4), _budget(round=2), _budget(purpose="m2"), _budget(oracle="OUE")]
    assert len({base.id, *(r.id for r in others)}) == 5
    forged = json.loads(base.to_json()) | {"epsilon": 9.0}
    with pytest.raises(ProtocolError, match="not the digest") as exc:
        decode_request(json.dumps(forged))
    assert exc.value.reason == "invalid_type"


@pytest.mark.parametrize("version", [2, 0, "1", True, None])
def test_another_schema_version_is_refused_with_a_clear_reason(version: object) -> None:
    obj = json.loads(_budget().to_json()) | {"version": version}
    with pytest.raises(ProtocolError) as exc:
        decode_request(json.dumps(obj))
    assert exc.value.reason == UNSUPPORTED_VERSION
    assert "this server reads version 1" in exc.value.detail and "upgrade" in exc.value.detail


@pytest.mark.parametrize(
    ("change", "reason"),
    [({"slot": -1}, "invalid_type"), ({"epsilon": 0}, "invalid_type"),
     ({"division": "population"}, "invalid_type"), ({"users": [1, 2]}, UNEXPECTED_FIELD),
     ({"purpose": "a b"}, "invalid_type"), ({"oracle": {"name": "RAPPOR", "d": 4}}, "invalid_type"),
     ({"oracle": {"name": "HM", "d": 3}}, "invalid_type")],
)  # fmt: skip
def test_a_bad_request_is_refused_naming_the_field(change: dict[str, object], reason: str) -> None:
    obj = json.loads(_budget().to_json())
    del obj["id"]
    with pytest.raises(ProtocolError) as exc:
        decode_request(json.dumps(obj | change))
    assert exc.value.reason == reason


def test_the_schema_constants_equal_the_servers_randomisers() -> None:
    from privstream.schema import protocol

    assert protocol.OLH_PRIME == oracles.OLH_PRIME and protocol.HM_SWITCH == mean.HM_SWITCH
    for eps in (0.1, 0.61, 0.62, 1.0, 3.0):
        assert olh_g(eps) == oracles.OLH(4).g(eps)
        assert hm_bound(eps) == max(mean.sr_scale(eps), mean.pm_scale(eps) if eps > 0.61 else 0)


@pytest.mark.parametrize("eps", [0.3, 1.0, 4.0])
def test_every_report_the_servers_randomisers_make_has_the_requests_shape(eps: float) -> None:
    rng = np.random.default_rng(7)
    values = rng.integers(0, 4, 500)
    for name, oracle in (("GRR", oracles.GRR(4)), ("OUE", oracles.OUE(4)), ("OLH", oracles.OLH(4))):
        spec, out = OracleSpec(name, 4), oracle.perturb(values, eps, rng)
        reports = [int(v) if name == "GRR" else v for v in out.tolist()]
        if name == "OUE":
            reports = ["".join("1" if b else "0" for b in row) for row in out]
        assert all(spec.shape_error(r, eps) is None for r in reports)
    hm = mean.HM().perturb(rng.uniform(-1, 1, 500), eps, rng)
    assert all(OracleSpec("HM").shape_error(float(v), eps) is None for v in hm)


# -- the selection rule ------------------------------------------------------------------------


def test_budget_division_asks_every_device_and_lists_nobody() -> None:
    req = _budget()
    assert all(req.asks(f"user-{i}") for i in range(1000))
    assert json.loads(req.to_json())["select"] == {"rule": "all"}


def test_the_hash_rule_asks_a_binomial_group_of_expected_size_k() -> None:
    """n = 10 000 available devices, k = 500: the group is Binomial(n, k/n), std
    √(k(1 − k/n)) ≈ 21.8; over 40 requests (fresh salts) the mean group size lies within
    4 standard errors (4·21.8/√40 ≈ 13.8) of k and every group within 5 std of k."""
    n, k, ids = 10_000, 500, [f"device-{i:05d}" for i in range(10_000)]
    sizes = []
    for slot in range(40):
        rule = sample_rule(derive_salt(KEY, "s", slot, 1, "m2"), k, n)
        sizes.append(sum(rule.asks(d) for d in ids))
    std = math.sqrt(k * (1 - k / n))
    assert abs(np.mean(sizes) - k) <= 4 * std / math.sqrt(40)
    assert all(abs(s - k) <= 5 * std for s in sizes)
    assert len(set(sizes)) > 1  # a random, not fixed, group size


def test_the_request_never_lists_the_population_and_the_server_computes_the_same_group() -> None:
    req = _population(k=3, available=10)
    text = req.to_json()
    enrolled = [f"dev-{i}" for i in range(10)]
    assert not any(d in text for d in enrolled)
    planned = [d for d in enrolled if req.select.asks(d)]  # the server's ledger mirror
    device_side = [d for d in enrolled if decode_request(text).asks(d)]
    assert planned == device_side


def test_the_salt_is_derived_so_a_replay_asks_the_same_devices() -> None:
    assert derive_salt(KEY, "s", 1, 1, "m2") == derive_salt(KEY, "s", 1, 1, "m2")
    salts = {derive_salt(KEY, "s", t, r, p) for t in range(5) for r in (1, 2) for p in ("a", "b")}
    assert len(salts) == 20 and derive_salt(b"other-key-16byte", "s", 1, 1, "m2") not in salts


def test_sample_rule_edges() -> None:
    salt = bytes(16)
    assert sample_rule(salt, 0, 50).rate == 0 and sample_rule(salt, 5, 0).rate == 0
    assert sample_rule(salt, 80, 50).threshold == MAX_MODULUS  # more than available: everyone
    assert sample_rule(salt, 1, 4).rate == 0.25
    with pytest.raises(ProtocolError, match="16 bytes"):
        Selection("hash", b"short", 1, 2)


# -- check_reports: every lie is a dead letter with its reason ---------------------------------


def _check(items: list[object], *open_reqs: Request, seen: SeenReports | None = None):  # type: ignore[no-untyped-def]
    seen = seen or SeenReports(window=10, per_window=20)
    return check_reports(items, {r.id: r for r in open_reqs}, seen)  # type: ignore[arg-type]


def test_each_lie_gets_its_own_reason_and_the_honest_reports_pass() -> None:
    grr, pop, cgm = _budget(), _population(k=50, available=100), _cgm()
    asked = next(d for d in (f"d{i}" for i in range(100)) if pop.asks(d))
    not_asked = next(d for d in (f"d{i}" for i in range(100)) if not pop.asks(d))
    honest = [Report.answering(grr, "alice", 2), Report.answering(pop, asked, [1, 2, 3]),
              Report.answering(cgm, "carol", {"x": [1.0, 2.0], "v": 0.5})]  # fmt: skip
    other = Request("country", 3, 1, "m1", OracleSpec("GRR", 4), 0.25, 10, delta=0.1)
    lies = [
        (Report.answering(grr, "alice", 1), DUPLICATE),
        (Report.answering(pop, not_asked, [1, 2, 3]), NOT_ASKED),
        (Report.answering(other, "bob", 1), UNKNOWN_REQUEST),  # a request never issued
        (Report(grr.id, "country", 3, 1, "m1", "bob", "OUE", 0.25, "0100"), ORACLE_MISMATCH),
        (Report(grr.id, "country", 3, 1, "m1", "bob", "GRR", 2.0, 1), BUDGET_MISMATCH),
        (Report.answering(grr, "dave", 4), SHAPE_MISMATCH),  # category d = 4 of [0, 4)
        (Report.answering(pop, asked + "x" if pop.asks(asked + "x") else asked, [1, 2, 9]),
         SHAPE_MISMATCH),  # y ≥ g = 4 at ε = 1
        (Report.answering(cgm, "erin", {"x": [1.0], "v": 0.5}), SHAPE_MISMATCH),
        (Report.answering(cgm, "erin", {"x": [1.0, 2.0], "v": 1.5}), SHAPE_MISMATCH),
    ]  # fmt: skip
    accepted, dead = _check([*honest, *(r for r, _ in lies)], grr, pop, cgm)
    assert accepted == honest
    assert [d.reason for d in dead] == [reason for _, reason in lies]
    assert all(d.reason in PROTOCOL_REASONS and d.detail for d in dead)


def test_lines_that_are_not_reports_are_dead_letters_and_a_leaked_field_is_not_copied() -> None:
    rep = json.loads(Report.answering(_budget(), "alice", 2).to_json())
    lines = ["{", json.dumps(rep | {"version": 9}), json.dumps(rep | {"raw": 3, "ts": 1.5}),
             json.dumps({k: v for k, v in rep.items() if k != "device"}), b"\xff\xfe"]  # fmt: skip
    accepted, dead = _check(lines, _budget())
    assert accepted == []
    assert [d.reason for d in dead] == [MALFORMED, UNSUPPORTED_VERSION, UNEXPECTED_FIELD,
                                        "missing_field", MALFORMED]  # fmt: skip
    leaked = dead[2]
    assert "raw" in leaked.payload and "3" not in leaked.payload.replace("raw", "")
    assert leaked.original is None


def test_numbers_beyond_the_float_range_are_refused_never_raised() -> None:
    """A report holding ``1e400`` was read as infinity: its dead letter could not be written
    (canonical JSON has no infinity) and the failure halted the whole stream; an integer
    beyond the float range as ``epsilon`` or as an HM or CGM value raised ``OverflowError``
    out of every check. Now each is an ordinary refusal with its reason."""
    grr, hm, cgm = _budget(), REQUESTS[3], REQUESTS[4]
    good = Report.answering(grr, "alice", 2).to_json()
    for field, literal in (("value", "2"), ("epsilon", "0.25")):
        for huge in ("1e400", "-1e400"):
            line = good.replace(f'"{field}":{literal}', f'"{field}":{huge}')
            with pytest.raises(ProtocolError) as refused:
                decode_report(line)
            assert refused.value.reason == MALFORMED and "float range" in refused.value.detail
    big = 10**400
    with pytest.raises(ProtocolError) as refused:
        Report(grr.id, "country", 3, 1, "m1", "alice", "GRR", big, 2)
    assert refused.value.reason == "invalid_type"
    huge_hm = Report.answering(hm, "bob", big)
    huge_cgm = Report.answering(cgm, "carol", {"x": [big, 0.0], "v": 0.5})
    accepted, dead = _check([huge_hm, huge_cgm], hm, cgm)
    assert accepted == [] and [d.reason for d in dead] == [SHAPE_MISMATCH, SHAPE_MISMATCH]
    assert all(d.payload for d in dead)  # the dead letters are written


def test_a_closed_round_and_a_replayed_old_report_are_refused() -> None:
    seen = SeenReports(window=10, per_window=20)
    r1, r2, later = _budget(slot=3, round=1), _budget(slot=3, round=2), _budget(slot=5)
    first = Report.answering(r1, "alice", 1)
    assert _check([first], r1, seen=seen)[0] == [first]
    seen.close(r1)
    assert seen.accepted == set()
    _, dead = _check([first], r2, seen=seen)
    assert [d.reason for d in dead] == [CLOSED_ROUND]
    seen.close(r2)
    _, dead = _check([first, Report.answering(r2, "bob", 0)], later, seen=seen)
    assert [d.reason for d in dead] == [CLOSED_ROUND, CLOSED_ROUND]
    seen.close(later)
    _, dead = _check([first], _budget(slot=6), seen=seen)
    assert [d.reason for d in dead] == [REPLAYED]


def test_a_flooding_device_is_rate_limited_and_nobody_else_is() -> None:
    """per_window = 4 in a 3-slot window: the flooder's 5th attempt (garbage or not) and
    every later one is rate_limited; an honest device in the same batch is accepted."""
    seen = SeenReports(window=3, per_window=4)
    req = _budget()
    flood = [Report.answering(req, "mallory", i % 4) for i in range(10)]
    honest = Report.answering(req, "alice", 0)
    accepted, dead = _check([*flood[:5], honest, *flood[5:]], req, seen=seen)
    assert accepted == [flood[0], honest]
    reasons = [d.reason for d in dead]
    assert reasons == [DUPLICATE] * 3 + [RATE_LIMITED] * 6
    # three slots later the window has moved on: the device may report again
    nxt = _budget(slot=6)
    assert _check([Report.answering(nxt, "mallory", 1)], nxt, seen=seen)[0] != []


def test_unknown_streams_share_one_bucket_so_invented_names_cannot_grow_the_state() -> None:
    seen = SeenReports(window=3, per_window=2)
    req = _budget()
    fakes = [Report(req.id, f"s{i}", 3, 1, "m1", "mallory", "GRR", 0.25, 0) for i in range(50)]
    _, dead = _check(fakes, req, seen=seen)
    assert [d.reason for d in dead] == [UNKNOWN_REQUEST] * 2 + [RATE_LIMITED] * 48
    assert len(seen.attempts) == 1


# -- the property: any interleaving of honest and lying reports --------------------------------

DEVICES = [f"h{i}" for i in range(12)]
LIARS = [f"liar{i}" for i in range(4)]
OPEN = [_budget(), _budget(purpose="m2", oracle="OUE"), _population(k=6, available=12)]
LIES = ["dup", "not_asked", "budget", "oracle", "shape", "unknown", "old"]


def _honest() -> list[Report]:
    return [Report.answering(r, d, _value(r)) for r in OPEN for d in DEVICES if r.asks(d)]


def _lie(kind: str, liar: str, req: Request) -> Report:
    base = Report.answering(req, liar, _value(req))
    changes = {"budget": {"epsilon": req.epsilon * 2}, "oracle": {"oracle": "HM"},
               "shape": {"value": [0, 1]}, "unknown": {"request": "0" * 32},
               "old": {"slot": 1}, "dup": {}, "not_asked": {"request": OPEN[2].id}}  # fmt: skip
    fields = base.__dict__ | changes[kind]
    if kind == "not_asked":  # a liar the population rule does not ask
        fields |= {k: getattr(OPEN[2], k) for k in ("stream", "slot", "round", "purpose")}
    return Report(**fields)


@settings(max_examples=150, deadline=None)
@given(
    lies=st.lists(st.tuples(st.sampled_from(LIES), st.sampled_from(LIARS), st.integers(0, 2)),
                  max_size=40),
    order=st.randoms(use_true_random=False),
    split=st.integers(1, 6),
)  # fmt: skip
def test_any_interleaving_accepts_every_honest_report_and_only_valid_ones(lies, order, split):  # type: ignore[no-untyped-def]
    honest = _honest()
    lying = [_lie(kind, liar, OPEN[i]) for kind, liar, i in lies]
    items = honest + lying
    order.shuffle(items)
    seen = SeenReports(window=10, per_window=3 * 10)
    by_id = {r.id: r for r in OPEN}
    accepted: list[Report] = []
    for i in range(0, len(items), split):  # arbitrary batch boundaries
        ok, dead = check_reports(items[i : i + split], by_id, seen)
        accepted += ok
        assert all(d.reason in PROTOCOL_REASONS and d.stream is not None for d in dead)
    keys = [(r.request, r.device) for r in accepted]
    assert len(keys) == len(set(keys))  # at most one per (request, device)
    for rep in accepted:
        req = by_id[rep.request]
        assert req.asks(rep.device) and rep.oracle == req.oracle.name
        assert rep.epsilon == req.epsilon and req.oracle.shape_error(rep.value, req.epsilon) is None
    honest_accepted = [r for r in accepted if r.device in DEVICES]
    assert sorted(honest_accepted, key=Report.to_json) == sorted(honest, key=Report.to_json)
