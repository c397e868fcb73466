"""The shuffle model over the embedded broker (issue 25): devices → report topic → ``privstream
shuffler`` (its own process, store and clock key) → shuffled topic → ``privstream run sao2
--trust ldp-shuffled`` (its own process, reading only the shuffled topic) → releases.

* End to end the releases are those of the simulated devices' law: each coordinate within 4.5
  stated standard errors of the truth (one run: 24 cells), every slot published, and the
  audit passes the lifetime ledger.
* The shuffled topic holds no device id anywhere (values, keys, headers) and one manifest per
  block whose ``n`` is the number of reports the fleet wrote for it.
* Under ``--policy drop`` with ``n_min`` above every level's size nothing is forwarded but the
  manifests, and the server releases nothing new.
* A shuffler killed with SIGKILL at random moments and restarted from its store neither loses
  nor duplicates a report: every block has one manifest (re-forwarded copies are byte-identical
  under the same key) whose ``n`` is the number of reports written for it.
* A server given the report topic is refused.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from privstream.connectors.kafka import KafkaSettings, TopicSpec, create_topics
from privstream.flows.secret import resolve_clock_key
from privstream.schema.shuffle import Batch, Sao2Task

from .conftest import PRIVSTREAM, Topics, cli_env, read_all
from .shuffle_fleet import device, slot_reports, write_horizon

N, D, T, PARTITIONS = 3000, 3, 8, 2
STREAM = "cells"


class ShuffleTopics:
    def __init__(self, kafka: KafkaSettings) -> None:
        self.out = Topics(kafka)
        tag = self.out.events.removeprefix("events-")
        self.reports, self.tasks, self.shuffled = (
            f"reports-{tag}",
            f"tasks-{tag}",
            f"shuffled-{tag}",
        )
        create_topics(kafka, [TopicSpec(self.reports, PARTITIONS), TopicSpec(self.tasks),
                              TopicSpec(self.shuffled)])  # fmt: skip


def values() -> np.ndarray:
    """``(T, N)`` cells: a start cell (0.5/0.3/0.2) and one move at slot 5 for a third."""
    rng = np.random.default_rng(2)
    first = rng.choice(D, N, p=[0.5, 0.3, 0.2])
    moved = np.where(np.arange(N) % 3 == 0, (first + 1) % D, first)
    return np.stack([first if t < 5 else moved for t in range(1, T + 1)])


def server(
    kafka: KafkaSettings, t: ShuffleTopics, secret: Path, *extra: str
) -> subprocess.Popen[str]:
    argv = ["run", "sao2", "--trust", "ldp-shuffled", "--stream", STREAM, "--binary", str(D),
            "--users", str(N), "--epsilon", "2", "--horizons", "2", "--window", str(T),
            "--max-changes", "3", "--slots", str(T), "--secret-file", str(secret),
            "--no-progress", "--bootstrap", kafka.bootstrap, "--shuffled-topic", t.shuffled,
            "--request-topic", t.tasks, "--output-topic", t.out.releases, "--ledger-topic",
            t.out.ledger, "--dead-letter-topic", t.out.dlq, *extra]  # fmt: skip
    return subprocess.Popen([*PRIVSTREAM, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env())  # fmt: skip


def shuffler(kafka: KafkaSettings, t: ShuffleTopics, key_file: Path, store: Path,
             *extra: str) -> subprocess.Popen[str]:  # fmt: skip
    argv = ["shuffler", "--bootstrap", kafka.bootstrap, "--report-topic", t.reports,
            "--task-topic", t.tasks, "--shuffled-topic", t.shuffled, "--store", str(store),
            "--clock-key-file", str(key_file), "--idle-seconds", "6", *extra]  # fmt: skip
    return subprocess.Popen([*PRIVSTREAM, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env())  # fmt: skip


def clock_key(secret: Path, tmp: Path) -> tuple[bytes, Path]:
    key = resolve_clock_key(secret_file=secret)
    assert key is not None
    path = tmp / "clock.key"
    path.write_text(key.hex() + "\n")
    return key, path


def first_task(kafka: KafkaSettings, topic: str, timeout: float = 60) -> Sao2Task:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = read_all(kafka, topic, settle=0.5)
        if found:
            return Sao2Task.from_obj(json.loads(found[0].value()))
        time.sleep(0.5)
    raise AssertionError("the server published no task")


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> str:
    _out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return err


def batches(kafka: KafkaSettings, topic: str) -> list[Any]:
    return read_all(kafka, topic, settle=0.5)


def test_devices_shuffler_server_end_to_end(
    kafka: KafkaSettings, tmp_path: Path, secret_file: Path
) -> None:
    t = ShuffleTopics(kafka)
    key, key_file = clock_key(secret_file, tmp_path)
    srv = server(kafka, t, secret_file)
    task = first_task(kafka, t.tasks)
    shf = shuffler(kafka, t, key_file, tmp_path / "store", "--n-min", "100")
    written = write_horizon(kafka, t.reports, PARTITIONS, key, task, values(), seed=3)
    finish(shf)
    finish(srv)

    messages = batches(kafka, t.shuffled)
    assert len(messages) == sum(task.lengths)  # one manifest per block of every level
    sent = Counter((r.level, r.block) for _slot, rs in slot_reports(task, values(), 3) for r in rs)
    seen = {}
    for m in messages:
        text = m.value().decode() + (m.key() or b"").decode() + repr(m.headers())
        assert "dev-" not in text and m.headers() is None
        b = Batch.from_obj(json.loads(m.value()))
        seen[(b.level, b.block)] = b
        assert b.policy == "forward" and b.n == sent[(b.level, b.block)]
    assert sum(b.n for b in seen.values()) == written

    releases = sorted((json.loads(m.value()) for m in read_all(kafka, t.out.releases)),
                      key=lambda r: r["slot"])  # fmt: skip
    assert [r["slot"] for r in releases] == list(range(1, T + 1))
    assert all(r["strategy"] == "publish" for r in releases)
    truth = np.stack([np.bincount(v, minlength=D) / N for v in values()])
    for r, x in zip(releases, truth, strict=True):
        z = (np.asarray(r["estimate"]) - x) / r["details"]["stderr"]
        assert np.abs(z).max() < 4.5, (r["slot"], z)
    done = subprocess.run(
        [*PRIVSTREAM, "audit", "--bootstrap", kafka.bootstrap, "--release-topic", t.out.releases,
         "--ledger-topic", t.out.ledger, "--idle-seconds", "1", "--max-epsilon", "2"],
        capture_output=True, text=True, timeout=120, env=cli_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert device(0) not in done.stdout


def test_below_n_min_nothing_but_the_manifests_is_forwarded(
    kafka: KafkaSettings, tmp_path: Path, secret_file: Path
) -> None:
    t = ShuffleTopics(kafka)
    key, key_file = clock_key(secret_file, tmp_path)
    srv = server(kafka, t, secret_file)
    task = first_task(kafka, t.tasks)
    shf = shuffler(kafka, t, key_file, tmp_path / "store", "--n-min", str(N), "--policy", "drop")
    write_horizon(kafka, t.reports, PARTITIONS, key, task, values(), seed=3)
    finish(shf)
    finish(srv)
    found = [Batch.from_obj(json.loads(m.value())) for m in batches(kafka, t.shuffled)]
    assert len(found) == sum(task.lengths)
    assert all(b.policy == "drop" and b.plus is None and 0 < b.n < N for b in found)
    releases = [json.loads(m.value()) for m in read_all(kafka, t.out.releases)]
    assert len(releases) == T and {r["strategy"] for r in releases} == {"approximate"}


def test_a_server_given_the_report_topic_is_refused(kafka: KafkaSettings, tmp_path: Path,
                                                    secret_file: Path) -> None:  # fmt: skip
    t = ShuffleTopics(kafka)
    proc = server(kafka, t, secret_file, "--report-topic", t.reports)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "--report-topic would let it see who sent what" in err, err[-2000:]


def test_a_shuffler_killed_at_random_moments_loses_and_duplicates_nothing(
    kafka: KafkaSettings, tmp_path: Path, secret_file: Path
) -> None:
    from privstream.families.registry import family
    from privstream.flows.shuffled import publish_tasks
    from privstream.mechanisms.sao2_task import BinaryTask
    from privstream.operators.sao2_shuffled import tasks_for

    t = ShuffleTopics(kafka)
    key, key_file = clock_key(secret_file, tmp_path)
    fam = family("sao2")
    mech = fam.build("SaO2", fam.make_config(epsilon=1.0, window=T, population=N,
                                             task=BinaryTask(D), s=3))  # fmt: skip
    (task,) = tasks_for(mech, STREAM, 11, 1)
    publish_tasks(kafka, t.tasks, [task])
    writer = threading.Thread(target=write_horizon, args=(kafka, t.reports, PARTITIONS, key, task,
                                                          values(), 3, 0.4))  # fmt: skip
    store, rng, kills = tmp_path / "store", random.Random(8), 0
    proc = shuffler(kafka, t, key_file, store, "--n-min", "1")
    writer.start()
    while writer.is_alive() or kills < 4:
        time.sleep(rng.uniform(0.3, 1.6))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)  # reaps it and closes its pipes
        kills += 1
        proc = shuffler(kafka, t, key_file, store, "--n-min", "1")
    writer.join()
    finish(proc)

    sent = Counter((r.level, r.block) for _slot, rs in slot_reports(task, values(), 3) for r in rs)
    copies: dict[str, set[bytes]] = {}
    for m in batches(kafka, t.shuffled):
        copies.setdefault(m.key().decode(), set()).add(m.value())
    assert len(copies) == sum(task.lengths), sorted(copies)
    for key_, versions in copies.items():
        assert len(versions) == 1, key_  # a re-forwarded batch is the same record
        b = Batch.from_obj(json.loads(next(iter(versions))))
        assert b.n == sent[(b.level, b.block)], key_
    assert kills >= 4


def test_the_command_line_parties_on_the_wall_clock(kafka: KafkaSettings, tmp_path: Path,
                                                    secret_file: Path) -> None:  # fmt: skip
    """As docs/shuffler.md runs them by hand: the server, ``privstream shuffler``, ``privstream
    clock`` (markers on every partition at origin + t·S) and ``privstream devices --sao2-tasks``
    (reports half a slot before each marker): every slot is published from forwarded batches."""
    t = ShuffleTopics(kafka)
    _key, key_file = clock_key(secret_file, tmp_path)
    slots, seconds, users = 4, 3.0, 2500  # half a slot (1.5 s) for the reports to beat the marker
    srv = server(kafka, t, secret_file, "--window", str(slots), "--slots", str(slots), "--users",
                 str(users), "--horizons", "1", "--epsilon", "1")  # fmt: skip
    first_task(kafka, t.tasks)
    shf = shuffler(kafka, t, key_file, tmp_path / "store", "--n-min", "100")
    origin = time.time() + 4
    common = [
        "--bootstrap",
        kafka.bootstrap,
        "--slot-seconds",
        str(seconds),
        "--origin",
        str(origin),
    ]
    clock = subprocess.Popen([*PRIVSTREAM, "clock", "--topic", t.reports, "--stream", STREAM,
                              "--first-slot", "1", "--through", str(slots), "--clock-key-file",
                              str(key_file), *common], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=cli_env())  # fmt: skip
    devices = subprocess.Popen([*PRIVSTREAM, "devices", "--sao2-tasks", t.tasks, "--report-topic",
                                t.reports, "--dataset", "trajectory", "--users", str(users),
                                "--slots", str(slots), *common], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=cli_env())  # fmt: skip
    assert "horizon 0: 2500 enrolled" in finish(devices)
    finish(clock)
    finish(srv)
    finish(shf)
    releases = [json.loads(m.value()) for m in read_all(kafka, t.out.releases)]
    assert sorted(r["slot"] for r in releases) == list(range(1, slots + 1))
    assert {r["strategy"] for r in releases} == {"publish"}
    found = [Batch.from_obj(json.loads(m.value())) for m in batches(kafka, t.shuffled)]
    assert sum(b.n for b in found if b.block == 1) == users  # every device, once, at its level
