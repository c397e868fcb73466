"""The command line is a contract: flags and output fields exactly as documented."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from privstream.cli.commands import main

RELEASE_FIELDS = {
    "schema", "release_id", "stream", "mechanism", "slot", "strategy", "estimate", "source_slot",
    "guarantee", "details", "insecure_seed", "evaluation",
}  # fmt: skip
LDP_IDS_DETAILS = {
    "family", "epsilon_m1", "epsilon_m2", "users_m1", "users_m2", "dissimilarity", "error", "bits",
}  # fmt: skip


def read(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def secret_file(tmp_path: Path) -> Path:
    """A fresh 256-bit secret noise key, as the README says to make one."""
    path = tmp_path / "noise.key"
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(autouse=True)
def _no_ambient_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIVSTREAM_SECRET", raising=False)


def test_run_ldp_ids_writes_one_release_per_slot(tmp_path: Path) -> None:
    out = tmp_path / "releases.jsonl"
    argv = ["run", "ldp-ids", "--mechanism", "LPA", "--dataset", "sin", "--users", "5000", "--slots", "60",
            "--epsilon", "1", "--window", "20", "--seed", "1", "--out", str(out), "--no-progress"]  # fmt: skip
    reproducible = [*argv, "--insecure-seed", "7"]
    assert main(reproducible) == 0
    releases = read(out)
    assert [r["slot"] for r in releases] == list(range(1, 61))
    for r in releases:
        assert r.keys() == RELEASE_FIELDS and r["schema"] == 3
        assert r["strategy"] in ("publish", "approximate", "nullified")
        assert r["guarantee"] == {
            "measure": "pure", "epsilon": 1.0, "scope": "window", "window": 20, "model": "ldp"
        }  # fmt: skip
        assert len(r["estimate"]) == 2  # type: ignore[arg-type]
        details: Any = r["details"]
        assert details.keys() == LDP_IDS_DETAILS and details["family"] == "ldp-ids"
        assert details["epsilon_m1"] == 1.0  # LPA's M1 users report with the full ε
        assert details["users_m1"] == 5000 // 2 // 20
        assert r["insecure_seed"] is True and r["evaluation"] is False  # a public noise seed
    assert main(reproducible) == 0 and read(out) == releases, "same seed, same releases"

    # a run keyed by a secret is private output: unmarked, and not the public seed's noise
    assert main([*argv, "--secret-file", str(secret_file(tmp_path))]) == 0
    private = read(out)
    assert [r["slot"] for r in private] == list(range(1, 61))
    assert not any(r["insecure_seed"] for r in private)
    assert [r["estimate"] for r in private] != [r["estimate"] for r in releases]


@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_run_on_a_users_own_file(tmp_path: Path, suffix: str) -> None:
    records = [(f"user{u}", t, (u * t) % 3) for t in range(1, 11) for u in range(200)]
    src = tmp_path / f"events.{suffix}"
    if suffix == "csv":
        src.write_text("user,slot,value\n" + "".join(f"{u},{t},{v}\n" for u, t, v in records))
    else:
        src.write_text(
            "".join(json.dumps({"user": u, "slot": t, "value": v}) + "\n" for u, t, v in records)
        )
    out, dead = tmp_path / "r.jsonl", tmp_path / "dead.jsonl"
    argv = ["run", "ldp-ids", "--mechanism", "LBU,LPU", "--dataset", f"file:{src}", "--users", "200",
            "--domain", "3", "--window", "5", "--out", str(out), "--dead-letter-out", str(dead), "--no-progress",
            "--secret-file", str(secret_file(tmp_path)), "--budget-split", "equal"]  # fmt: skip
    assert main(argv) == 0
    releases = read(out)
    assert sorted((r["mechanism"], r["slot"]) for r in releases) == sorted(
        (m, t) for m in ("LBU", "LPU") for t in range(1, 11)
    )
    assert all(r["stream"] == "file" and len(r["estimate"]) == 3 for r in releases)  # type: ignore[arg-type]
    guarantees: list[Any] = [r["guarantee"] for r in releases]
    assert {g["epsilon"] for g in guarantees} == {0.5}  # two mechanisms share ε = 1 equally
    assert dead.read_text() == ""


def test_an_ldp_run_with_a_registration_table_counts_only_its_users(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 18 §4 (sybils): ``--registrations`` closes an LDP population; ids sorting first
    that are not in the table are ``unregistered_user``, never ``population_full``; an entry
    the stream's ε per window cannot honour is refused by number."""
    records = [
        (f"{p}{u}", t, 1) for t in range(1, 6) for p in ("0sybil", "user") for u in range(50)
    ]
    src = tmp_path / "events.csv"
    src.write_text("user,slot,value\n" + "".join(f"{u},{t},{v}\n" for u, t, v in records))
    table = tmp_path / "registrations.csv"
    table.write_text("user,epsilon,window\n" + "".join(f"user{u},1.0,5\n" for u in range(50)))
    out, dead = tmp_path / "r.jsonl", tmp_path / "dead.jsonl"
    argv = ["run", "ldp-ids", "--mechanism", "LBU", "--dataset", f"file:{src}", "--users", "50",
            "--window", "5", "--out", str(out), "--dead-letter-out", str(dead), "--no-progress",
            "--secret-file", str(secret_file(tmp_path)), "--registrations", str(table)]  # fmt: skip
    assert main(argv) == 0
    letters = read(dead)
    assert len(letters) == 250 and {d["reason"] for d in letters} == {"unregistered_user"}
    assert all(d["payload"].startswith("0sybil") for d in letters)
    table.write_text("user,epsilon,window\nuser1,1.0,10\n")
    assert main(argv) == 2
    assert "registration entry 1 asks (ε_i, w_i) = (1, 10)" in capsys.readouterr().err


def test_bad_arguments_are_rejected_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["run", "ldp-ids", "--epsilon", "-1"])
    assert "positive" in capsys.readouterr().err
    assert main(["run", "ldp-ids", "--mechanism", "XYZ", "--no-progress"]) == 2
    assert "unknown ldp-ids mechanism" in capsys.readouterr().err
    key = ["--secret-file", str(secret_file(tmp_path))]
    assert (
        main(["run", "ldp-ids", "--dataset", "file:/nonexistent.csv", "--no-progress", *key]) == 2
    )
    assert "does not exist" in capsys.readouterr().err
    # no secret noise key, a guessable one, or both a secret and a public seed: refused
    out = str(tmp_path / "r.jsonl")
    assert main(["run", "ldp-ids", "--slots", "3", "--out", out, "--no-progress"]) == 2
    assert "without a secret noise key" in capsys.readouterr().err
    weak = tmp_path / "weak.key"
    weak.write_text("password123\n")
    assert main(["run", "ldp-ids", "--out", out, "--no-progress", "--secret-file", str(weak)]) == 2
    err = capsys.readouterr().err
    assert "is a placeholder" in err and "password123" not in err
    assert (
        main(["run", "ldp-ids", "--out", out, "--no-progress", *key, "--insecure-seed", "1"]) == 2
    )
    assert "not both" in capsys.readouterr().err
    # several mechanisms compose: they must split the budget or be an evaluation
    several = ["run", "ldp-ids", "--mechanism", "LBU,LPA", "--out", out, "--no-progress", *key]
    assert main(several) == 2
    assert "--budget-split" in capsys.readouterr().err
    assert main([*several, "--budget-split", "1,2,3"]) == 2
    assert "2 positive finite weights" in capsys.readouterr().err
    assert main([*several, "--budget-split", "equal", "--compare"]) == 2
    assert "drop --budget-split" in capsys.readouterr().err
    assert not Path(out).exists() or Path(out).read_text() == ""


def test_an_insecure_seed_never_silently_replaces_the_environments_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18 §4: with ``$PRIVSTREAM_SECRET`` set, ``--insecure-seed`` used to win silently
    (exit 0, every release public noise); it is refused like ``--secret-file`` with a seed."""
    key = secrets.token_hex(32)
    monkeypatch.setenv("PRIVSTREAM_SECRET", key)
    out = tmp_path / "r.jsonl"
    argv = ["run", "ldp-ids", "--users", "200", "--slots", "3", "--out", str(out), "--no-progress"]
    assert main([*argv, "--insecure-seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "not both: $PRIVSTREAM_SECRET is given together with --insecure-seed" in err
    assert "unset $PRIVSTREAM_SECRET" in err and key not in err
    assert not out.exists()
    assert main(argv) == 0  # the secret alone: a private run
    assert not any(r["insecure_seed"] for r in read(out))


@pytest.mark.parametrize(
    "weak",
    ["REPLACE_ME_WITH_A_REAL_SECRET_KEY", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
     "qwertyuiopasdfghjklzxcvbnm1234567890QWERTY", "3141592653589793238462643383279502884197"],
)  # fmt: skip
def test_a_weak_secret_file_is_refused_with_how_to_make_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], weak: str
) -> None:
    path = tmp_path / "weak.key"
    path.write_text(weak + "\n")
    out = tmp_path / "r.jsonl"
    argv = ["run", "ldp-ids", "--slots", "3", "--out", str(out), "--no-progress"]
    assert main([*argv, "--secret-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"secret file {path} " in err and weak not in err
    assert "python -c 'import secrets; print(secrets.token_hex(32))'" in err
    assert not out.exists()


def test_compare_marks_every_output_as_an_evaluation(tmp_path: Path) -> None:
    out, ledger = tmp_path / "r.jsonl", tmp_path / "l.jsonl"
    argv = ["run", "ldp-ids", "--mechanism", "LBU,LPA", "--users", "2000", "--slots", "30",
            "--out", str(out), "--ledger-out", str(ledger), "--no-progress", "--compare",
            "--secret-file", str(secret_file(tmp_path))]  # fmt: skip
    assert main(argv) == 0
    releases, entries = read(out), read(ledger)
    assert len(releases) == len(entries) == 2 * 30
    assert all(r["evaluation"] is True for r in releases)
    guarantees: list[Any] = [r["guarantee"] for r in releases]
    assert all(g["epsilon"] == 1.0 for g in guarantees)  # the full ε each
    assert all(e["evaluation"] is True and not e["insecure_seed"] for e in entries)


def test_bench_ldp_ids_writes_the_documented_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    argv = ["bench", "ldp-ids", "--dataset", "sin", "--users", "4000", "--slots", "40", "--epsilon", "1",
            "--window", "20", "--mechanisms", "LBU,LPA", "--seeds", "2", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["params"]["seeds"] == 2 and result["params"]["users"] == 4000
    assert result["params"]["family"] == "ldp-ids"
    assert set(result["results"]) == {"LBU", "LPA"}
    for row in result["results"].values():
        assert set(row) == {"mre", "mae", "bits_per_user", "publications", "seconds"}
    assert result["results"]["LBU"]["bits_per_user"] == 1.0
    table = capsys.readouterr().out
    assert "LBU" in table and "LPA" in table


def test_bench_on_a_file_dataset(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    src.write_text("".join(f"u{u},{t},{(u + t) % 3}\n" for t in range(1, 21) for u in range(300)))
    out = tmp_path / "out.json"
    argv = ["bench", "ldp-ids", "--dataset", f"file:{src}", "--users", "300", "--window", "5",
            "--mechanisms", "LPU", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["params"]["slots"] == 20
    assert result["results"]["LPU"]["bits_per_user"] == pytest.approx((2 + 1) / 5)


def test_run_personalized_writes_releases_and_class_ledgers(tmp_path: Path) -> None:
    out, ledger = tmp_path / "r.jsonl", tmp_path / "l.jsonl"
    argv = ["run", "personalized", "--mechanism", "PBD,BA", "--dataset", "log", "--users", "2000",
            "--slots", "150", "--epsilon", "0.6", "--window", "40", "--out", str(out),
            "--ledger-out", str(ledger), "--no-progress", "--budget-split", "equal",
            "--secret-file", str(secret_file(tmp_path))]  # fmt: skip
    assert main(argv) == 0
    releases = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["mechanism"], r["slot"]) for r in releases) == sorted(
        (m, t) for m in ("PBD", "BA") for t in range(1, 151)
    )
    # central DP noise is exact discrete Laplace: the released counts are whole numbers
    assert all(float(x).is_integer() for r in releases for x in r["estimate"])  # type: ignore[attr-defined]
    entry = json.loads(ledger.read_text().splitlines()[-1])
    # spec §6.3: types draw ε_i from {0.6, ..., 1.0} and w_i from {40}, the grid values ≤ w;
    # each of the two mechanisms charges a class its half of ε_i
    assert {c["scope"] for c in entry["classes"]} == {40}
    assert all(c["budget"] >= 0.6 / 2 for c in entry["classes"])
    assert sum(c["users"] for c in entry["classes"]) == 2000
    # the population accountant: both mechanisms together stay within the full requirement
    assert entry["population_budget"] >= 0.6
    assert 0 < entry["population_spent"] <= entry["population_budget"] * (1 + 1e-9)
    assert not entry["insecure_seed"] and not entry["evaluation"]


def test_bench_personalized_writes_the_documented_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    argv = ["bench", "personalized", "--dataset", "tlns", "--users", "1000", "--slots", "400",
            "--mechanisms", "BD,PBD", "--seeds", "2", "--json", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["params"]["seeds"] == 2 and result["params"]["dataset"] == "tlns"
    assert result["params"]["family"] == "personalized"
    assert set(result["results"]) == {"BD", "PBD"}
    for row in result["results"].values():
        assert {"amre", "ln_amre", "ajsd", "publications", "seconds"} <= set(row)
        assert row["amre"] > 0 and 0 <= row["ajsd"] <= 1
    assert "PBD" in capsys.readouterr().out


def test_run_needs_a_family_or_a_flow_file_and_not_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from privstream.cli.commands import main

    assert main(["run"]) == 2
    assert "name a family" in capsys.readouterr().err
    flow = Path(__file__).resolve().parent.parent / "deploy" / "flow.toml"
    assert main(["run", "--config", str(flow), "ldp-ids"]) == 2
    assert "leave out the family name" in capsys.readouterr().err
    assert main(["run", "--config", str(flow), "--process-id", "0"]) == 2
    assert "needs both --process-id and --addresses" in capsys.readouterr().err
    assert main(["run", "--config", str(flow), "--process-id", "2", "--addresses", "a:1;b:2"]) == 2
    assert "is not an index of the 2 --addresses" in capsys.readouterr().err


def test_run_refuses_a_delta_of_at_least_one_over_n(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 18 §4: any δ < 1 was accepted. One stream over ``--users`` n users: δ ≥ 1/n is
    refused (exit 2, naming the override) before anything is written; ``--allow-large-delta``
    accepts it and the ledger entries carry the δ; δ < 1/n runs as before."""
    out, ledger = tmp_path / "r.jsonl", tmp_path / "l.jsonl"
    argv = ["run", "cgm", "--users", "200", "--slots", "3", "--out", str(out),
            "--ledger-out", str(ledger), "--no-progress", "--secret-file",
            str(secret_file(tmp_path))]  # fmt: skip
    assert main([*argv, "--delta", "0.005"]) == 2
    err = capsys.readouterr().err
    assert "δ = 0.005 is at least 1/n = 1/200" in err and "--allow-large-delta" in err
    assert not out.exists() or out.read_text() == ""
    assert main([*argv, "--delta", "0.005", "--allow-large-delta"]) == 0
    assert {e["details"]["delta"] for e in read(ledger)} == {0.005}
    assert main([*argv, "--delta", "1e-5", "--overwrite-output"]) == 0  # a new incarnation
    assert {e["details"]["delta"] for e in read(ledger)} == {1e-5}


def test_the_clock_catches_up_from_a_flow_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clock writer that was down must not jump (the flow refuses a jump past
    ``max_clock_jump``): it starts ``--catch-up`` slots back and marks one slot at a time.
    With ``--config`` the flow file names the topic, the streams and the brokers."""
    import privstream.connectors.producer as producer

    calls: list[dict[str, Any]] = []

    def fake_write_clock(settings: Any, topic: str, streams: Any, key: bytes, **kw: Any) -> int:
        calls.append(
            {"topic": topic, "streams": list(streams), "bootstrap": settings.bootstrap, **kw}
        )
        return int(kw["through"] or 0)

    monkeypatch.setattr(producer, "write_clock", fake_write_clock)
    monkeypatch.setattr("time.time", lambda: 1000.0 * 60 + 30)  # in slot 1001 of 60 s slots
    flow = Path(__file__).parent.parent / "deploy" / "flow.toml"
    key = secret_file(tmp_path)
    assert main(["clock", "--config", str(flow), "--secret-file", str(key), "--catch-up", "5",
                 "--through", "1010"]) == 0  # fmt: skip
    (call,) = calls
    assert call["first_slot"] == 1001 - 5 and call["wait"] is True
    assert call["topic"] == "events" and call["bootstrap"] == "kafka-bootstrap.kafka.svc:9092"
    assert call["streams"] == ["country", "device", "page", "session", "visits"]
    assert main(["clock", "--topic", "t", "--secret-file", str(key)]) == 2  # no stream, no config


def test_the_environments_bootstrap_never_makes_a_file_run_a_kafka_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``export PRIVSTREAM_BOOTSTRAP=…`` (docs/kafka.md) and then a synthetic or file run: it
    runs on its dataset; only a run naming Kafka (a topic flag, --bootstrap) is a Kafka run."""
    monkeypatch.setenv("PRIVSTREAM_BOOTSTRAP", "127.0.0.1:1")  # nobody listens there
    out = tmp_path / "x.jsonl"
    base = ["run", "ldp-ids", "--users", "500", "--slots", "5", "--window", "5",
            "--insecure-seed", "1", "--no-progress"]  # fmt: skip
    assert main([*base, "--dataset", "sin", "--out", str(out)]) == 0
    assert [r["slot"] for r in read(out)] == [1, 2, 3, 4, 5]
    events = tmp_path / "events.csv"
    events.write_text("".join(f"u{u},{t},{u % 2}\n" for u in range(40) for t in (1, 2, 3)))
    assert main([*base, "--dataset", f"file:{events}", "--out", str(out)]) == 0
    assert [r["slot"] for r in read(out)] == [1, 2, 3]
    capsys.readouterr()
    # naming a Kafka output without the input is a Kafka run, refused in one line
    assert main([*base, "--output-topic", "releases"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "privstream: error: Kafka runs need --input-topic and --output-topic (leave out "
        "--bootstrap and the topic flags for a file or synthetic run)"
    ]


def test_produce_names_its_last_slot_and_refuses_an_empty_range(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The refusal comes before any broker is reached (none listens on port 1)."""
    base = ["produce", "--topic", "events", "--bootstrap", "127.0.0.1:1", "--insecure-seed", "1"]
    assert main([*base, "--first-slot", "101", "--last-slot", "50"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "privstream: error: empty slot range: --first-slot 101 is after the last slot 50 "
        "(--last-slot is the last slot written, not a count)"
    ]
    assert main([*base, "--first-slot", "101", "--slots", "50"]) == 2  # the deprecated alias
    assert "--slots is deprecated: it is the last slot, not a count; give --last-slot 50" in (
        caplog.text
    )
    assert "empty slot range: --first-slot 101 is after the last slot 50" in capsys.readouterr().err
    assert main([*base, "--slots", "5", "--last-slot", "6"]) == 2
    assert "--slots 5 and --last-slot 6 disagree" in capsys.readouterr().err


def test_topics_create_from_a_flow_file_compacts_what_is_keyed_by_release_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from privstream.connectors import kafka

    made: list[Any] = []
    monkeypatch.setattr(kafka, "create_topics", lambda settings, specs: made.extend(specs) or {})
    flow = tmp_path / "flow.toml"
    flow.write_text(
        '[kafka]\nbootstrap = "b:9092"\ninput_topic = "ev"\noutput_topic = "rel"\n'
        'ledger_topic = "led"\ndead_letter_topic = "dlq"\n\n[population]\nusers = 100\n'
        'epsilon = 1.0\nwindow = 5\n\n[[streams]]\nname = "s"\nfamily = "ldp-ids"\n'
        'mechanisms = ["LPA"]\ndomain = 2\nshare = 1.0\n'
    )
    assert main(["topics", "create", "--config", str(flow), "--partitions", "3"]) == 0
    assert [(s.name, s.partitions, dict(s.config)) for s in made] == [
        ("ev", 3, {}),
        ("rel", 3, {"cleanup.policy": "compact"}),
        ("dlq", 3, {}),
        ("led", 3, {"cleanup.policy": "compact"}),
    ]
    capsys.readouterr()
    assert main(["topics", "create", "--config", str(flow), "--output-topic", "x"]) == 2
    assert "--config takes the topics and Kafka settings from the flow file" in (
        capsys.readouterr().err
    )


def test_consume_prints_each_value_as_one_json_line() -> None:
    from privstream.cli.commands import _consumed_line

    release = b'{"stream":"sin","mechanism":"LPA","slot":1,"estimate":[0.5, 0.5]}'
    assert _consumed_line(release, {}) == release.decode()  # byte for byte
    assert _consumed_line(release, {"stream": "sin", "mechanism": "LPA"}) == release.decode()
    assert _consumed_line(release, {"mechanism": "LBU"}) is None
    assert _consumed_line(b'{\n"a": 1}', {}) == '{"a": 1}'  # one line
    assert _consumed_line(b"not json;1", {}) == '"not json;1"'  # a dead letter's raw bytes
    assert _consumed_line(b"not json", {"stream": "sin"}) is None
    assert _consumed_line(b"", {}) is None  # a tombstone


def _events_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "events.csv"
    path.write_text(text)
    return path


def _file_run(src: Path, out: Path, *extra: str) -> list[str]:
    return ["run", "ldp-ids", "--dataset", f"file:{src}", "--users", "10", "--window", "2",
            "--out", str(out), "--no-progress", "--insecure-seed", "3", *extra]  # fmt: skip


def _lines(err: str) -> list[str]:
    """stderr without the log's warnings (the insecure seed, the incarnation)."""
    return [line for line in err.splitlines() if not line.startswith("WARNING ")]


def test_every_run_ends_with_what_it_accepted_and_rejected_by_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _events_file(tmp_path, "user,slot,value\nalice,1,0\nbob,1,1\ncarol,2,x\ndave,2,1\n")
    out, dead = tmp_path / "r.jsonl", tmp_path / "dead.jsonl"
    assert main(_file_run(src, out)) == 0
    err = capsys.readouterr().err
    assert _lines(err)[-1] == (
        "accepted 3 events; 1 events rejected (invalid_type: 1); "
        "add --dead-letter-out FILE to keep them"
    )
    assert not any(name in err for name in ("alice", "bob", "carol", "dave")), "no user id"
    assert main(_file_run(src, out, "--dead-letter-out", str(dead))) == 0
    assert _lines(capsys.readouterr().err)[-1] == (
        f"accepted 3 events; 1 events rejected (invalid_type: 1); dead letters in {dead}"
    )
    assert len(dead.read_text().splitlines()) == 1
    synthetic = ["run", "ldp-ids", "--dataset", "sin", "--users", "500", "--slots", "8",
                 "--window", "4", "--out", str(out), "--no-progress", "--insecure-seed", "3"]  # fmt: skip
    assert main(synthetic) == 0
    assert _lines(capsys.readouterr().err)[-1] == "accepted 4000 events, rejected none"


def test_a_run_that_accepted_no_event_exits_1_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    semicolons = _events_file(tmp_path, "user;slot;value\nalice;1;0\nbob;1;1\ncarol;2;1\n")
    out = tmp_path / "r.jsonl"
    assert main(_file_run(semicolons, out)) == 1
    assert _lines(capsys.readouterr().err) == [
        "privstream: error: the run accepted no event: all 4 events rejected (malformed_csv: 4); "
        "add --dead-letter-out FILE to see them (a file holds JSON lines or comma-separated CSV "
        "with the columns user,slot,value: docs/cli.md)"
    ]
    assert out.read_text() == ""
    empty = _events_file(tmp_path, "")
    assert main(_file_run(empty, out)) == 1
    assert _lines(capsys.readouterr().err) == [
        "privstream: error: the run accepted no event: its input was empty"
    ]
    # a resume of a store that has read its whole input has nothing left: that is no error
    good = _events_file(tmp_path, "alice,1,0\nbob,2,1\n")
    store = ["--recovery-dir", str(tmp_path / "store")]
    assert main(_file_run(good, out, *store)) == 0
    assert _lines(capsys.readouterr().err)[-1] == "accepted 2 events, rejected none"
    assert main(_file_run(good, out, *store)) == 0
    assert _lines(capsys.readouterr().err)[-1] == "accepted 0 events, rejected none"
    assert [r["slot"] for r in read(out)] == [1, 2]


def test_a_personalized_synthetic_run_outside_the_grid_says_what_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "personalized", "--dataset", "sin", "--users", "100", "--slots", "5",
            "--out", str(tmp_path / "r.jsonl"), "--no-progress", "--insecure-seed", "3"]  # fmt: skip
    for setting in (["--window", "20"], ["--epsilon", "2"]):
        assert main([*argv, *setting]) == 2
        err = _lines(capsys.readouterr().err)
        assert len(err) == 1 and err[0].startswith("privstream: error: the synthetic population")
        assert "[0.2, 0.4, 0.6, 0.8, 1.0] at or above ε" in err[0]
        assert "[40, 80, 120, 160, 200] at or below w" in err[0]
        assert "choose --window of at least 40 and --epsilon of at most 1.0" in err[0]
    assert main([*argv, "--window", "40"]) == 0  # the smallest window that fits


def test_ctrl_c_stops_a_bounded_run_with_one_line_and_the_resume_is_exact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGINT mid-run: exit 130 with one line (no Rust panic, no traceback); running the same
    command again resumes to exactly the releases of an uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out, whole = tmp_path / "r.jsonl", tmp_path / "whole.jsonl"
    argv = ["run", "ldp-ids", "--dataset", "sin", "--users", "100000", "--slots", "300",
            "--window", "20", "--no-progress", "--insecure-seed", "3",
            "--recovery-dir", str(tmp_path / "store"), "--snapshot-interval", "0.2"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "privstream.cli", *argv, "--out", str(out)],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while (not out.exists() or len(out.read_text().splitlines()) < 20) and proc.poll() is None:
        assert time.monotonic() < deadline, "the run wrote no releases"
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert _lines(err) == [
        f"privstream: interrupted (SIGINT): run the same command again to resume from "
        f"{tmp_path / 'store'}"
    ]
    assert "panicked" not in err and "Traceback" not in err
    assert len(out.read_text().splitlines()) < 300, "interrupted before the end"
    assert main([*argv, "--out", str(out)]) == 0
    argv_whole = [a for a in argv if a != str(tmp_path / "store")]
    argv_whole = [a for a in argv_whole if a != "--recovery-dir"]
    assert main([*argv_whole, "--out", str(whole)]) == 0
    assert out.read_bytes() == whole.read_bytes()
    assert [r["slot"] for r in read(out)] == list(range(1, 301))


def test_an_ldp_reports_server_reads_no_events_and_runs_local_dp_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--trust ldp-reports``: an event topic is refused (a server reading raw events is not
    local DP), the report, request and output topics are required, and a central-DP family
    is refused (its curator sees raw values)."""
    base = ["run", "ldp-ids", "--trust", "ldp-reports", "--bootstrap", "127.0.0.1:1"]
    assert main([*base, "--input-topic", "events", "--report-topic", "r", "--request-topic",
                 "q", "--output-topic", "o"]) == 2  # fmt: skip
    assert "the server reads no events" in capsys.readouterr().err
    assert main([*base, "--report-topic", "r"]) == 2
    assert "needs --request-topic, --output-topic" in capsys.readouterr().err
    assert main([*base, "--report-topic", "r", "--request-topic", "r", "--output-topic", "o"]) == 2
    assert "must be two topics" in capsys.readouterr().err
    assert main(["run", "personalized", "--trust", "ldp-reports"]) == 2
    assert "the personalized family runs as cdp" in capsys.readouterr().err


def test_no_family_option_flag_is_an_ambiguous_prefix_of_a_run_flag() -> None:
    """argparse reads ``privstream run`` flags before the family's sub-command: a family option
    whose flag is a prefix of two or more of them (SaO2's ``s`` as ``--s``: ``--slots``,
    ``--secret-file``, …) would be refused as ambiguous, so every option flag parses."""
    from privstream.cli.commands import _parser
    from privstream.families.registry import FAMILIES

    parser = _parser()
    for family in FAMILIES.values():
        for option in family.options:
            flag = "--" + option.word.replace("_", "-")
            default = option.default if option.default is not None else "1"
            value = ",".join(map(str, default)) if isinstance(default, tuple) else str(default)
            args = parser.parse_args(["run", family.name, flag, value])
            assert getattr(args, option.name) == option.parse(value), (family.name, flag)
