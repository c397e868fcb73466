"""Issue 18 §4 (first bullet): a registration table changed on resume.

Reproduced (as it was, before incarnations): a user removed from the table of a resumed store
was still counted — the restored state kept their seat and value, and their later events were
accepted. With the operator ignoring the new table (``Population.withdraw`` a no-op), two
resumes that differ only in the withdrawn user's later values publish different releases at
every slot after the resume (20 of 20), each differing by exactly the user's one-hot change
(same incarnation, same noise). Incarnations then refused every table change.

Fixed (``incarnation.registration_plan``, ``operators.registration``): a removed user is
withdrawn from the first slot after the restored state's last released slot — their carried
value is blanked, their events are ``withdrawn_user`` dead letters, their seat and class stay
(ledgers and public counts unchanged). The releases after the resume no longer depend on the
user (byte-identical between the two resumes); the releases before it are unchanged. The
store records the withdrawal (keyed digest), and the user cannot come back under that id;
a stricter, looser or added requirement is refused by kind and count, never by id.
"""

from __future__ import annotations

import json
import secrets
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
import numpy as np
import pytest
from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSink, TestingSource, run_main

from privstream.cli.commands import main
from privstream.connectors.jsonl import to_json
from privstream.families.registry import LDP_IDS
from privstream.mechanisms.seeding import NoiseKey
from privstream.mechanisms.tasks import FrequencyTask
from privstream.operators.family import family_mechanisms
from privstream.operators.registration import Population, Preferences
from privstream.runtime.incarnation import read
from privstream.schema.events import EventBatch

USERS, FIRST, LATER, D = 40, 20, 20, 4
VICTIM = "u7"


@pytest.fixture(autouse=True)
def _no_ambient_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIVSTREAM_SECRET", raising=False)


def _lines(slots: range, values: np.ndarray, victim: int | None = None) -> str:
    """One event per user and slot; the victim's value replaced by ``victim`` when given."""
    out = []
    for t in slots:
        for u in range(USERS):
            value = victim if victim is not None and f"u{u}" == VICTIM else values[t - 1, u]
            out.append(json.dumps({"stream": "s", "user": f"u{u}", "slot": t, "value": int(value)}))
    return "\n".join(out) + "\n"


def _table(path: Path, skip: str | None = None, change: tuple[float, int] | None = None) -> Path:
    rows = []
    for u in range(USERS):
        if f"u{u}" == skip:
            continue
        eps, win = change if change is not None and f"u{u}" == VICTIM else (1.0, 10)
        rows.append(f"u{u},{eps},{win}\n")
    path.write_text("user,epsilon,window\n" + "".join(rows))
    return path


class Setup:
    """A first run over slots 1..FIRST into a store; resumes of it over slots FIRST+1.. ."""

    def __init__(self, tmp: Path, last: int | None = None, like: Setup | None = None) -> None:
        """``last``: the victim's value at slot FIRST; ``like``: a setup whose key and
        incarnation (nonce) this one shares, so both draw the same noise."""
        tmp.mkdir(exist_ok=True)
        self.tmp = tmp
        self.values = np.random.default_rng(18).integers(0, D, size=(FIRST + LATER, USERS))
        if last is not None:
            self.values[FIRST - 1, int(VICTIM[1:])] = last
        self.events, self.store = tmp / "events.jsonl", tmp / "store"
        self.out, self.dead = tmp / "out.jsonl", tmp / "dead.jsonl"
        self.key = tmp / "noise.key"
        self.key.write_text(secrets.token_hex(32) if like is None else like.key.read_text())
        if like is not None:
            self.store.mkdir()
            shutil.copy(like.tmp / "saved-store" / "privstream-incarnation.json", self.store)
        self.full = _table(tmp / "full.csv")
        self.events.write_text(_lines(range(1, FIRST + 1), self.values))
        assert self.run(self.full) == 0
        self.first = self.out.read_text()
        for path in (self.store, self.out, self.dead):  # the state right after the first run
            copy = tmp / f"saved-{path.name}"
            (shutil.copytree if path.is_dir() else shutil.copy)(path, copy)

    def run(self, table: Path) -> int:
        argv = ["run", "personalized", "--mechanism", "Uniform", "--dataset",
                f"file:{self.events}", "--stream", "s", "--domain", str(D), "--users",
                str(USERS), "--epsilon", "1", "--window", "10", "--preferences", str(table),
                "--out", str(self.out), "--dead-letter-out", str(self.dead), "--recovery-dir",
                str(self.store), "--secret-file", str(self.key), "--no-progress"]  # fmt: skip
        return main(argv)

    def resume(self, table: Path, victim: int) -> tuple[list[dict[str, Any]], list[str], str]:
        """Resume the saved store over the later slots, the victim sending ``victim`` at each:
        the releases, the dead letters' reasons and the releases' text."""
        shutil.rmtree(self.store)
        shutil.copytree(self.tmp / "saved-store", self.store)
        for path in (self.out, self.dead):
            shutil.copy(self.tmp / f"saved-{path.name}", path)
        first = _lines(range(1, FIRST + 1), self.values)
        later = _lines(range(FIRST + 1, FIRST + LATER + 1), self.values, victim)
        self.events.write_text(first + later)
        assert self.run(table) == 0
        text = self.out.read_text()
        letters = [json.loads(line) for line in self.dead.read_text().splitlines()]
        return (
            [json.loads(line) for line in text.splitlines()],
            [d["reason"] for d in letters],
            text,
        )


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


def _later(releases: list[dict[str, Any]]) -> dict[int, list[float]]:
    return {r["slot"]: r["estimate"] for r in releases if r["slot"] > FIRST}


def test_an_ignored_withdrawal_kept_counting_the_user(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack as it was: the restored state kept counting the removed user, so the
    difference of two resumes is exactly the user's change of value at every later slot."""
    monkeypatch.setattr(Population, "withdraw", lambda self, state, step_id: None)
    without = _table(setup.tmp / "without.csv", skip=VICTIM)
    a, _, _ = setup.resume(without, victim=0)
    b, _, _ = setup.resume(without, victim=3)
    la, lb = _later(a), _later(b)
    assert sorted(la) == sorted(lb) == list(range(FIRST + 1, FIRST + LATER + 1))
    exact = sum(np.array_equal(np.subtract(la[t], lb[t]), np.eye(D)[0] - np.eye(D)[3]) for t in la)
    assert exact == LATER  # 20 of 20 later slots: the user's whole later history


def test_a_withdrawn_user_stops_counting_from_the_resume(setup: Setup) -> None:
    """After the fix: releases after the resume are byte-identical whatever the withdrawn
    user sends, their events are ``withdrawn_user`` dead letters, the releases before the
    resume are unchanged, and the store records the withdrawal (a digest, never the id)."""
    without = _table(setup.tmp / "without.csv", skip=VICTIM)
    a, reasons_a, text_a = setup.resume(without, victim=0)
    _b, reasons_b, text_b = setup.resume(without, victim=3)
    assert text_a == text_b  # byte-identical: nothing after the resume depends on the user
    assert text_a.startswith(setup.first)  # the releases before the resume are unchanged
    assert sorted(_later(a)) == list(range(FIRST + 1, FIRST + LATER + 1))
    assert reasons_a.count("withdrawn_user") == reasons_b.count("withdrawn_user") == LATER
    stored = read(setup.store)
    assert stored is not None and len(stored.manifest.withdrawn) == 1
    assert len(stored.manifest.registration) == USERS - 1
    assert VICTIM not in (setup.store / "privstream-incarnation.json").read_text()


def test_the_carried_value_is_blanked_at_the_resume(tmp_path: Path) -> None:
    """Two stores with the same incarnation whose victim's last value before the resume
    differs (0 or 3 at slot FIRST), then differs again after it: the carried value would feed
    the next w − 1 slots (the user's later events are dead letters), so the later releases are
    byte-identical only because it is blanked; the slots before differ only at FIRST."""
    a = Setup(tmp_path / "a", last=0)
    b = Setup(tmp_path / "b", last=3, like=a)
    ra, _, _ = a.resume(_table(a.tmp / "without.csv", skip=VICTIM), victim=0)
    rb, _, _ = b.resume(_table(b.tmp / "without.csv", skip=VICTIM), victim=3)
    assert [r for r in ra if r["slot"] > FIRST] == [r for r in rb if r["slot"] > FIRST]
    differ = [x["slot"] for x, y in zip(ra, rb, strict=True) if x != y]
    assert differ == [FIRST]


def test_a_kept_user_still_changes_the_releases(setup: Setup) -> None:
    """Control: the same two resumes with the user still in the table differ (the test above
    would see a difference if one were there)."""
    a, reasons, _ = setup.resume(setup.full, victim=0)
    b, _, _ = setup.resume(setup.full, victim=3)
    assert _later(a) != _later(b) and "withdrawn_user" not in reasons


def test_a_withdrawal_survives_later_resumes_and_the_user_cannot_come_back(
    setup: Setup, capsys: Any
) -> None:
    without = _table(setup.tmp / "without.csv", skip=VICTIM)
    setup.resume(without, victim=0)
    assert setup.run(without) == 0  # a further resume keeps the withdrawal
    stored = read(setup.store)
    assert stored is not None and len(stored.manifest.withdrawn) == 1
    capsys.readouterr()
    assert setup.run(setup.full) == 2
    err = capsys.readouterr().err
    assert "registration table: back after withdrawal, 1 user(s)" in err and VICTIM not in err


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        ((0.5, 10), "stricter requirement"),
        ((1.0, 12), "stricter requirement"),
        ((2.0, 10), "looser requirement"),
        ((0.5, 5), "looser requirement"),
    ],
)
def test_a_changed_requirement_is_refused_by_kind_and_count(
    setup: Setup, capsys: Any, change: tuple[float, int], kind: str
) -> None:
    capsys.readouterr()
    assert setup.run(_table(setup.tmp / "changed.csv", change=change)) == 2
    err = capsys.readouterr().err
    assert f"registration table: {kind}, 1 user(s)" in err and VICTIM not in err


def test_an_added_user_is_refused_by_kind_and_count(setup: Setup, capsys: Any) -> None:
    table = _table(setup.tmp / "added.csv")
    table.write_text(table.read_text() + "newcomer,1.0,10\n")
    capsys.readouterr()
    assert setup.run(table) == 2
    err = capsys.readouterr().err
    assert "registration table: added, 1 user(s)" in err and "newcomer" not in err


# -- a closed LDP population (operator level, Bytewax recovery) --------------------------------

N_LDP, T_LDP = 200, 20
LDP_KEY = NoiseKey.from_text(secrets.token_hex(32))
LDP_USERS = [f"user-{i:04d}" for i in range(N_LDP)]
LDP_VICTIM = LDP_USERS[7]


def _ldp_items(abort: Any, victim: float) -> list[Any]:
    """Every user reports at every slot; from the second half on the victim reports
    ``victim``; the first run stops half way (``abort``, fired once)."""
    rng = np.random.default_rng(27)
    out: list[Any] = []
    ids = np.array(LDP_USERS, dtype=object)
    for t in range(1, T_LDP + 1):
        values = (rng.random(N_LDP) < 0.3).astype(float)
        if t > T_LDP // 2:
            values[7] = victim
        out.append(EventBatch("s", np.full(N_LDP, t), ids, values, None, t))
    out.insert(T_LDP // 2, abort)
    return out


def _ldp_run(store: Path, source: list[Any], users: list[str]) -> tuple[list[str], list[str]]:
    flow = Dataflow("withdraw")
    keyed = op.key_on("k", op.input("in", flow, TestingSource(source)), lambda b: b.stream)
    config = LDP_IDS.make_config(epsilon=4.0, window=4, population=N_LDP, task=FrequencyTask(2))
    out = family_mechanisms(
        "l", keyed, family=LDP_IDS, mechanism="LBU", config=config, secret=LDP_KEY,
        registration=Preferences(by_user={u: (4.0, 4) for u in users}),
    )  # fmt: skip
    releases: list[str] = []
    letters: list[Any] = []
    op.output("out", op.map("json", out.releases, to_json), TestingSink(releases))
    op.output("dead", out.dead_letters, TestingSink(letters))
    run_main(flow, epoch_interval=timedelta(0), recovery_config=RecoveryConfig(str(store)))
    return releases, [d.reason for d in letters]


def _ldp_resumes(tmp_path: Path, users: list[str]) -> list[tuple[list[str], list[str]]]:
    """One first run into a store, then two resumes of copies of it with ``users`` as the
    table, differing only in the victim's later values (0 or 1)."""
    (tmp_path / "a").mkdir()
    init_db_dir(tmp_path / "a", 1)
    abort = TestingSource.ABORT()
    first, _ = _ldp_run(tmp_path / "a", _ldp_items(abort, 0.0), LDP_USERS)
    assert len(first) == T_LDP // 2
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    return [
        _ldp_run(tmp_path / store, _ldp_items(abort, victim), users)
        for store, victim in (("a", 0.0), ("b", 1.0))
    ]


def test_a_withdrawn_member_of_a_closed_ldp_population_stops_counting(tmp_path: Path) -> None:
    """LDP stream with a registration table: after the resume without the victim the later
    releases are byte-identical whatever the victim sends, each of the victim's later events
    is a ``withdrawn_user`` dead letter (their seat stays: the population's count does not
    change)."""
    without = [u for u in LDP_USERS if u != LDP_VICTIM]
    (a, reasons_a), (b, reasons_b) = _ldp_resumes(tmp_path, without)
    assert len(a) == T_LDP - T_LDP // 2 and a == b
    assert reasons_a == reasons_b == ["withdrawn_user"] * (T_LDP - T_LDP // 2)


def test_a_kept_member_of_a_closed_ldp_population_still_counts(tmp_path: Path) -> None:
    """Control: with the victim kept, the same two resumes differ."""
    (a, reasons), (b, _) = _ldp_resumes(tmp_path, LDP_USERS)
    assert len(a) == len(b) == T_LDP - T_LDP // 2 and a != b and not reasons


# -- config check --recovery-dir ----------------------------------------------------------------


def _flow(tmp_path: Path, rows: dict[str, tuple[float, int]]) -> Path:
    """A flow file with one personalized stream over the registration table ``rows``."""
    table = "".join(f"{u},{e},{w}\n" for u, (e, w) in rows.items())
    (tmp_path / "registrations.csv").write_text("user,epsilon,window\n" + table)
    flow = tmp_path / "flow.toml"
    flow.write_text(
        '[kafka]\nbootstrap = "localhost:9092"\ninput_topic = "in"\noutput_topic = "out"\n'
        "[population]\nusers = 50\nepsilon = 2.0\nwindow = 6\n"
        'registrations = "registrations.csv"\n'
        '[[streams]]\nname = "visits"\nfamily = "personalized"\nmechanisms = "PBD"\n'
        "domain = 2\nshare = 1.0\n"
    )
    return flow


def test_config_check_reports_what_a_resume_would_do(tmp_path: Path, capsys: Any) -> None:
    """Withdrawals and refused changes by kind and count, never a user id; exit 2 when a
    resume would be refused; without --recovery-dir as before."""
    from privstream.cli.run_config import flow_manifest
    from privstream.flows.config import load
    from privstream.runtime.incarnation import begin

    key = tmp_path / "noise.key"
    key.write_text(secrets.token_hex(32))
    rows = {f"zq-{i}": (1.0, 12) for i in range(10)}
    flow = _flow(tmp_path, rows)
    secret = NoiseKey.from_text(key.read_text())
    begin(secret, tmp_path / "store", flow_manifest(load(flow), secret))  # the store's manifest
    check = ["config", "check", str(flow), "--recovery-dir", str(tmp_path / "store"),
             "--secret-file", str(key)]  # fmt: skip
    del rows["zq-3"], rows["zq-4"]  # two withdrawals
    _flow(tmp_path, rows)
    capsys.readouterr()
    assert main(check) == 0
    out = capsys.readouterr().out
    assert "withdrawals 2" in out and "stricter requirements 0" in out and "accepted" in out
    rows["zq-5"], rows["zq-6"], rows["stranger"] = (0.5, 12), (2.0, 12), (1.0, 12)
    _flow(tmp_path, rows)
    assert main(check) == 2
    out = capsys.readouterr().out
    assert "withdrawals 2" in out and "stricter requirements 1" in out
    assert "added (1), stricter requirement (1), looser requirement (1)" in out
    assert "zq-" not in out and "stranger" not in out  # never a user id
    assert main(["config", "check", str(flow)]) == 0
    assert "resume of" not in capsys.readouterr().out


class _Seats(Population):
    """Just enough of the population part to call ``withdraw``: a table, a population, a slotting."""

    def __init__(self, members: frozenset[str], released: tuple[tuple[str, int], ...]) -> None:
        from types import SimpleNamespace

        from privstream.operators.slotting import SlottingConfig

        self.n = 3
        self.trust = SimpleNamespace(members=members)  # type: ignore[assignment]
        self.cfg = SlottingConfig(released=released)


def test_a_withdrawal_after_a_crash_starts_after_the_published_slots() -> None:
    """After a crash the slots since the last snapshot are replayed. Had the withdrawal started
    right after the snapshot, those already published slots would be recomputed without the
    user under the same noise: old − new = the user's values. On Kafka the run reads the
    release topic's last slot when it withdraws (``Incarnation.released``) and the withdrawal
    starts after it, so the replay recomputes the published slots as they were."""
    from privstream.operators.stream_state import StreamState

    def withdrawn_from(released: tuple[tuple[str, int], ...]) -> int:
        state = StreamState(stream="s", mechanisms={}, current=np.zeros(3))
        state.directory, state.last_closed = {"a": 0, "b": 1, VICTIM: 2}, 10  # snapshot at 10
        _Seats(frozenset({"a", "b"}), released).withdraw(state, "step")
        assert state.withdrawn_from is not None
        return int(state.withdrawn_from[2])

    assert withdrawn_from(()) == 11  # a clean stop: the snapshot is the last release
    assert withdrawn_from((("s", 15),)) == 16  # slots 11..15 were published before the crash
    assert withdrawn_from((("other", 30),)) == 11


def test_a_resume_that_withdraws_reads_the_release_topic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slots published before a crash come from the release topic, read only when the
    resume withdraws someone new (``incarnation.start``)."""
    import privstream.runtime.republish as republish
    from privstream.connectors.kafka import KafkaSettings
    from privstream.runtime.incarnation import Manifest, registration_digests, start

    key = NoiseKey.from_text(secrets.token_hex(32))
    table = {"a": (1.0, 10), "b": (1.0, 10), VICTIM: (1.0, 10)}
    reads: list[str] = []

    def last_published(_settings: Any, topic: str) -> dict[str, int]:
        reads.append(topic)
        return {"s": 15}

    monkeypatch.setattr(republish, "last_published", last_published)
    releases = (KafkaSettings(("127.0.0.1:1",)), "releases")

    def manifest(users: dict[str, tuple[float, int]]) -> Manifest:
        return Manifest(1.0, 10, {"s": 1.0}, registration=registration_digests(users, key))

    start(key, tmp_path / "store", manifest(table))  # the store, made by a first run
    (tmp_path / "store" / "part-0.sqlite3").write_bytes(b"")  # ... with a snapshot in it
    monkeypatch.setattr(
        "privstream.runtime.incarnation.check_store", lambda _p: type("C", (), {"empty": False})()
    )
    kept = start(key, tmp_path / "store", manifest(table), releases=releases)
    assert not kept.withdrawing and kept.released == {} and reads == []
    withdrawn = {u: r for u, r in table.items() if u != VICTIM}
    resumed = start(key, tmp_path / "store", manifest(withdrawn), releases=releases)
    assert resumed.withdrawing and resumed.released == {"s": 15} and reads == ["releases"]
    again = start(key, tmp_path / "store", manifest(withdrawn), releases=releases)
    assert not again.withdrawing  # recorded: later resumes keep its first slot
