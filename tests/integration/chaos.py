"""The chaos suite: a multi-mechanism Kafka flow with recovery, killed, starved and flooded, then
audited against an undisturbed run (reliability issue: "the chaos suite").

One round of ``run_chaos``:

1. a Tansu broker behind a ``FaultProxy`` (every client talks to it through the proxy);
2. events of the synthetic Sin stream, with hostile messages in the middle of the topic: a
   2,000,000-byte and a 999,900-byte event, a far-future end-of-slot marker, events far behind
   the stream, a 10,000-character stream name, malformed JSON, an empty message; the first
   fifth is written up front, the rest slot by slot while the disturbed run goes on;
3. the disturbed run, with ``--recovery-dir`` and ``--metrics-port`` scraped continuously by
   four threads: SIGKILLed at random moments — right at start, while the recovery store is
   built, mid-run — and restarted each time, with broker freezes and cuts between kills, until
   it has been killed ``kills`` times; then it runs to completion;
4. an undisturbed reference run of the same flow, same secret, into its own topics;
5. a replay of the same input with other poll sizes (``PRIVSTREAM_POLL_MAX``: 333 messages a
   poll instead of 5,000), compared with the reference byte for byte (issue 27 item 1);
6. a stream rename on the disturbed run's recovery store (``--stream`` another name): it must
   be refused loudly, and nothing is released under the new name (issue 27 item 3: a renamed
   stream would start a fresh budget for the same users);
7. ``privstream audit`` over the disturbed run's topics, and a release-by-release comparison
   with the reference run;
8. the cluster round (``cluster_round``, issue 27 items 6, 9 and 10): a flow file of three
   streams (two LDP-IDS, one personalized) over a 4-partition topic, run as a cluster of 2
   processes (``[run] processes``) on the markers clock, disturbed ``cluster_kills`` times in
   turn by a member SIGKILLed during start-up (the launcher must stop the cluster and name the
   member), a second launcher on the running cluster's store (refused by the store lock) and
   then the launcher SIGKILLed (its members must die with it), and a member frozen by SIGSTOP
   (named, exit 4 after ``--stall-limit``); each is followed by a restart of the whole cluster,
   two new slots written before each. A last restart runs to the end; the releases are audited
   (``privstream audit --config FLOW``) and compared byte for byte with an undisturbed single
   process of the same flow file sharing the store's incarnation.

The report counts kills, restarts, lost slots, conflicting duplicates, releases that differ
from the reference and windows over budget, and for the cluster round its disturbances,
restarts, launchers that missed a disturbance, members that outlived their launcher, second
writers, lost slots, duplicates and differing releases: all but the kills and restarts must be
zero. ``python -m tests.integration.chaos --kills 60 --users 5000 --slots 200 --cluster-kills 9``
is ``make chaos``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from privstream.connectors.broker import free_port
from privstream.connectors.kafka import (
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    TopicSpec,
    create_topics,
    wait_for_messages,
)
from privstream.connectors.producer import slot_messages
from privstream.connectors.synthetic import SyntheticStream
from privstream.mechanisms.seeding import NoiseKey

from .conftest import PRIVSTREAM, THREE_STREAMS, cli_env, read_all, same_incarnation
from .proxy import ProxiedBroker

MECHANISMS = "LBU,LPA"
HOSTILE_AT = 0.4  # share of the slots after which the hostile messages are written


@dataclass
class Plan:
    """What one chaos round does."""

    kills: int = 20
    users: int = 2000
    slots: int = 60
    seed: int = 7
    scrapers: int = 4
    outages: int = 3
    log: Callable[[str], None] = field(default=lambda _msg: None)
    run_seconds: float = 3.0
    """A mid-run kill comes 0.5–1 times this after the start (the start-up takes ~1.5 s)."""
    cluster_kills: int = 3
    """Disturbances of the cluster round: start-up kill, launcher kill, hung member, in turn."""


@dataclass
class Report:
    kills: int = 0
    restarts: int = 0
    early_kills: int = 0
    store_kills: int = 0
    outages: int = 0
    scrapes: int = 0
    releases: int = 0
    lost_slots: int = 0
    conflicting_duplicates: int = 0
    differing_releases: int = 0
    windows_over_budget: int = 0
    population_over_budget: int = 0
    audit_ok: bool = False
    poll_replay_differing: int = 0
    rename_refused: bool = False
    cluster_startup_kills: int = 0
    cluster_launcher_kills: int = 0
    cluster_hung_members: int = 0
    cluster_restarts: int = 0
    cluster_unnoticed: int = 0
    """A member killed in start-up or frozen that its launcher did not stop and name."""
    cluster_orphans: int = 0
    """Members alive 10 s after their launcher exited (or was SIGKILLed)."""
    cluster_second_writers: int = 0
    """A second launcher on a running cluster's store that was not refused."""
    cluster_releases: int = 0
    cluster_lost_slots: int = 0
    cluster_conflicting_duplicates: int = 0
    cluster_differing_releases: int = 0
    cluster_audit_ok: bool = False
    cluster_seconds: float = 0.0
    seconds: float = 0.0

    def failures(self) -> dict[str, int]:
        """The counts that must be zero (and the audit that must pass)."""
        bad = {
            "lost_slots": self.lost_slots,
            "conflicting_duplicates": self.conflicting_duplicates,
            "differing_releases": self.differing_releases,
            "windows_over_budget": self.windows_over_budget,
            "population_over_budget": self.population_over_budget,
            "audit_failed": int(not self.audit_ok),
            "poll_replay_differing": self.poll_replay_differing,
            "rename_not_refused": int(not self.rename_refused),
            "cluster_unnoticed": self.cluster_unnoticed,
            "cluster_orphans": self.cluster_orphans,
            "cluster_second_writers": self.cluster_second_writers,
            "cluster_lost_slots": self.cluster_lost_slots,
            "cluster_conflicting_duplicates": self.cluster_conflicting_duplicates,
            "cluster_differing_releases": self.cluster_differing_releases,
        }
        if self.cluster_startup_kills + self.cluster_launcher_kills + self.cluster_hung_members:
            bad["cluster_audit_failed"] = int(not self.cluster_audit_ok)
        return {k: v for k, v in bad.items() if v}


def hostile_messages(slot: int) -> list[bytes]:
    """Every kind of poison the audit tried, for a stream at ``slot``."""
    head = b'{"stream": "sin", "user": "u1", "slot": %d, "value": 1, "pad": "' % slot
    padded = [head + b"x" * (size - len(head) - 2) + b'"}' for size in (2_000_000, 999_900)]
    return [
        *padded,
        b'{"stream": "sin", "end_of_slot": 1000000000}',
        *(b'{"stream": "sin", "user": "u%d", "slot": 0, "value": 1}' % u for u in range(5)),
        json.dumps({"stream": "s" * 10_000, "user": "u1", "slot": slot, "value": 1}).encode(),
        b'{"stream": "sin", "user": ',
        b"",
    ]


def produce_events(
    bootstrap: str, topic: str, plan: Plan, slots: range, clock_key: bytes, pace: float = 0.0
) -> None:
    """Slots ``slots`` of the Sin stream with their markers (tagged with ``clock_key``),
    ``pace`` seconds apart, and the hostile messages after the slot at ``HOSTILE_AT`` of the
    stream."""
    stream = SyntheticStream("sin", plan.users, plan.slots, seed=plan.seed)
    producer = Producer(
        KafkaSettings((bootstrap,)).client_config(
            **{"message.max.bytes": 3_000_000, "linger.ms": 20, "allow.auto.create.topics": False}
        )
    )
    hostile_after = max(2, int(plan.slots * HOSTILE_AT))
    for slot in slots:
        for message in slot_messages(stream, "sin", slot, clock_key):
            _produce(producer, topic, message)
        if slot == hostile_after:
            for message in hostile_messages(slot):
                _produce(producer, topic, message)
        producer.flush(60)
        time.sleep(pace)
    if producer.flush(60):
        raise RuntimeError("the chaos events were not all delivered")


def _produce(producer: Producer, topic: str, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value, b"sin")
            return
        except BufferError:
            producer.poll(0.05)


class Topics:
    """One run's topics: releases, ledger, dead letters."""

    def __init__(self, bootstrap: str, tag: str) -> None:
        self.releases, self.ledger, self.dlq = (f"{k}-{tag}" for k in ("rel", "led", "dlq"))
        create_topics(
            KafkaSettings((bootstrap,)),
            [
                TopicSpec(self.releases, config=RELEASE_TOPIC_CONFIG),
                TopicSpec(self.ledger, config=RELEASE_TOPIC_CONFIG),
                TopicSpec(self.dlq),
            ],
        )


class Scrapers:
    """Threads scraping ``/metrics`` without pause while the flow runs (and between runs)."""

    def __init__(self, port: int, count: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.done = threading.Event()
        self.scrapes = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def __enter__(self) -> Scrapers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.done.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=1) as answer:
                    answer.read()
                with self._lock:
                    self.scrapes += 1
            except (OSError, http.client.HTTPException):
                time.sleep(0.01)  # between runs nobody listens, or the answer was cut


def flow_command(
    bootstrap: str, events: str, topics: Topics, plan: Plan, extra: list[str]
) -> list[str]:
    return [
        *PRIVSTREAM, "run", "ldp-ids", "--mechanism", MECHANISMS, "--budget-split", "equal",
        "--dataset", "sin", "--users", str(plan.users), "--slots", str(plan.slots),
        "--epsilon", "1", "--window", "10", "--bootstrap", bootstrap, "--input-topic", events,
        "--output-topic", topics.releases, "--ledger-topic", topics.ledger,
        "--dead-letter-topic", topics.dlq, "--no-progress", *extra,
    ]  # fmt: skip


def run_to_end(command: list[str], env: dict[str, str], timeout: float = 300) -> float:
    """Run the flow to completion; its wall time (it calibrates the mid-run kills)."""
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the flow failed ({done.returncode}): {done.stderr[-3000:]}")
    return time.monotonic() - started


def kill_after(
    proc: subprocess.Popen[bytes], store: Path, how: str, rng: random.Random, length: float
) -> None:
    """SIGKILL ``proc``: ``early`` right after start, ``store`` while the recovery store is
    being built, ``mid`` at a random moment of a run that takes ``length`` seconds."""
    if how == "early":
        time.sleep(rng.uniform(0.0, 0.05))
    elif how == "store":
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            if store.exists() and any(store.glob(".privstream-staging-*")):
                break  # the store is being built right now
            time.sleep(0.0005)
    else:
        time.sleep(rng.uniform(0.5, 1.0) * length)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def disturbed_run(
    broker: ProxiedBroker,
    command: list[str],
    store: Path,
    plan: Plan,
    report: Report,
    producer: threading.Thread,
) -> None:
    """Kill and restart until ``plan.kills`` kills happened, with outages in between; then,
    once every event is written, run to completion (a run an outage failed is restarted)."""
    rng = random.Random(plan.seed)
    env = cli_env()
    kinds = ["early", *["mid"] * 4]
    outages_left = plan.outages
    while report.kills < plan.kills:
        fresh = not any(store.glob("*.sqlite3"))  # the store is still to be built
        how = "store" if fresh and report.store_kills < 3 else rng.choice(kinds)
        log = store.parent / f"run-{report.restarts}.log"
        with log.open("wb") as stderr:
            proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        report.restarts += 1
        if outages_left and how == "mid":
            outage(broker, rng, report)
            outages_left -= 1
        kill_after(proc, store, how, rng, plan.run_seconds)
        report.kills += proc.returncode == -signal.SIGKILL
        report.early_kills += how == "early"
        report.store_kills += how == "store"
        plan.log(f"  kill {report.kills}/{plan.kills} ({how}), exit {proc.returncode}")
        if proc.returncode not in (0, -signal.SIGKILL):
            plan.log(log.read_text(errors="replace")[-1500:])
    producer.join()
    for _attempt in range(5):
        report.restarts += 1
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode == 0:
            return
        plan.log(f"  final run exited {done.returncode}; restarting: {done.stderr[-500:]}")
    raise RuntimeError("the disturbed run never completed")


def outage(broker: ProxiedBroker, rng: random.Random, report: Report) -> None:
    assert broker.proxy is not None
    time.sleep(rng.uniform(0.3, 1.5))
    (broker.proxy.freeze if rng.random() < 0.5 else broker.proxy.cut)()
    time.sleep(rng.uniform(0.5, 2.0))
    broker.proxy.resume()
    report.outages += 1


def audit(bootstrap: str, topics: Topics, out: Path, expect: list[str]) -> dict[str, Any]:
    """``privstream audit`` of ``topics`` with the expectations ``expect`` (``--max-epsilon``
    and ``--population``, or ``--config FLOW``): its JSON report."""
    done = subprocess.run(
        [*PRIVSTREAM, "audit", "--bootstrap", bootstrap, "--release-topic", topics.releases,
         "--ledger-topic", topics.ledger, "--json", str(out), *expect],
        capture_output=True, text=True, timeout=300, env=cli_env(),
    )  # fmt: skip
    if done.returncode not in (0, 1):
        raise RuntimeError(f"privstream audit failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def compare(bootstrap: str, reference: Topics, disturbed: Topics) -> tuple[int, int, int]:
    """(releases, conflicting duplicates, releases differing from the reference)."""
    settings = KafkaSettings((bootstrap,))
    expected = {m.key(): m.value() for m in read_all(settings, reference.releases)}
    seen: dict[bytes, bytes] = {}
    conflicts = 0
    for message in read_all(settings, disturbed.releases):
        first = seen.setdefault(message.key(), message.value())
        conflicts += first != message.value()
    differing = sum(seen.get(k) != v for k, v in expected.items())
    return len(seen), conflicts, differing


POLL_REPLAY = "333"
"""Messages per poll of the replay (the flow's default is 5,000; 333 cuts every slot)."""


def poll_size_replay(
    bootstrap: str, events: str, plan: Plan, key: list[str], reference: Topics, tag: str
) -> int:
    """Replay the input with ``POLL_REPLAY`` messages a poll: releases differing from the
    reference run (or missing, or conflicting) — the same input must give the same bytes."""
    replay = Topics(bootstrap, f"polls-{tag}")
    env = cli_env(PRIVSTREAM_POLL_MAX=POLL_REPLAY)
    run_to_end(flow_command(bootstrap, events, replay, plan, key), env)
    released, conflicts, differing = compare(bootstrap, reference, replay)
    expected = len(read_all(KafkaSettings((bootstrap,)), reference.releases))
    return differing + conflicts + abs(expected - released)


def rename_refused(bootstrap: str, command: list[str], disturbed: Topics) -> bool:
    """Resume the disturbed run's store with the stream renamed: refused loudly (an error
    naming the stream), and nothing released under the new name."""
    renamed = "sin-renamed"
    try:
        done = subprocess.run([*command, "--stream", renamed], capture_output=True, text=True,
                              timeout=60, env=cli_env())  # fmt: skip
    except subprocess.TimeoutExpired:  # accepted: it waits for events of the new name
        return False
    releases = read_all(KafkaSettings((bootstrap,)), disturbed.releases)
    fresh = [m for m in releases if m.key().decode().startswith(f"{renamed}/")]
    return done.returncode != 0 and "sin" in done.stderr and not fresh


# --- The cluster round (issue 27 items 6, 9, 10) -------------------------------------------

CLUSTER_STREAMS = (("country", "sin"), ("device", "log"), ("visits", "sin"))
CLUSTER_DISTURBANCES = ("start-up", "launcher", "hung")
CLUSTER_PROCESSES = 2
CLUSTER_PARTITIONS = 4
CLUSTER_STALL_LIMIT = 10.0
"""``--stall-limit`` of a launcher whose member is frozen (seconds)."""
SLOTS_PER_DISTURBANCE = 2
"""New slots written before each disturbance, so that each one lands on a cluster at work."""
EXIT_STALLED = 4  # privstream.runtime.cluster.EXIT_STALLED
EXIT_REFUSED = 2  # privstream.runtime.cluster.EXIT_REFUSED


@dataclass
class ClusterFlow:
    """The cluster round's flow: a flow file of three streams over a 4-partition topic, run as
    a cluster of ``CLUSTER_PROCESSES`` on one recovery store."""

    bootstrap: str
    events: str
    config: Path
    store: Path
    secret: Path
    users: int
    slots: int

    def command(self, *flags: str) -> list[str]:
        return [*PRIVSTREAM, "run", "--config", str(self.config), "--secret-file",
                str(self.secret), "--recovery-dir", str(self.store), "--snapshot-interval",
                "0.5", *flags]  # fmt: skip


def cluster_flow_file(
    directory: Path, bootstrap: str, events: str, topics: Topics, users: int, name: str
) -> Path:
    """A flow file over ``events`` writing to ``topics``: two LDP-IDS streams and a personalized
    one over one population (a registration table), ``[run] processes`` a cluster; its Kafka
    clock is the default markers clock (the producer signs its markers with the flow's key)."""
    table = directory / "registrations.csv"
    table.write_text("user,epsilon,window\n" + "".join(
        f"u{u},{2.0 if u % 3 else 1.0},5\n" for u in range(users)))  # fmt: skip
    path = directory / f"flow-{name}.toml"
    path.write_text(
        f"""
[kafka]
bootstrap = "{bootstrap}"
input_topic = "{events}"
output_topic = "{topics.releases}"
ledger_topic = "{topics.ledger}"
dead_letter_topic = "{topics.dlq}"

[run]
processes = {CLUSTER_PROCESSES}

[population]
users = {users}
epsilon = 2.0
window = 5
registrations = "{table}"

"""
        + THREE_STREAMS
    )
    return path


def produce_cluster_slots(flow: ClusterFlow, first: int, last: int, seed: int) -> None:
    """Slots ``first … last`` of every stream, spread over all partitions, each slot's marker
    (signed with the flow's clock key) on every partition."""
    from privstream.connectors.datasets import synthetic_dataset
    from privstream.connectors.producer import produce_synthetic

    clock_key = NoiseKey.from_text(flow.secret.read_text()).clock_key()
    for stream, dataset in CLUSTER_STREAMS:
        data = synthetic_dataset(dataset, flow.users, last, seed)
        produce_synthetic(KafkaSettings((flow.bootstrap,)), flow.events, data, name=stream,
                          first_slot=first, spread=True, clock_key=clock_key)  # fmt: skip


def members(launcher: int) -> dict[int, int]:
    """The launcher's members: process id (``--process-id``) → pid."""
    found: dict[int, int] = {}
    for task in Path(f"/proc/{launcher}/task").iterdir():
        for pid in (int(c) for c in (task / "children").read_text().split()):
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\x00")
            if b"--process-id" in args:
                found[int(args[args.index(b"--process-id") + 1])] = pid
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet is dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def wait_for_members(launcher: subprocess.Popen[bytes], timeout: float = 60) -> dict[int, int]:
    """The launcher's members once all ``CLUSTER_PROCESSES`` run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and launcher.poll() is None:
        with contextlib.suppress(OSError, ValueError):
            found = members(launcher.pid)
            if len(found) == CLUSTER_PROCESSES:
                return found
        time.sleep(0.02)
    raise RuntimeError(f"the launcher never started its members (exit {launcher.poll()})")


def wait_for_progress(flow: ClusterFlow, topics: Topics, slot: int, log: Path) -> None:
    """Until every stream released ``slot`` (the cluster works, past its start-up)."""
    wanted = {f"{s}/{m}/{slot}".encode() for s, m in
              (("country", "LBU"), ("device", "LBA"), ("visits", "PBD"))}  # fmt: skip
    try:
        wait_for_messages(KafkaSettings((flow.bootstrap,)), topics.releases,
                          lambda got: wanted <= {m.key() for m in got}, 240)  # fmt: skip
    except TimeoutError:
        raise RuntimeError(f"the cluster never released slot {slot}: "
                           f"{log.read_text(errors='replace')[-3000:]}") from None  # fmt: skip


def reap(proc: subprocess.Popen[bytes], pids: dict[int, int], timeout: float) -> tuple[int, int]:
    """Wait ``timeout`` s for the launcher ``proc`` to exit by itself: (its exit status, or -1
    when it hung and was killed; members that outlived it by 10 s, killed then)."""
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = -1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids.values()):
        time.sleep(0.05)
    survivors = [p for p in pids.values() if alive(p)]
    for pid in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return code, len(survivors)


def start_cluster(flow: ClusterFlow, log: Path, *flags: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as stderr:
        return subprocess.Popen(flow.command(*flags), stdout=subprocess.DEVNULL, stderr=stderr,
                                env=cli_env(), cwd=flow.config.parent)  # fmt: skip


def startup_kill(
    launcher: subprocess.Popen[bytes], pids: dict[int, int], rng: random.Random, log: Path
) -> tuple[bool, int]:
    """SIGKILL a member 0–1.5 s after the members started (they take seconds to start): the
    launcher must stop the cluster and exit non-zero naming it (it used to wait for ever).
    (noticed, members outliving the launcher)."""
    member = rng.randrange(CLUSTER_PROCESSES)
    time.sleep(rng.uniform(0.0, 1.5))
    os.kill(pids[member], signal.SIGKILL)
    code, orphans = reap(launcher, pids, 120)
    named = f"cluster member {member} failed first" in log.read_text(errors="replace")
    return code not in (0, -1) and named, orphans


def launcher_kill(
    flow: ClusterFlow, launcher: subprocess.Popen[bytes], pids: dict[int, int], log: Path
) -> tuple[bool, int]:
    """While the cluster works: a second launcher on the same store must be refused (the store
    lock); then SIGKILL the launcher: its members must die with it (``PR_SET_PDEATHSIG``).
    (the second writer refused, members outliving either launcher)."""
    refused, orphans = second_writer(flow, log.with_suffix(".second.log"))
    launcher.send_signal(signal.SIGKILL)
    _code, more = reap(launcher, pids, 30)
    return refused, orphans + more


def second_writer(flow: ClusterFlow, log: Path, timeout: float = 180) -> tuple[bool, int]:
    """Start a second cluster on the store of a running one: whether it was refused (exit 2,
    "is in use by"); one still running after ``timeout`` s is stopped, its members with it.
    (refused, members outliving it)."""
    second = start_cluster(flow, log)
    pids: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while second.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            pids.update(members(second.pid))
        time.sleep(0.1)
    code, orphans = reap(second, pids, 0.1)
    return code == EXIT_REFUSED and "is in use by" in log.read_text(errors="replace"), orphans


def hung_member(
    launcher: subprocess.Popen[bytes], pids: dict[int, int], rng: random.Random, log: Path
) -> tuple[bool, int]:
    """SIGSTOP a member while the cluster works: the launcher must name it and exit
    ``EXIT_STALLED`` after ``CLUSTER_STALL_LIMIT`` s (it used to wait silently for ever).
    (noticed, members outliving the launcher)."""
    member = rng.randrange(CLUSTER_PROCESSES)
    os.kill(pids[member], signal.SIGSTOP)
    code, orphans = reap(launcher, pids, CLUSTER_STALL_LIMIT + 120)
    named = f"cluster member {member} made no progress" in log.read_text(errors="replace")
    return code == EXIT_STALLED and named, orphans


def disturb(
    flow: ClusterFlow, topics: Topics, kind: str, slot: int, rng: random.Random, log: Path,
    report: Report,
) -> None:  # fmt: skip
    """(Re)start the cluster and disturb it once (``kind`` of ``CLUSTER_DISTURBANCES``); the
    launcher and every member are gone afterwards. ``slot``: the last slot written so far."""
    flags = ("--stall-limit", str(CLUSTER_STALL_LIMIT)) if kind == "hung" else ()
    launcher = start_cluster(flow, log, *flags)
    try:
        pids = wait_for_members(launcher)
        if kind == "start-up":
            noticed, orphans = startup_kill(launcher, pids, rng, log)
            report.cluster_startup_kills += 1
        else:
            wait_for_progress(flow, topics, slot, log)
            if kind == "launcher":
                noticed, orphans = launcher_kill(flow, launcher, pids, log)
                report.cluster_launcher_kills += 1
            else:
                noticed, orphans = hung_member(launcher, pids, rng, log)
                report.cluster_hung_members += 1
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    if kind == "launcher":  # "noticed" is the second launcher's refusal
        report.cluster_second_writers += not noticed
    else:
        report.cluster_unnoticed += not noticed
    report.cluster_orphans += orphans


def finish_cluster(flow: ClusterFlow, plan: Plan, report: Report) -> None:
    """Restart the whole cluster once more and run it to ``flow.slots`` (a run that fails is
    restarted, up to 3 times)."""
    for _attempt in range(3):
        report.cluster_restarts += 1
        done = subprocess.run(flow.command("--slots", str(flow.slots)), capture_output=True,
                              text=True, timeout=600, env=cli_env(), cwd=flow.config.parent)  # fmt: skip
        if done.returncode == 0:
            return
        plan.log(f"  final cluster run exited {done.returncode}: {done.stderr[-1500:]}")
    raise RuntimeError("the restarted cluster never completed")


def cluster_round(bootstrap: str, plan: Plan, workdir: Path, report: Report) -> None:
    """``plan.cluster_kills`` disturbances of a 2-process cluster (a member SIGKILLed during
    start-up, the launcher SIGKILLed, a member frozen, in turn), each followed by a restart of
    the whole cluster, then a last restart to the end; audited, and compared byte for byte with
    an undisturbed single process of the same flow file and incarnation (none when
    ``plan.cluster_kills`` is 0)."""
    if plan.cluster_kills <= 0:
        return
    started = time.monotonic()
    tag = uuid.uuid4().hex[:6]
    directory = workdir / f"cluster-{tag}"
    directory.mkdir(parents=True)
    events = f"cevents-{tag}"
    create_topics(KafkaSettings((bootstrap,)), [TopicSpec(events, partitions=CLUSTER_PARTITIONS)])
    secret = directory / "noise.key"
    secret.write_text(secrets.token_hex(32) + "\n")
    disturbed = Topics(bootstrap, f"cluster-{tag}")
    slots = SLOTS_PER_DISTURBANCE * (plan.cluster_kills + 1)
    config = cluster_flow_file(directory, bootstrap, events, disturbed, plan.users, "disturbed")
    flow = ClusterFlow(bootstrap, events, config, directory / "store", secret, plan.users, slots)
    rng = random.Random(plan.seed)
    for n in range(plan.cluster_kills):
        kind = CLUSTER_DISTURBANCES[n % len(CLUSTER_DISTURBANCES)]
        last = SLOTS_PER_DISTURBANCE * (n + 1)
        produce_cluster_slots(flow, last - SLOTS_PER_DISTURBANCE + 1, last, plan.seed)
        report.cluster_restarts += n > 0
        disturb(flow, disturbed, kind, last, rng, directory / f"launcher-{n}.log", report)
        plan.log(f"  cluster disturbance {n + 1}/{plan.cluster_kills} ({kind}) done")
    produce_cluster_slots(flow, slots - SLOTS_PER_DISTURBANCE + 1, slots, plan.seed)
    finish_cluster(flow, plan, report)
    reference = Topics(bootstrap, f"cref-{tag}")
    ref_config = cluster_flow_file(directory, bootstrap, events, reference, plan.users, "ref")
    ref_store = same_incarnation(flow.store, directory / "ref-store")  # the same noise
    run_to_end([*PRIVSTREAM, "run", "--config", str(ref_config), "--secret-file", str(secret),
                "--recovery-dir", str(ref_store), "--processes", "1", "--slots", str(slots)],
               cli_env(), timeout=600)  # fmt: skip
    result = audit(bootstrap, disturbed, directory / "audit.json",
                   ["--config", str(config), "--expect-slots", str(slots)])  # fmt: skip
    report.cluster_audit_ok = bool(result["ok"])
    report.cluster_lost_slots = int(result["counts"]["missing_slots"])
    released, conflicts, differing = compare(bootstrap, reference, disturbed)
    expected = len({m.key() for m in read_all(KafkaSettings((bootstrap,)), reference.releases)})
    report.cluster_releases = released
    report.cluster_conflicting_duplicates = max(
        conflicts, int(result["counts"]["conflicting_duplicates"])
    )
    report.cluster_differing_releases = differing + max(released - expected, 0)
    report.cluster_seconds = time.monotonic() - started


def run_chaos(plan: Plan, workdir: Path) -> Report:
    """One chaos round (see the module docstring); the report of what happened."""
    started = time.monotonic()
    report = Report()
    secret = workdir / "noise.key"
    secret.write_text(secrets.token_hex(32) + "\n")
    with ProxiedBroker(workdir / "tansu.log") as broker:
        tag = uuid.uuid4().hex[:6]
        events = f"events-{tag}"
        create_topics(KafkaSettings((broker.bootstrap,)), [TopicSpec(events)])
        head = max(2, plan.slots // 5)
        clock_key = NoiseKey.from_text(secret.read_text()).clock_key()
        produce_events(broker.bootstrap, events, plan, range(1, head + 1), clock_key)
        # The rest arrives while the disturbed run is killed and restarted, so that kills land
        # while it works rather than after it finished.
        pace = 2.5 * plan.kills / (plan.slots - head)  # a kill every ~2.5 s
        rest = threading.Thread(
            target=produce_events,
            args=(broker.bootstrap, events, plan, range(head + 1, plan.slots + 1), clock_key, pace),
        )
        rest.start()
        key = ["--secret-file", str(secret)]
        disturbed = Topics(broker.bootstrap, f"chaos-{tag}")
        store, port = workdir / f"store-{tag}", free_port()
        extra = [*key, "--recovery-dir", str(store), "--snapshot-interval", "0.2",
                 "--metrics-port", str(port)]  # fmt: skip
        command = flow_command(broker.bootstrap, events, disturbed, plan, extra)
        with Scrapers(port, plan.scrapers) as scrapers:
            disturbed_run(broker, command, store, plan, report, rest)
        report.scrapes = scrapers.scrapes
        reference = Topics(broker.bootstrap, f"ref-{tag}")
        # the undisturbed runs share the disturbed store's incarnation (its nonce): runs of
        # different stores draw independent noise by design (privstream.runtime.incarnation)
        ref_key = [*key, "--recovery-dir", str(same_incarnation(store, workdir / f"ref-{tag}"))]
        run_to_end(flow_command(broker.bootstrap, events, reference, plan, ref_key), cli_env())
        plan.log("reference run (undisturbed, same secret and incarnation) done")
        polls_key = [*key, "--recovery-dir", str(same_incarnation(store, workdir / f"polls-{tag}"))]
        report.poll_replay_differing = poll_size_replay(
            broker.bootstrap, events, plan, polls_key, reference, tag
        )
        plan.log(f"poll-size replay: {report.poll_replay_differing} releases differ")
        report.rename_refused = rename_refused(broker.bootstrap, command, disturbed)
        plan.log(f"stream rename on the store refused: {report.rename_refused}")
        expect = ["--population", str(plan.users), "--expect-slots", str(plan.slots),
                  "--max-epsilon", "1"]  # fmt: skip
        result = audit(broker.bootstrap, disturbed, workdir / "audit.json", expect)
        counts = result["counts"]
        report.audit_ok = bool(result["ok"])
        report.lost_slots = int(counts["missing_slots"])
        report.windows_over_budget = int(counts["windows_over_budget"])
        report.population_over_budget = int(counts["population_over_budget"])
        released, conflicts, differing = compare(broker.bootstrap, reference, disturbed)
        report.releases = released
        report.conflicting_duplicates = max(conflicts, int(counts["conflicting_duplicates"]))
        report.differing_releases = differing
        cluster_round(broker.bootstrap, plan, workdir, report)
        plan.log(f"cluster round: {report.cluster_seconds:.0f} s")
    report.seconds = time.monotonic() - started
    return report


def main(argv: list[str] | None = None) -> int:
    """``make chaos``: a long round; prints the report and exits 1 if anything was lost."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=60)
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--slots", type=int, default=200)
    parser.add_argument("--outages", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cluster-kills", type=int, default=9,
                        help="disturbances of the cluster round (start-up kill, launcher kill, "
                        "hung member, in turn; 0: no cluster round)")  # fmt: skip
    parser.add_argument("--workdir", type=Path, default=Path("chaos-out"))
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    plan = Plan(args.kills, args.users, args.slots, args.seed, outages=args.outages,
                cluster_kills=args.cluster_kills,
                log=lambda msg: print(msg, file=sys.stderr, flush=True))  # fmt: skip
    report = run_chaos(plan, args.workdir)
    print(json.dumps(vars(report), indent=2))
    failures = report.failures()
    if failures:
        print(f"chaos: FAILED {failures}", file=sys.stderr)
        return 1
    print("chaos: 0 lost slots, 0 conflicting duplicates, 0 windows over budget", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
