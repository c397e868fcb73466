"""Flow files of the worked example's external families (``tests/extension/site``) against
the embedded Kafka broker: the flow file (data clock, trusted: the test writes the input topic
itself), the events produced into a topic of its own, ``privstream run --config`` in a process
that discovers the families through ``PYTHONPATH``, and the releases read back."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from privstream.connectors.kafka import (
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    TopicSpec,
    create_topics,
)
from tests.extension.conftest import SITE
from tests.extension.surfaces import flow_file

from .conftest import PRIVSTREAM, Topics, cli_env, read_all, run_cli


def site_env() -> dict[str, str]:
    """The CLI's environment (no ``PRIVSTREAM_*``) with the site first on ``PYTHONPATH``."""
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH")) if p)
    return env


def produce(kafka: KafkaSettings, dataset: str, streams: Sequence[str], users: int,
            slots: int) -> str:  # fmt: skip
    """A fresh input topic of two partitions holding ``users × slots`` events of ``dataset``
    for each of ``streams`` (markers in each partition, ``produce --spread``); its name."""
    events = f"events-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [TopicSpec(events, partitions=2)])
    for stream in streams:
        run_cli("produce", "--bootstrap", kafka.bootstrap, "--topic", events, "--dataset",
                dataset, "--stream", stream, "--users", str(users), "--slots", str(slots),
                "--spread", "--no-progress")  # fmt: skip
    return events


def write_flow(
    path: Path,
    kafka: KafkaSettings,
    topics: Mapping[str, str],
    *,
    population: Mapping[str, Any],
    streams: Sequence[Mapping[str, Any]],
) -> Path:
    """A flow file on ``kafka`` with the ``[kafka]`` ``topics`` (``input_topic``,
    ``output_topic``, …) and the data clock trusted (the test writes the input topic itself)."""
    table = {"bootstrap": kafka.bootstrap, **topics, "clock": "data", "trust_input_clock": True}
    return flow_file(path, kafka=table, population=population, streams=streams)


def topic_names(topics: Topics, **extra: str) -> dict[str, str]:
    """The ``[kafka]`` topic keys of a test's ``topics`` (and ``extra`` ones: an output's)."""
    return {"input_topic": topics.events, "output_topic": topics.releases,
            "ledger_topic": topics.ledger, "dead_letter_topic": topics.dlq, **extra}  # fmt: skip


def tagged_flow(
    directory: Path,
    kafka: KafkaSettings,
    events: str,
    tag: str,
    *,
    population: Mapping[str, Any],
    streams: Sequence[Mapping[str, Any]],
) -> Path:
    """``directory/flow.toml`` reading ``events`` and writing the fresh topics
    ``releases-{tag}`` and ``ledger-{tag}`` (created here, compacted as release topics)."""
    create_topics(kafka, [TopicSpec(f"{k}-{tag}", config=RELEASE_TOPIC_CONFIG)
                          for k in ("releases", "ledger")])  # fmt: skip
    topics = {"input_topic": events, "output_topic": f"releases-{tag}",
              "ledger_topic": f"ledger-{tag}"}  # fmt: skip
    return write_flow(directory / "flow.toml", kafka, topics, population=population,
                      streams=streams)  # fmt: skip


def run_flow(flow: Path, *flags: str) -> None:
    """``privstream run --config flow flags`` in its own process (in ``flow``'s folder) with
    the site on its path; fails with the end of its stderr unless it exits 0."""
    done = subprocess.run([*PRIVSTREAM, "run", "--config", str(flow), *flags],
                          capture_output=True, text=True, timeout=240, env=site_env(),
                          cwd=flow.parent, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def released_once(kafka: KafkaSettings, topic: str) -> list[dict[str, Any]]:
    """Every release of ``topic``, once per key; fails when a repeated key (a resumed or
    replayed slot) carries another payload."""
    releases: dict[bytes, bytes] = {}
    for message in read_all(kafka, topic):
        assert releases.setdefault(message.key(), message.value()) == message.value()
    return [json.loads(v) for v in releases.values()]
