"""The simulated fleet's answering logic without Kafka (``privstream.runtime.fleet``): honest
reports pass ``check_reports``, every lie is a dead letter with its expected reason, the device
ledgers refuse an over-budget request, dropout and lateness are counted."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest

from privstream.connectors.datasets import synthetic_dataset
from privstream.runtime.fleet import (
    EXPECTED_REASONS,
    LIES,
    Fleet,
    FleetConfig,
    Message,
    device_id,
)
from privstream.schema.protocol import (
    CLOSED_ROUND,
    OracleSpec,
    Request,
    SeenReports,
    check_reports,
    derive_salt,
    sample_rule,
)

USERS, LIARS, W = 40, len(LIES), 3
HONEST = USERS - LIARS
KEY = bytes(32)


def scenario() -> list[Request]:
    """Stream ``a`` (budget division, GRR): ε 0.6 at slot 1, ε 0.6 again at slot 2 (over the
    devices' ε = 1 per 3 slots: every device that answered slot 1 refuses), ε 0.3 at slot 5;
    stream ``b`` (population division, OLH, a hash rule asking 10 of 40 in expectation);
    streams ``c`` (OUE) and ``h`` (HM) once each."""
    rule = sample_rule(derive_salt(KEY, "b", 1, 1, "m2"), 10, USERS)
    return [
        Request("a", 1, 1, "m1", OracleSpec("GRR", 4), 0.6, W),
        Request("b", 1, 1, "m2", OracleSpec("OLH", 5), 1.0, W, "population", rule),
        Request("c", 1, 1, "m1", OracleSpec("OUE", 3), 0.5, W),
        Request("h", 1, 1, "m1", OracleSpec("HM"), 0.5, W),
        Request("a", 2, 1, "m1", OracleSpec("GRR", 4), 0.6, W),
        Request("a", 5, 1, "m1", OracleSpec("GRR", 4), 0.3, W),
    ]


def serve(
    requests: Sequence[Request], batches: Sequence[Sequence[Message]], seen: SeenReports
) -> tuple[dict[str, Counter[str]], dict[str, int]]:
    """The server's side: batch ``i`` is judged while request ``i`` alone is open (then its
    round closes); a last batch, if any, after every round closed. Returns each device's
    dead-letter reasons and accepted-report count."""
    dead: dict[str, Counter[str]] = defaultdict(Counter)
    accepted: dict[str, int] = defaultdict(int)
    for i, batch in enumerate(batches):
        req = requests[i] if i < len(requests) else None
        opened = {req.id: req} if req is not None else {}
        ok, letters = check_reports([value for _, value in batch], opened, seen)
        for report in ok:
            accepted[report.device] += 1
        for letter in letters:  # a refused report's dead letter carries the report
            dead[json.loads(letter.payload)["device"]][letter.reason] += 1
        if req is not None:
            seen.close(req)
    return dead, accepted


def check_fleet_output(
    requests: Sequence[Request],
    batches: Sequence[Sequence[Message]],
) -> tuple[dict[str, Counter[str]], dict[str, int]]:
    """Assert what every honest device and every liar should see from the server."""
    dead, accepted = serve(requests, batches, SeenReports(window=W, per_window=4))
    honest = {device_id(u) for u in range(HONEST)}
    for device in honest:  # an honest report is refused only for coming late
        assert set(dead.get(device, {})) <= {CLOSED_ROUND}
    for j, lie in enumerate(LIES):
        liar = device_id(HONEST + j)
        assert dead[liar], lie
        assert set(dead[liar]) <= set(EXPECTED_REASONS[lie]), (lie, dead[liar])
        expected_accepts = lie in ("duplicate", "flood")
        assert (accepted.get(liar, 0) > 0) == expected_accepts, lie
    return dead, accepted


def run_scenario(fleet: Fleet, requests: Sequence[Request]) -> list[list[Message]]:
    batches = [fleet.receive(r.to_json()) for r in requests]
    return [*batches, fleet.flush()]


def _fleet(dropout: float = 0.0, late: float = 0.0, store_dir: Path | None = None) -> Fleet:
    config = FleetConfig(USERS, 1.0, W, dropout, late, LIARS, 8, store_dir, seed=7)
    return Fleet(config, synthetic_dataset("lns", USERS, 10, 1))


def test_honest_reports_pass_and_every_lie_is_a_dead_letter_with_its_reason() -> None:
    requests = scenario()
    fleet = _fleet()
    batches = run_scenario(fleet, requests)
    dead, accepted = check_fleet_output(requests, batches)
    b = requests[1]
    asked_b = sum(b.asks(device_id(u)) for u in range(HONEST))
    # every honest device answers a, c, h at slot 1 and a at slot 5; b if asked; slot 2 refused
    assert fleet.stats.reports == HONEST * 4 + asked_b
    assert sum(accepted[device_id(u)] for u in range(HONEST)) == HONEST * 4 + asked_b
    assert fleet.stats.refused == Counter({"exhausted": HONEST})
    assert fleet.stats.not_asked == HONEST - asked_b
    # the flood liar (8 copies, limit 4 per window): 1 accepted, 3 duplicates, 4 rate limited
    flood = device_id(HONEST + LIES.index("flood"))
    assert dead[flood]["rate_limited"] >= 4
    assert dead[device_id(HONEST + LIES.index("replay"))] == Counter({"replayed_report": 1})
    assert fleet.stats.lies["not-asked"] == 1 and fleet.stats.lies["replay"] == 1


def test_dropout_and_late_reports_are_counted_and_late_ones_closed() -> None:
    requests = scenario()
    fleet = _fleet(dropout=0.2, late=0.25)
    batches = run_scenario(fleet, requests)
    dead, _ = check_fleet_output(requests, batches)
    s = fleet.stats
    assert s.dropped > 0 and s.late > 0
    late_dead = sum(dead[device_id(u)][CLOSED_ROUND] for u in range(HONEST))
    assert late_dead == s.late
    asked = HONEST * len(requests) - s.not_asked
    assert s.dropped + s.reports + sum(s.refused.values()) == asked
    # a device that dropped out at slot 1 of a still had its budget at slot 2
    assert 0 < s.refused["exhausted"] < HONEST
    text = "\n".join(s.lines())
    assert "sim-" not in text and "requests seen: 6" in text


def test_file_stores_keep_each_devices_spend_across_fleets(tmp_path: Path) -> None:
    first = _fleet(store_dir=tmp_path)
    first.receive(scenario()[0].to_json())
    again = _fleet(store_dir=tmp_path)  # a restarted fleet: the same ledgers from disk
    again.receive(scenario()[4].to_json())
    assert again.stats.refused == Counter({"exhausted": HONEST})
    assert len(list(tmp_path.glob("sim-*.json"))) == HONEST


def test_a_malformed_request_is_counted_and_answered_by_nobody() -> None:
    fleet = _fleet()
    assert fleet.receive(b'{"type": "privstream.request", "version": 2}') == []
    assert fleet.stats.invalid_requests == Counter({"unsupported_version": 1})
    assert fleet.stats.requests == 0


@pytest.mark.parametrize(
    ("kw", "word"),
    [({"dropout": 1.5}, "--dropout"), ({"liars": 41}, "--liars"), ({"users": 0}, "--users")],
)
def test_a_refused_configuration_names_the_flag(kw: dict[str, float], word: str) -> None:
    args: dict[str, float] = {"users": USERS} | kw
    with pytest.raises(ValueError, match=word):
        FleetConfig(**args)  # type: ignore[arg-type]
