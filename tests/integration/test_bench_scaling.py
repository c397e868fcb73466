"""``privstream bench kafka --streams --processes``: the scaling table is measured, not made up —
the flow really ran on P processes over every message of the topic, and both readers' rates and
ratios are consistent with each other."""

from __future__ import annotations

import pytest

from privstream.connectors.kafka import KafkaSettings
from privstream.experiments.scaling import bench_scaling, format_scaling


def test_the_scaling_table_holds_both_readers_for_every_process_count(
    kafka: KafkaSettings,
) -> None:
    result = bench_scaling(kafka, partitions=4, streams=3, processes=(1, 2), users=300, slots=4)
    # three streams × 300 users × 4 slots, and each slot's marker on each of the 4 partitions
    assert result["messages"] == 3 * 300 * 4 + 3 * 4 * 4
    rows = result["rows"]
    assert [r["processes"] for r in rows] == [1, 2]
    for row in rows:
        assert row["flow"] > 0 and row["raw"] > 0
        assert row["ratio"] == pytest.approx(row["flow"] / row["raw"])
        assert row["flow_scaling"] == pytest.approx(row["flow"] / rows[0]["flow"])
    assert rows[0]["flow_scaling"] == rows[0]["raw_scaling"] == 1.0
    table = format_scaling(result)
    assert "processes  flow msg/s" in table and len(table.splitlines()) == 4
