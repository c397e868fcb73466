"""`privstream bench kafka`: one small run end to end (embedded broker), and the raw reader's
consumer configuration staying the flow source's. No timing assertions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from privstream.cli import commands as cli
from privstream.connectors import kafka
from privstream.connectors.kafka import (
    POLL_MESSAGES,
    KafkaEventSource,
    KafkaSettings,
    consumer_config,
)
from privstream.experiments.kafka import format_result

USERS, SLOTS = 2000, 10


def test_bench_kafka_counts_every_message_for_both_readers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    argv = ["bench", "kafka", "--users", str(USERS), "--slots", str(SLOTS), "--repeats", "1"]
    assert cli.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())

    expected = USERS * SLOTS + SLOTS  # events plus one end-of-slot marker per slot
    assert result["messages"] == expected
    assert (result["events"], result["markers"]) == (USERS * SLOTS, SLOTS)
    assert result["params"] == {
        "dataset": "sin", "users": USERS, "slots": SLOTS, "mechanisms": ["LBU"], "repeats": 1,
        "batch_size": POLL_MESSAGES, "workers": 1, "partitions": 1,
    }  # fmt: skip
    assert result["broker"].startswith("embedded Tansu")
    for reader in ("raw", "flow"):
        block = result[reader]
        assert len(block["runs"]) == 1
        run = block["runs"][0]
        assert run["messages"] == expected
        assert run["seconds"] > 0 and run["cpu_seconds"] >= 0
        assert block["best_events_per_second"] > 0 and block["median_events_per_second"] > 0
    assert result["raw"]["runs"][0]["bytes"] > 0
    flow = result["flow"]["runs"][0]
    assert flow["accepted_events"] == USERS * SLOTS and flow["dead_letters"] == 0
    assert flow["released_through"] == SLOTS
    assert result["ratio"] > 0 and result["target"] == 0.90
    assert result["target_met"] == (result["ratio"] >= 0.90)
    stages = result["stages"]
    assert stages["parse_cpu_seconds"] > 0 and stages["slotting_cpu_seconds"] > 0
    assert set(stages["us_per_message"]) == {
        "raw_thread", "flow_thread", "parse_offline", "slotting_offline",
    }  # fmt: skip

    printed = capsys.readouterr().out
    assert printed.strip() == format_result(result)
    assert "ratio flow/raw (medians)" in printed and "raw consumer" in printed


def test_bench_kafka_over_several_partitions_reads_each_with_its_own_consumer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Events round-robin over the partitions, each slot's marker in every one: both readers
    count every message of every partition, and the flow releases every slot."""
    users, slots, parts = 301, 4, 3
    out = tmp_path / "bench.json"
    argv = ["bench", "kafka", "--users", str(users), "--slots", str(slots), "--repeats", "1"]
    assert cli.main([*argv, "--partitions", str(parts), "--json", str(out)]) == 0
    result = json.loads(out.read_text())

    expected = users * slots + slots * parts
    assert (result["messages"], result["markers"]) == (expected, slots * parts)
    assert result["params"]["partitions"] == parts
    assert result["raw"]["runs"][0]["messages"] == result["flow"]["runs"][0]["messages"] == expected
    flow = result["flow"]["runs"][0]
    assert (flow["accepted_events"], flow["dead_letters"]) == (users * slots, 0)
    assert flow["released_through"] == slots
    assert "3 partitions" in capsys.readouterr().out


def test_partition_counts_follow_the_round_robin_of_produce_spread() -> None:
    from privstream.experiments.kafka import partition_counts

    assert partition_counts(10, 3, 1) == [33]
    assert partition_counts(10, 3, 3) == [3 * (4 + 1), 3 * (3 + 1), 3 * (3 + 1)]
    assert sum(partition_counts(20_000, 100, 4)) == 20_000 * 100 + 100 * 4


def test_the_raw_reader_uses_the_flow_sources_consumer_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[dict[str, Any]] = []

    class Recorder:
        def __init__(self, config: dict[str, Any]) -> None:
            seen.append(dict(config))

        def assign(self, _partitions: Any) -> None:
            pass

    monkeypatch.setattr(kafka, "Consumer", Recorder)
    settings = KafkaSettings(("localhost:9092",), {"fetch.wait.max.ms": "5", "client.id": "x"})
    KafkaEventSource(settings, "events").build_part("kafka_in", "partition-0", None)
    assert seen == [consumer_config(settings)]
    assert seen[0]["fetch.wait.max.ms"] == "5"  # client properties win over the defaults


def test_a_full_prefetch_queue_is_checked_again_within_a_fetch_wait() -> None:
    """librdkafka's default ``fetch.queue.backoff.ms`` (1000) idled a backlog's reader for up
    to a second whenever a poll emptied a partition's bounded queue; a flow's consumers look
    again as soon as the broker may answer a fetch, and a flow's properties still win."""
    for partitions in (1, 8, 64):
        config = consumer_config(KafkaSettings(("localhost:9092",)), partitions=partitions)
        assert int(config["fetch.queue.backoff.ms"]) <= int(config["fetch.wait.max.ms"]) == 10
    mine = KafkaSettings(("localhost:9092",), {"fetch.queue.backoff.ms": "200"})
    assert consumer_config(mine)["fetch.queue.backoff.ms"] == "200"


def test_the_offline_stage_timing_runs_several_mechanisms() -> None:
    from privstream.experiments.kafka import stage_times
    from privstream.flows.io import resolve_source

    source = resolve_source("sin", 500, 4, 1)
    stages = stage_times(source, 500, 4, ["LBU", "LPA"], 700)
    assert (stages["messages"], stages["events"]) == (500 * 4 + 4, 500 * 4)
    spread = stage_times(source, 500, 4, ["LBU"], 700, partitions=3)
    assert (spread["messages"], spread["events"]) == (500 * 4 + 4 * 3, 500 * 4)
