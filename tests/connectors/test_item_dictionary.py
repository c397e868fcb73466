"""``privstream items``: records of named items as events over a public item dictionary — the
way to run DPI (or any frequency family) on data such as the paper's COVID, network-traffic or
USDA records, whose items are names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privstream.cli import main
from privstream.connectors.item_dictionary import ItemDictionary, encode, read_records

RECORDS = "user,item,slot\nu1,DE,1\nu2,FR,1\nu3,XX,1\nu4,IT,2\n,FR,2\nu5,FR,\n"


def test_labels_map_to_categories_and_unknown_items_are_dropped_or_other() -> None:
    items = ItemDictionary(("FR", "DE", "IT"))
    assert (items.category("DE"), items.category(" IT "), items.category("XX")) == (1, 2, None)
    assert items.domain == 3
    other = ItemDictionary(("FR", "DE", "IT"), other=True)
    assert (other.category("XX"), other.domain) == (3, 4)
    with pytest.raises(ValueError, match="twice"):
        ItemDictionary(("FR", "FR"))
    with pytest.raises(ValueError, match="at least one"):
        ItemDictionary(())


def test_encode_counts_what_it_drops_by_reason(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text(RECORDS)
    events, tally = encode(read_records(path), ItemDictionary(("FR", "DE", "IT")), stream="s")
    assert events == [
        {"stream": "s", "user": "u1", "slot": 1, "value": 1},
        {"stream": "s", "user": "u2", "slot": 1, "value": 0},
        {"stream": "s", "user": "u4", "slot": 2, "value": 2},
    ]
    assert (tally.events, tally.dropped) == (3, {"unknown_item": 1, "missing_field": 2})


def test_json_lines_keep_their_stream_and_time(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    rows = [{"stream": "a", "user": 7, "country": "IT", "ts": "2024-01-01T00:00:00Z"}, "nope"]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    events, tally = encode(read_records(path), ItemDictionary(("FR", "IT")), item_field="country")
    assert events == [{"stream": "a", "user": "7", "ts": "2024-01-01T00:00:00Z", "value": 1}]
    assert tally.dropped == {"missing_field": 2}


def test_the_command_writes_events_a_dpi_run_reads_and_prints_no_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "r.csv").write_text(RECORDS)
    (tmp_path / "items.txt").write_text("# public top items\nFR\nDE\n\nIT\n")
    out = tmp_path / "events.jsonl"
    status = main(["items", str(tmp_path / "r.csv"), "--dictionary", str(tmp_path / "items.txt"),
                   "--out", str(out), "--stream", "pages"])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 0 and "wrote 3 events" in err and "--domain 3" in err
    assert "unknown_item: 1" in err and "XX" not in err and "u3" not in err
    (tmp_path / "reg.csv").write_text("user,epsilon,window\nu1,2,1\nu2,2,1\nu4,2,1\n")
    releases = tmp_path / "releases.jsonl"
    status = main(["run", "dpi", "--dataset", f"file:{out}", "--domain", "3", "--users", "10",
                   "--registrations", str(tmp_path / "reg.csv"), "--insecure-seed", "1",
                   "--pool-size", "50", "--synopses", "5", "--out", str(releases),
                   "--no-progress"])  # fmt: skip
    assert status == 0
    lines = [json.loads(line) for line in releases.read_text().splitlines()]
    assert [r["release_id"].split("/")[:3] for r in lines] == [
        ["pages", "DPI", "1"],
        ["pages", "DPI", "2"],
    ]
    assert all(len(r["estimate"]) == 3 and abs(sum(r["estimate"]) - 1) < 1e-12 for r in lines)


def test_nothing_encoded_is_exit_1(tmp_path: Path) -> None:
    (tmp_path / "r.csv").write_text("user,item,slot\nu1,XX,1\n")
    (tmp_path / "items.txt").write_text("FR\n")
    status = main(["items", str(tmp_path / "r.csv"), "--dictionary", str(tmp_path / "items.txt"),
                   "--out", str(tmp_path / "e.jsonl")])  # fmt: skip
    assert status == 1
