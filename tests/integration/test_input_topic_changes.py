"""Issue 27 item 5: an input topic deleted and re-created under a recovery store.

Before: the resume went on at the stored offsets of the old topic — on a re-created topic
with more messages it silently skipped the first ones (here slots 4–6: released from no
events), with fewer it idled for ever. Now the snapshot holds the topic's id and a resume on
another id is refused, saying what happened and what to do; ``--input-topic-recreated``
reads the new topic from its beginning with every budget kept.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

from privstream.connectors.kafka import KafkaSettings, TopicSpec, create_topics, existing_topics

from .conftest import PRIVSTREAM, Topics, cli_env, read_all, run_cli
from .test_kafka_flow import event, marker, produce_lines, run_flags

USERS = 20


def slots(first: int, last: int) -> list[bytes]:
    return [
        line
        for t in range(first, last + 1)
        for line in [*(event(u, t, (u + t) % 2) for u in range(USERS)), marker(t)]
    ]


def recreate(kafka: KafkaSettings, topic: str) -> None:
    admin = AdminClient(kafka.client_config())
    for future in admin.delete_topics([topic]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while topic in existing_topics(kafka) and time.monotonic() < deadline:
        time.sleep(0.2)
    create_topics(kafka, [TopicSpec(topic)])


def test_a_recreated_input_topic_is_refused_then_read_from_its_beginning(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path, secret_file: Path
) -> None:
    rec = ["--recovery-dir", str(tmp_path / "rec")]
    produce_lines(kafka, topics.events, slots(1, 3))
    run_cli(*run_flags(topics, kafka, USERS, 3, "LBU", secret_file), *rec)
    recreate(kafka, topics.events)
    produce_lines(kafka, topics.events, slots(4, 9))  # more messages than were read: 126 > 63
    refused = subprocess.run(
        [*PRIVSTREAM, *run_flags(topics, kafka, USERS, 9, "LBU", secret_file), *rec],
        capture_output=True, text=True, timeout=120, env=cli_env(),
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "was deleted and re-created" in refused.stderr
    assert "--input-topic-recreated" in refused.stderr
    run_cli(*run_flags(topics, kafka, USERS, 9, "LBU", secret_file), *rec,
            "--input-topic-recreated")  # fmt: skip
    releases = [json.loads(m.value()) for m in read_all(kafka, topics.releases)]
    by_slot = {r["slot"]: r for r in releases}
    assert sorted(by_slot) == list(range(1, 10))
    assert len(releases) == 9  # nothing released twice
    assert all(by_slot[t]["details"]["users_m2"] == USERS for t in range(4, 10))  # none skipped
    assert read_all(kafka, topics.dlq) == []
