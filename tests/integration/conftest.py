"""Fixtures of the Kafka integration tests: one embedded broker per test process, fresh topics
per test, and helpers to run the CLI as a real process and read topics back."""

from __future__ import annotations

import json
import os
import secrets
import select
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from privstream.connectors.broker import EmbeddedBroker
from privstream.connectors.kafka import (
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    TopicSpec,
    create_topics,
    wait_for_messages,
)

PRIVSTREAM = [sys.executable, "-m", "privstream.cli"]

THREE_STREAMS = """
[[streams]]
name = "country"
family = "ldp-ids"
mechanisms = ["LBU", "LPA"]
budget_split = "equal"
domain = 2
share = 0.4

[[streams]]
name = "device"
family = "ldp-ids"
mechanisms = ["LBA"]
domain = 2
share = 0.3

[[streams]]
name = "visits"
family = "personalized"
mechanisms = ["PBD"]
domain = 2
share = 0.3
"""
"""The streams of the cluster tests' and the chaos round's flow files (shares 0.4 + 0.3 + 0.3)."""


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture
def kafka(broker: EmbeddedBroker) -> KafkaSettings:
    return KafkaSettings((broker.bootstrap,))


class Topics:
    """Uniquely named topics of one test: events, releases, dlq, ledger."""

    def __init__(self, settings: KafkaSettings) -> None:
        tag = uuid.uuid4().hex[:8]
        self.events, self.releases = f"events-{tag}", f"releases-{tag}"
        self.dlq, self.ledger = f"dlq-{tag}", f"ledger-{tag}"
        create_topics(
            settings,
            [
                TopicSpec(self.events),
                TopicSpec(self.releases, config=RELEASE_TOPIC_CONFIG),
                TopicSpec(self.dlq),
                TopicSpec(self.ledger, config=RELEASE_TOPIC_CONFIG),
            ],
        )

    def run_flags(self, settings: KafkaSettings, *, trusted_clock: bool = True) -> list[str]:
        """The run's topic flags. ``trusted_clock``: the test writes every message of the
        input topic itself and is not about the slot clock, so its events and unauthenticated
        markers may drive the clock (``--clock data --trust-input-clock``); the markers clock
        has its own tests (tests/attacks/test_slot_clock.py, test_kafka_flow.py)."""
        clock = ["--clock", "data", "--trust-input-clock"] if trusted_clock else []
        return [
            "--bootstrap", settings.bootstrap, "--input-topic", self.events,
            "--output-topic", self.releases, "--dead-letter-topic", self.dlq,
            "--ledger-topic", self.ledger, *clock,
        ]  # fmt: skip


@pytest.fixture
def topics(kafka: KafkaSettings) -> Topics:
    return Topics(kafka)


def write_secret(path: Path) -> Path:
    """A fresh 256-bit noise key in ``path`` (mode 600), made as the README says."""
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """The test's secret noise key: every run of one test shares it (same noise, same
    releases; a recovery store is bound to it)."""
    return write_secret(tmp_path / "noise.key")


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVSTREAM_")}
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``privstream`` as its own process; fail with its stderr when it fails."""
    done = subprocess.run(
        [*PRIVSTREAM, *args], capture_output=True, text=True, timeout=timeout, env=cli_env(**env)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def wait_for_line(process: subprocess.Popen[str], prefix: str, timeout: float = 120) -> str:
    """``process``'s stderr up to and including its first line that starts with ``prefix``
    (read byte by byte from the pipe, so that ``communicate`` gets the rest); fails when the
    process exits or ``timeout`` passes first. A script that must not race a service's start
    waits for it (``privstream devices`` prints ``READY`` once it reads its requests)."""
    assert process.stderr is not None
    fd, seen, line = process.stderr.fileno(), b"", b""
    deadline = time.monotonic() + timeout
    while not (line.endswith(b"\n") and line.startswith(prefix.encode())):
        if line.endswith(b"\n"):
            seen, line = seen + line, b""
        left = deadline - time.monotonic()
        assert left > 0, f"no line {prefix!r} within {timeout} s: {(seen + line)[-2000:]!r}"
        if select.select([fd], [], [], left)[0]:
            byte = os.read(fd, 1)
            assert byte, f"exited before printing {prefix!r}: {(seen + line)[-2000:]!r}"
            line += byte
    return (seen + line).decode(errors="replace")


def last_released(keys: Iterable[str], last: int, slots: int) -> int:
    """The last slot of release keys ``<stream>/<mechanism>/<slot>[/...]`` of a ``--slots
    last`` run over a topic of ``slots`` slots: ``last``, or ``slots`` when the next slot's
    marker came in the same poll as ``last``'s (a 20,000-message poll can hold the whole topic)
    and closed it before the run stopped."""
    done = max(int(key.split("/")[2]) for key in keys)
    assert done in (last, slots), done
    return done


def read_json(
    settings: KafkaSettings, topic: str, count: int, timeout: float = 60
) -> list[dict[str, Any]]:
    """The first ``count`` messages of ``topic`` as JSON objects (waits for them)."""
    messages = wait_for_messages(settings, topic, lambda got: len(got) >= count, timeout)
    return [json.loads(m.value()) for m in messages]


FIRST_FETCH = 4.0


def read_all(settings: KafkaSettings, topic: str, settle: float = 1.0) -> list[Any]:
    """Every message of ``topic`` (reads until nothing new arrives for ``settle`` s; before the
    first message, for at least ``FIRST_FETCH`` s: a loaded broker's first fetch can take longer
    than ``settle``, and an empty read would pass for an empty topic)."""
    last = [0, time.monotonic()]

    def quiet(got: list[Any]) -> bool:
        if len(got) != last[0]:
            last[:] = [len(got), time.monotonic()]
        wait = settle if got else max(settle, FIRST_FETCH)
        return time.monotonic() - last[1] > wait

    return wait_for_messages(settings, topic, quiet, timeout=120)


def same_incarnation(store: Path, into: Path) -> Path:
    """``into``: a new store of ``store``'s incarnation (its nonce and manifest, no floors), so a
    run from it draws the same noise: how a test compares a disturbed run with an undisturbed
    one (runs of different stores draw independent noise, ``privstream.runtime.incarnation``)."""
    from privstream.runtime.incarnation import FILE

    data = json.loads((store / FILE).read_text())
    data["published"] = {}
    into.mkdir(parents=True, exist_ok=True)
    (into / FILE).write_text(json.dumps(data))
    return into
