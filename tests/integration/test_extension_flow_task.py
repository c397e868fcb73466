"""The worked example's task axis against Kafka: a flow file whose stream belongs to the
external family ``example_task`` (``tests/extension/site``) and declares its new key
``threshold = X`` runs as ``privstream run --config`` over the embedded broker, in a process of
its own that discovers the family through ``PYTHONPATH``."""

from __future__ import annotations

import json
import math
from pathlib import Path

from privstream.connectors.datasets import synthetic_dataset
from privstream.connectors.kafka import KafkaSettings
from privstream.mechanisms.tasks import FrequencyTask
from tests.extension.conftest import external_site  # noqa: F401  (the fixture)

from .conftest import Topics, last_released, read_all, run_cli
from .extension_flows import run_flow, topic_names, write_flow

USERS, SLOTS, LAST, EPS, W, X = 2000, 8, 7, 1.0, 4, 0.1


def _flow(path: Path, kafka: KafkaSettings, topics: Topics) -> Path:
    names = topic_names(topics)
    stream = {"name": "load", "family": "example-task", "mechanisms": ["LBU"], "threshold": X,
              "share": 1.0}  # fmt: skip
    population = {"users": USERS, "epsilon": EPS, "window": W}
    return write_flow(path, kafka, names, population=population, streams=[stream])


def test_a_flow_file_with_the_new_task_key_runs_against_kafka(
    kafka: KafkaSettings,
    topics: Topics,
    tmp_path: Path,
    secret_file: Path,
    external_site: dict[str, str],  # noqa: F811
) -> None:
    run_cli("produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--dataset",
            "sine", "--stream", "load", "--users", str(USERS), "--slots", str(SLOTS),
            "--no-progress")  # fmt: skip
    config = _flow(tmp_path / "flow.toml", kafka, topics)
    run_flow(config, "--slots", str(LAST), "--secret-file", str(secret_file))
    releases = {m.key().decode(): json.loads(m.value()) for m in read_all(kafka, topics.releases)}
    done = last_released(releases, LAST, SLOTS)  # every slot through it is released whole
    assert set(releases) == {f"load/LBU/{t}" for t in range(1, done + 1)}
    source = synthetic_dataset("sine", USERS, SLOTS, 1)
    sigma = math.sqrt(FrequencyTask(2).variance(EPS / W, USERS))  # LBU: n users at ε/w
    for t in range(1, LAST + 1):
        truth = float((source.values(t) > X).mean())
        assert 0.1 < truth < 0.9  # sine values in [-0.5, 0.5]: a real fraction, not 0 or 1
        above = releases[f"load/LBU/{t}"]["estimate"][1]
        assert abs(above - truth) <= 4.5 * sigma, (t, above, truth)
    ledger = read_all(kafka, topics.ledger)
    assert len({m.key() for m in ledger}) == done
    assert read_all(kafka, topics.dlq) == []
