"""The shuffler's book for ``ldp-reports`` rounds (``runtime.shuffle_reports``) and the server's
reading of a shuffler's topic (``flows.reports.parse_shuffled_poll``), Kafka-free: a round's
requests are forwarded as counts once its closing marker arrived on every partition, then the
marker; an opening marker once; reports are judged as the server judges them, a device's
conflicting copies left out; non-countable oracles and late reports are refused; and the server
takes batches and markers, never a raw report."""

from __future__ import annotations

from privstream.connectors.kafka import RawBatch
from privstream.flows.reports import parse_shuffled_poll
from privstream.runtime.shuffle_reports import ReportShuffleBook
from privstream.schema.events import DeadLetter
from privstream.schema.protocol import Close, OracleSpec, Report, Request
from privstream.schema.shuffle import ReportBatch

GRR3 = Request("sin", 1, 1, "LBU.publish", OracleSpec("GRR", 3), 0.5, 4)
OUE4 = Request("sin", 1, 1, "LBD.publish", OracleSpec("OUE", 4), 0.5, 4)
OLH = Request("sin", 1, 1, "LPU.publish", OracleSpec("OLH", 8), 0.5, 4)


def report(request: Request, device: str, value: object, eps: float = 0.5) -> Report:
    return Report(request.id, "sin", 1, 1, request.purpose, device, request.oracle.name, eps, value)


def book() -> ReportShuffleBook:
    b = ReportShuffleBook("s-1", 2, n_min=2)
    for r in (GRR3, OUE4, OLH):
        b.add_request(r)
    return b


def test_a_round_closes_on_every_partition_and_forwards_counts_then_the_marker() -> None:
    b = book()
    assert b.take_marker(0, Close("sin", 1, 0)) == [Close("sin", 1, 0)]
    assert b.take_marker(1, Close("sin", 1, 0)) == []  # an opening marker once per slot
    for i, v in enumerate([0, 2, 2, 1]):
        assert b.take_report(i % 2, report(GRR3, f"d-{i}", v)) is None
    for i, bits in enumerate(["1001", "0011"]):
        assert b.take_report(i % 2, report(OUE4, f"d-{i}", bits)) is None
    assert b.take_marker(0, Close("sin", 1, 1)) == []
    assert b.take_report(0, report(GRR3, "d-9", 1)) == "late_report"  # after its partition's marker
    out = b.take_marker(1, Close("sin", 1, 1))
    batches = {x.oracle: x for x in out if isinstance(x, ReportBatch)}
    assert out[-1] == Close("sin", 1, 1)
    assert batches["GRR"].counts == (1, 1, 2) and batches["GRR"].n == 4
    assert batches["OUE"].counts == (1, 0, 1, 2) and batches["OUE"].n == 2
    assert all("d-" not in x.to_json() for x in out if isinstance(x, ReportBatch))
    assert b.take_report(0, report(GRR3, "d-8", 1)) == "late_report"  # the round is gone


def test_refusals_mirror_the_servers_and_conflicting_copies_are_left_out() -> None:
    b = book()
    assert b.take_report(0, report(OLH, "d-1", [1, 2, 0])) == "not_countable"
    assert b.take_report(0, report(GRR3, "d-1", 1, eps=0.9)) == "budget_mismatch"
    assert b.take_report(0, report(GRR3, "d-1", 7)) == "shape_mismatch"
    assert b.take_report(0, report(GRR3, "d-1", 1)) is None
    assert b.take_report(1, report(GRR3, "d-1", 1)) is None  # an identical copy counts once
    assert b.take_report(1, report(GRR3, "d-1", 2)) == "duplicate_report"
    assert b.take_report(0, report(GRR3, "d-2", 0)) is None
    b.take_marker(0, Close("sin", 1, 1))
    grr = next(x for x in b.take_marker(1, Close("sin", 1, 1)) if isinstance(x, ReportBatch)
               and x.oracle == "GRR")  # fmt: skip
    assert (grr.n, grr.policy, grr.counts) == (1, "drop", None)  # d-1 left out; 1 < n_min = 2


def test_the_server_reads_batches_and_markers_never_a_raw_report() -> None:
    batch = ReportBatch(GRR3.id, "sin", 1, 1, "GRR", 4, 2, "forward", (1, 1, 2), "s-1")
    raw = report(GRR3, "d-1", 1).to_json().encode()
    marker = Close("sin", 1, 1, "ab" * 16).to_json().encode()
    parsed = parse_shuffled_poll(RawBatch("t", 0, 0, [batch.to_json().encode(), raw, marker]),
                                 frozenset({"sin"}))  # fmt: skip
    assert parsed[0] == ("sin", (0, batch))
    assert isinstance(parsed[1], DeadLetter) and parsed[1].reason == "unknown_request"
    assert parsed[2][1][1] == Close("sin", 1, 1, "ab" * 16)
