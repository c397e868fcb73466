"""One hot stream on user shards over Kafka (issue 26): a personalized stream, and an LDP-IDS
stream of a closed population, over four partitions, on the markers clock, run by
``privstream run --config`` with ``shards = 8``.

It must release byte for byte what the same stream on one key releases — as one process, as a
cluster of two, and after one of the cluster's processes is SIGKILLed mid-stream and the
cluster is restarted from its recovery store.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from privstream.connectors.kafka import (
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    TopicSpec,
    create_topics,
)

from .conftest import run_cli, same_incarnation, write_secret
from .test_cluster import _outputs, _run, kill_a_member

USERS, LAST = 1200, 10
PERSONALIZED = ("personalized", ("PBD", "PBA"), "")
LDP_CLOSED = ("ldp-ids", ("LBU", "LBA"), "registered_only = true\n")
"""A family, its two mechanisms and what else its stream's table says."""


def _config(
    directory: Path,
    kafka: KafkaSettings,
    events: str,
    tag: str,
    shards: int | None,
    stream: tuple[str, tuple[str, ...], str] = PERSONALIZED,
) -> Path:
    """A flow file of one stream (``stream``: personalized unless given) over ``events``
    (``shards``: None for one key), writing to topics named after ``tag`` and ``events``
    (created here: a release topic of another test holds another incarnation's releases, and
    a run waits out its cooldown)."""
    tag = f"{tag}-{events}"
    outputs = {"output_topic": f"releases-{tag}", "ledger_topic": f"ledger-{tag}",
               "dead_letter_topic": f"dlq-{tag}"}  # fmt: skip
    create_topics(kafka, [TopicSpec(t, config=RELEASE_TOPIC_CONFIG) for t in outputs.values()])
    family, names, extra = stream
    local = family != "personalized"  # a closed LDP population: ε per 5 slots holds for all
    (directory / "registrations.csv").write_text("user,epsilon,window\n" + "".join(
        f"u{u},{2.0 if u % 3 or local else 1.0},{5 if u % 2 or local else 6}\n"
        for u in range(USERS)))  # fmt: skip
    topics = "".join(f'{key} = "{name}"\n' for key, name in outputs.items())
    sharding = "" if shards is None else f"shards = {shards}\n"
    path = directory / f"flow-{tag}.toml"
    path.write_text(
        f"""
[kafka]
bootstrap = "{kafka.bootstrap}"
input_topic = "{events}"
{topics}
[population]
users = {USERS}
epsilon = 2.0
window = 5
registrations = "registrations.csv"

[[streams]]
name = "visits"
family = "{family}"
mechanisms = [{", ".join(f'"{m}"' for m in names)}]
budget_split = "equal"
domain = 4
share = 1.0
{extra}{sharding}"""
    )
    return path


def _produce(kafka: KafkaSettings, topic: str, key: str, first: int, last: int) -> None:
    run_cli("produce", "--bootstrap", kafka.bootstrap, "--topic", topic, "--dataset", "sin",
            "--stream", "visits", "--users", str(USERS), "--first-slot", str(first),
            "--last-slot", str(last), "--spread", "--no-progress", "--secret-file", key)  # fmt: skip


@pytest.fixture
def topic(kafka: KafkaSettings) -> str:
    name = f"events-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [TopicSpec(name, partitions=4)])
    return name


@pytest.mark.parametrize(
    ("stream", "runs"),
    [(PERSONALIZED, (("sharded", "1"), ("cluster", "2"))), (LDP_CLOSED, (("cluster", "2"),))],
    ids=["personalized", "ldp-closed"],
)
def test_shards_and_processes_release_what_one_key_releases(
    kafka: KafkaSettings,
    topic: str,
    tmp_path: Path,
    stream: tuple[str, tuple[str, ...], str],
    runs: tuple[tuple[str, str], ...],
) -> None:
    key = str(write_secret(tmp_path / "noise.key"))
    _produce(kafka, topic, key, 1, LAST + 1)
    one = _run(_config(tmp_path, kafka, topic, "one", None, stream), "--slots", str(LAST),
               "--secret-file", key, "--recovery-dir", str(tmp_path / "store"))  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    alone = _outputs(kafka, f"one-{topic}")
    assert {f"visits/{m}/{t}".encode() for m in stream[1] for t in range(1, LAST + 1)} <= (
        alone["releases"].keys()
    )
    for tag, processes in runs:
        store = same_incarnation(tmp_path / "store", tmp_path / f"store-{tag}")  # the same noise
        run = _run(_config(tmp_path, kafka, topic, tag, 8, stream), "--slots", str(LAST),
                   "--secret-file", key, "--processes", processes,
                   "--recovery-dir", str(store))  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        assert _outputs(kafka, f"{tag}-{topic}") == alone, tag


def test_a_killed_process_of_a_sharded_cluster_restarts_to_the_same_releases(
    kafka: KafkaSettings, topic: str, tmp_path: Path
) -> None:
    key = str(write_secret(tmp_path / "noise.key"))
    _produce(kafka, topic, key, 1, 5)
    config = _config(tmp_path, kafka, topic, "killed", 8)
    store = str(tmp_path / "store")
    code, _ = kill_a_member(kafka, config, key, store, f"releases-killed-{topic}", b"visits/PBA/3")
    assert code != 0, "a cluster that lost a process must not report success"
    _produce(kafka, topic, key, 6, LAST + 1)
    restarted = _run(config, "--slots", str(LAST), "--secret-file", key, "--processes", "2",
                     "--recovery-dir", store)  # fmt: skip
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    alone_store = same_incarnation(Path(store), tmp_path / "alone-store")
    alone = _run(_config(tmp_path, kafka, topic, "alone", None), "--slots", str(LAST),
                 "--secret-file", key, "--recovery-dir", str(alone_store))  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert _outputs(kafka, f"killed-{topic}") == _outputs(kafka, f"alone-{topic}")
