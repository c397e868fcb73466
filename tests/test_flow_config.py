"""Flow configuration files (``privstream.flows.config``): the example loads; every field is
validated with a message naming the file, the key and what is allowed; ``privstream config
check`` prints the streams or exits 2 with that message."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from privstream.cli.commands import main
from privstream.flows.config import (
    ConfigError,
    describe,
    estimation_task,
    load,
    task_keywords,
)
from privstream.mechanisms.cgm_math import agm_mu
from privstream.mechanisms.guarantees import GaussianDP
from privstream.mechanisms.tasks import BallTask, FrequencyTask, MeanTask

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"

BASE: dict[str, Any] = {
    "kafka": {"bootstrap": "localhost:9092", "input_topic": "events", "output_topic": "releases"},
    "population": {"users": 1000, "epsilon": 2.0, "window": 20},
    "streams": [
        {"name": "country", "family": "ldp-ids", "mechanisms": ["LPA"], "domain": 8, "share": 0.5}
    ],
}
CGM_STREAM: dict[str, Any] = {
    "name": "speed", "family": "cgm", "mechanisms": ["CGM"], "range": [0, 120], "share": 0.5,
}  # fmt: skip
VISITS: dict[str, Any] = {
    "name": "visits", "family": "personalized", "mechanisms": "PBD", "domain": 2, "share": 0.5,
}  # fmt: skip

SAMPLERS = {"publications": 0, "threshold_scale": 1.0, "process_variance": 0.0025**2,
            "interval_rule": "normalized"}  # fmt: skip
"""The LDP-IDS options of DSAT and RescueDP at their defaults."""


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return json.dumps(value)


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml(data: dict[str, Any]) -> str:
    """The TOML text of ``data``: top-level scalars, ``[tables]`` (nested ones inline) and
    ``[[arrays of tables]]``."""
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    arrays = {k: v for k, v in data.items() if isinstance(v, list) and v and
              all(isinstance(x, dict) for x in v)}  # fmt: skip
    lines = [f"{_key(k)} = {_value(v)}" for k, v in data.items() if k not in tables | arrays]
    for name, table in tables.items():
        lines += [f"[{name}]", *(f"{_key(k)} = {_value(v)}" for k, v in table.items())]
    for name, items in arrays.items():
        for item in items:
            lines += [f"[[{name}]]", *(f"{_key(k)} = {_value(v)}" for k, v in item.items())]
    return "\n".join(lines) + "\n"


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "flow.toml"
    path.write_text(_toml(data))
    return path


def _registrations(tmp_path: Path, *rows: str, name: str = "registrations.csv") -> None:
    (tmp_path / name).write_text("user,epsilon,window\n" + "".join(f"{r}\n" for r in rows))


def _error(tmp_path: Path, change: Callable[[dict[str, Any]], object]) -> str:
    data = copy.deepcopy(BASE)
    change(data)
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    return message


def _stream(**fields: Any) -> Callable[[dict[str, Any]], object]:
    """Change the first stream's fields (None removes one)."""

    def change(data: dict[str, Any]) -> None:
        stream = data["streams"][0]
        for key, value in fields.items():
            if value is None:
                stream.pop(key, None)
            else:
                stream[key] = value

    return change


def _set(section: str, **fields: Any) -> Callable[[dict[str, Any]], object]:
    return lambda data: data.setdefault(section, {}).update(fields)


def test_the_example_loads() -> None:
    """``deploy/flow.toml``: several streams of both families, shares summing to 1, its
    registration table read and checked."""
    config = load(DEPLOY / "flow.toml")
    by_name = {s.name: s for s in config.streams}
    assert set(by_name) == {"country", "device", "page", "session", "visits"}
    assert {s.family for s in config.streams} == {"ldp-ids", "personalized"}
    assert sum(s.share for s in config.streams) == pytest.approx(1.0)
    assert (config.population.users, config.population.epsilon, config.population.window) == (
        200_000, 2.0, 20,
    )  # fmt: skip
    assert config.population.registrations == (DEPLOY / "registrations.example.csv").absolute()
    assert len(config.population.preferences) == 3
    device = by_name["device"]
    assert device.mechanisms == ("LBU", "LPA") and device.budget_split == "equal"
    assert device.epsilon == pytest.approx(0.4) and device.window == 20
    assert by_name["page"].options == {"beta": 0.4, **SAMPLERS, "client_path": "aggregate"}
    assert by_name["page"].window == 40
    assert by_name["session"].task == (0.0, 3600.0) and by_name["session"].lateness == 2
    assert by_name["visits"].task == 2 and by_name["visits"].options == {}
    assert config.run.recovery_dir == Path("/var/lib/privstream/recovery")
    assert config.kafka.dead_letter_topic == "dead-letters"


def test_the_flow_files_page_example_loads(tmp_path: Path) -> None:
    """docs/flow-files.md's configuration file (once the README's), next to a registration
    table, is valid as written."""
    page = (DEPLOY.parent / "docs" / "flow-files.md").read_text()
    (block,) = re.findall(r"```toml\n(.*?)```", page, re.S)
    (tmp_path / "flow.toml").write_text(block)
    _registrations(tmp_path, "user-1,2.0,20")
    config = load(tmp_path / "flow.toml")
    assert [s.name for s in config.streams] == ["country", "device", "visits"]
    assert [s.epsilon for s in config.streams] == pytest.approx([1.0, 0.4, 0.6])


def test_defaults_and_relative_paths(tmp_path: Path) -> None:
    """Optional keys take their defaults; relative paths are relative to the file's folder."""
    data = copy.deepcopy(BASE)
    data["run"] = {"recovery_dir": "state", "secret_file": "/keys/noise.key"}
    config = load(_write(tmp_path, data))
    (stream,) = config.streams
    assert stream.window == 20 and stream.lateness == 1 and stream.budget_split is None
    assert stream.epsilon == 1.0
    assert stream.options == {"beta": 0.5, **SAMPLERS, "client_path": "aggregate"}
    assert config.kafka.max_event_bytes == 65536 and config.kafka.properties == {}
    assert config.kafka.dead_letter_topic is None and config.kafka.stall_warning_seconds == 30.0
    assert config.run.workers == 1 and config.run.processes == 1
    assert config.run.snapshot_interval == 10.0
    assert config.run.recovery_dir == (tmp_path / "state").absolute()
    assert config.run.secret_file == Path("/keys/noise.key")
    assert config.population.registrations is None


def test_tasks_and_family_options(tmp_path: Path) -> None:
    """A range, a ball and a family's options by name; the task is the one the run builds."""
    data = copy.deepcopy(BASE)
    ball = {"center": [1, 2], "radius": 3}
    vectors = {k: v for k, v in CGM_STREAM.items() if k != "range"}
    numbers = {k: v for k, v in BASE["streams"][0].items() if k != "domain"}
    data["streams"] = [
        {**CGM_STREAM, "delta": 1e-6, "bound": 2, "lag": 2, "share": 0.25},
        {**vectors, "name": "place", "ball": ball, "share": 0.25},
        {**numbers, "range": [-1, 1], "budget_split": [2, 1], "mechanisms": "lbu,lpa",
         "client_path": "per-user"},
    ]  # fmt: skip
    speed, place, country = load(_write(tmp_path, data)).streams
    assert speed.options == {"delta": 1e-6, "bound": 2.0, "budget_scope": "stream", "lag": 2}
    assert estimation_task(speed.task) == MeanTask(0.0, 120.0)
    assert task_keywords(speed.task) == {"mean_range": (0.0, 120.0)}
    assert place.task == ((1.0, 2.0), 3.0) and estimation_task(place.task) == BallTask((1, 2), 3)
    assert task_keywords(place.task) == {"ball": ((1.0, 2.0), 3.0)}
    assert country.mechanisms == ("LBU", "LPA") and country.budget_split == "2,1"
    assert country.options["client_path"] == "per-user"
    assert estimation_task(8) == FrequencyTask(8) and task_keywords(8) == {"domain": 8}


def _remove(section: str, key: str | None = None) -> Callable[[dict[str, Any]], object]:
    return lambda data: data.pop(section) if key is None else data[section].pop(key)


def _add_stream(**fields: Any) -> Callable[[dict[str, Any]], object]:
    return lambda data: data["streams"].append({**BASE["streams"][0], **fields})


def _only(stream: dict[str, Any], **fields: Any) -> Callable[[dict[str, Any]], object]:
    """Make ``stream`` with ``fields`` (None removes one) the file's only stream."""
    table = {k: v for k, v in {**stream, **fields}.items() if v is not None}
    return lambda data: data.update(streams=[table])


@pytest.mark.parametrize(
    ("change", "parts"),
    [
        # unknown keys, at every level
        (lambda d: d.update(stream=1), ["stream: unknown key; allowed: kafka, population, run, streams"]),
        (_set("kafka", bootstrap_servers="x"), ["kafka.bootstrap_servers: unknown key; allowed: bootstrap, clock, dead_letter_topic, dpi_audit_topic, grow_partitions, input_topic"]),
        (_set("kafka", clock="data"), ["kafka.clock: the data clock", "--trust-input-clock"]),
        (_set("kafka", clock="wall"), ["kafka.clock: must be one of markers, data"]),
        (_set("population", n=5), ["population.n: unknown key; allowed: allow_large_delta, delta, epsilon, registrations, retired, users, window"]),
        (_set("run", threads=2), ["run.threads: unknown key; allowed: processes, recovery_dir, secret_file, snapshot_interval, workers"]),
        (_stream(delta=0.1), ['streams["country"].delta: unknown key; allowed: ', "beta", "client_path", "budget_split"]),
        (_only(CGM_STREAM, range=None, ball={"center": [0], "radius": 1, "norm": 2}), ['streams["speed"].ball.norm: unknown key; allowed: center, radius']),
        # sections and required keys
        (_remove("kafka"), ["kafka: missing; required (a table [kafka])"]),
        (lambda d: d.update(kafka="x"), ['kafka: must be a table, got "x"']),
        (_remove("kafka", "bootstrap"), ["kafka.bootstrap: missing; required (HOST:PORT[,...]"]),
        (_remove("population", "users"), ["population.users: missing; required (an integer)"]),
        (_remove("streams"), ["streams: missing; required (one or more [[streams]] tables)"]),
        (lambda d: d.update(streams=[]), ["streams: must be one or more [[streams]] tables, got []"]),
        (lambda d: d.update(streams=[1]), ["streams[1]: must be a table, got 1"]),
        # kafka
        (_set("kafka", input_topic="my events"), ['kafka.input_topic: must be a Kafka topic name ([A-Za-z0-9._-]{1,249}), got "my events"']),
        (_set("kafka", output_topic="events"), ['kafka.output_topic: "events" is also kafka.input_topic; each role needs its own topic']),
        (_set("kafka", max_event_bytes=0), ["kafka.max_event_bytes: must be an integer >= 1, got 0"]),
        (_set("kafka", stall_warning_seconds=0), ["kafka.stall_warning_seconds: must be a finite number > 0, got 0"]),
        (_set("kafka", properties={"bootstrap.servers": "a:1"}), ['kafka.properties."bootstrap.servers": set the brokers with kafka.bootstrap']),
        # population
        (_set("population", users=True), ["population.users: must be an integer >= 1, got true"]),
        (_set("population", users=0), ["population.users: must be an integer >= 1, got 0"]),
        (_set("population", epsilon=1e-4), ["population.epsilon: ", "epsilon must lie in [0.001, 1e+06], got 0.0001"]),
        (_set("population", epsilon="2"), ['population.epsilon: must be a finite number, got "2"']),
        (_set("population", window=100_001), ["population.window: must be an integer in [1, 100000], got 100001"]),
        (_set("population", window=20.5), ["population.window: must be an integer in [1, 100000], got 20.5"]),
        # run
        (_set("run", workers=0), ["run.workers: must be an integer >= 1, got 0"]),
        (_set("run", processes=0), ["run.processes: must be an integer >= 1, got 0"]),
        (_set("run", snapshot_interval=-1), ["run.snapshot_interval: must be a finite number > 0, got -1"]),
        (_set("run", recovery_dir=""), ['run.recovery_dir: must be a path (a non-empty string), got ""']),
        # stream names
        (_stream(name="a.b"), ['streams[1].name: must be a stream name ([A-Za-z0-9_-]{1,64}), got "a.b"']),
        (_stream(name="x" * 65), ["streams[1].name: must be a stream name"]),
        (_add_stream(share=0.1), ['streams[2].name: "country" is also the name of streams[1]; stream names are unique']),
        # family, mechanisms, budget split
        (_stream(family="ldp"), ['streams["country"].family: must be one of ldp-ids, personalized, cgm, dpi, sao2; got "ldp"']),
        (_stream(mechanisms=["XYZ"]), ['streams["country"].mechanisms: unknown ldp-ids mechanism(s) [\'XYZ\']; choose from LBU']),
        (_stream(mechanisms=[1]), ['streams["country"].mechanisms: must be a list of names of LBU']),
        (_stream(mechanisms=["LBU", "LPA"]), ['streams["country"].budget_split: missing; required with several mechanisms (LBU, LPA share']),
        (_stream(mechanisms=["LBU", "LPA"], budget_split="1"), ['streams["country"].budget_split: ', "needs 2 positive finite weights, got '1'"]),
        (_stream(budget_split=True), ['streams["country"].budget_split: must be "equal", "w1,w2,..." or [w1, w2, ...], got true']),
        # the task
        (_stream(range=[0, 1]), ['streams["country"]: give exactly one of domain = d', "got domain and range"]),
        (_stream(domain=None), ['streams["country"]: give exactly one of', "got none"]),
        (_stream(domain=1), ['streams["country"].domain: must be an integer >= 2, got 1']),
        (_stream(domain=None, range=[5, 1]), ['streams["country"].range: mean task needs finite lower < upper, got [5.0, 1.0]']),
        (_stream(domain=None, range=[0, 1, 2]), ['streams["country"].range: must be [lower, upper] (two finite numbers), got [0, 1, 2]']),
        (_stream(domain=None, ball={"center": [0], "radius": 1}), ['streams["country"].ball: the ldp-ids family takes domain = d (a histogram over d categories) or range = [lower, upper]']),
        (_only(VISITS, domain=None, range=[0, 1]), ['streams["visits"].range: the personalized family takes domain = d (a histogram over d categories)']),
        (_only(CGM_STREAM, range=None, domain=4), ['streams["speed"].domain: the cgm family takes range = [lower, upper] (the mean of numbers) or ball = {']),
        # share, window, lateness
        (_stream(share=1.5), ['streams["country"].share: share must lie in (0, 1], got 1.5']),
        (_stream(share=0), ['streams["country"].share: share must lie in (0, 1], got 0']),
        (_add_stream(name="device", share=0.6), ["streams: the shares sum to 1.1 > 1 (country 0.5, device 0.6)"]),
        (_stream(window=10), ['streams["country"].window: must be an integer in [20, 100000], got 10 (a stream\'s window may be longer than population.window = 20, never shorter)']),
        (_stream(lateness=-1), ['streams["country"].lateness: must be an integer >= 0, got -1']),
        # family options
        (_stream(beta=1.5), ['streams["country"].beta: must lie in (0, 1), got 1.5 (share β of the dissimilarity step)']),
        (_stream(beta="0.5"), ['streams["country"].beta: must be a number (share β']),
        (_stream(client_path="server"), ['streams["country"].client_path: must be one of aggregate, per-user; got "server"']),
        (_only(CGM_STREAM, budget_scope="forever"), ['streams["speed"].budget_scope: must be stream or timestamp, got forever']),
        (_only(CGM_STREAM, lag=1.5), ['streams["speed"].lag: must be an integer']),
        # the family's own config: ε = share × population.epsilon, its limits
        (_set("population", epsilon=0.001), ['streams["country"]: the ldp-ids family refuses ε = share × population.epsilon = 0.5 × 0.001 = 0.0005, w = 20: ', "epsilon must lie in [0.001, 1e+06], got 0.0005"]),
        (_only(CGM_STREAM, lag=400), ['streams["speed"]: the cgm family refuses ε = share × population.epsilon = 0.5 × 2 = 1, w = 20: lag must be an integer in [1, 366], got 400']),
        (_only(CGM_STREAM, budget_scope="timestamp"), ['streams["speed"]: with these options CGM\'s budget renews every 1 slot(s), fewer than population.window = 20']),
        # central DP: the registration table
        (lambda d: d["streams"].append(VISITS), ["population.registrations: missing; required by the central-DP stream(s) visits"]),
        (lambda d: (d["streams"].append(VISITS), d["population"].update(registrations="none.csv")), ["population.registrations: preferences file", "none.csv does not exist"]),
        (_set("population", registrations="registrations.csv"), ["population.registrations: no stream counts registered users (the central-DP families do: personalized, dpi; an LDP stream with registered_only = true)"]),
    ],
)  # fmt: skip
def test_every_rule_names_the_file_the_key_and_what_is_allowed(
    tmp_path: Path, change: Callable[[dict[str, Any]], object], parts: list[str]
) -> None:
    message = _error(tmp_path, change)
    for part in parts:
        assert part in message, (part, message)


@pytest.mark.parametrize(
    ("rows", "part"),
    [
        (("u1,2.0,20", "u2,3.0,20"), "entry 2 asks (ε_i, w_i) = (3, 20); the population's "
         "guarantee needs ε_i <= population.epsilon = 2 and w_i >= population.window = 20"),
        (("u1,1.0,10",), "entry 1 asks (ε_i, w_i) = (1, 10)"),
        (("u1,1e-9,20",), "entry 1: epsilon must lie in [0.001, 1e+06], got 1e-09"),
        (("u1,1.0",), "registrations.csv:2: expected user, epsilon, window"),
        (tuple(f"u{i},1.0,20" for i in range(1001)), "the table registers 1001 users, more "
         "than population.users = 1000"),
    ],
)  # fmt: skip
def test_registrations_are_checked_against_the_population(
    tmp_path: Path, rows: tuple[str, ...], part: str
) -> None:
    """A central-DP stream's share scales every ε_i: an entry beyond the population's budget
    (or window, or the limits) is refused, never naming the user."""
    _registrations(tmp_path, *rows)

    def change(data: dict[str, Any]) -> None:
        data["streams"].append(VISITS)
        data["population"]["registrations"] = "registrations.csv"

    message = _error(tmp_path, change)
    assert part in message, message
    assert "population.registrations: " in message
    assert not re.search(r"\bu\d+\b", message), message


def test_a_valid_registration_is_kept_out_of_reprs(tmp_path: Path) -> None:
    _registrations(tmp_path, "user-secret-1,2.0,20", "user-secret-2,0.5,40")
    data = copy.deepcopy(BASE)
    data["streams"].append(VISITS)
    data["population"]["registrations"] = "registrations.csv"
    config = load(_write(tmp_path, data))
    assert dict(config.population.preferences) == {
        "user-secret-1": (2.0, 20), "user-secret-2": (0.5, 40),
    }  # fmt: skip
    assert "user-secret" not in repr(config)


def test_a_registered_only_ldp_stream_is_a_closed_population(tmp_path: Path) -> None:
    """Issue 18 §4 (sybils): an LDP stream may count only the table's users; every entry's
    requirement must hold under the stream's own ε per window (share × ε = 1 per 20 slots
    here: ε_i ≥ 1 for w_i ≤ 20, ε_i ≥ 2 for w_i ≤ 40), named by number, never by user."""
    _registrations(tmp_path, "u1,1.0,20", "u2,2.0,40")
    data = copy.deepcopy(BASE)
    data["streams"][0]["registered_only"] = True
    data["population"]["registrations"] = "registrations.csv"
    config = load(_write(tmp_path, data))
    assert config.streams[0].registered_only
    assert set(config.population.preferences) == {"u1", "u2"}
    _registrations(tmp_path, "u1,1.0,20", "u2,1.5,40")
    message = _error(tmp_path, lambda d: (
        d["streams"][0].update(registered_only=True),
        d["population"].update(registrations="registrations.csv"),
    ))  # fmt: skip
    assert (
        "population.registrations: for the registered_only stream country: registration "
        "entry 2 asks (ε_i, w_i) = (1.5, 40)" in message
    ), message
    assert not re.search(r"\bu\d+\b", message), message
    assert "registered_only: must be true or false" in _error(
        tmp_path, _stream(registered_only="yes")
    )
    assert "registrations: missing; required by the registered stream(s) country" in _error(
        tmp_path, _stream(registered_only=True)
    )
    visits = dict(VISITS, registered_only=True)
    assert "always counts only registered users" in _error(
        tmp_path, lambda d: d["streams"].append(visits)
    )


def test_user_shards_are_for_streams_whose_ports_follow_from_counts(tmp_path: Path) -> None:
    """Issue 26: ``shards = k`` runs a central-DP stream's, or a closed LDP population's
    budget-division, per-user work on k user shards; an open LDP population, population
    division, an ldp-reports server, the data clock and a count outside 1..256 are refused
    with the reason."""
    _registrations(tmp_path, "u1,1.0,20", "u2,2.0,40")
    data = copy.deepcopy(BASE)
    data["population"]["registrations"] = "registrations.csv"
    data["streams"].append(dict(VISITS, shards=8))
    config = load(_write(tmp_path, data))
    assert [s.shards for s in config.streams] == [None, 8]
    assert "(on 8 user shards)" in describe(config)[1]
    with_registrations = _set("population", registrations="registrations.csv")
    for bad in (0, 257, "8", True):
        message = _error(tmp_path, lambda d, bad=bad: (
            with_registrations(d), d["streams"].append(dict(VISITS, shards=bad))))  # fmt: skip
        assert 'streams["visits"].shards: must be an integer in [1, 256]' in message, message
    assert "an open LDP population seats each slot's newcomers" in _error(
        tmp_path, _stream(shards=2)
    )
    closed = _stream(shards=2, registered_only=True)
    assert 'streams["country"].shards: LPA divides the population' in _error(
        tmp_path, lambda d: (with_registrations(d), closed(d))
    )
    data = copy.deepcopy(BASE)
    data["population"]["registrations"] = "registrations.csv"
    data["streams"][0].update(mechanisms=["LBU", "LBA"], budget_split="equal", registered_only=True,
                              shards=4)  # fmt: skip
    assert "(on 4 user shards)" in describe(load(_write(tmp_path, data)))[0]
    data["kafka"] = dict(REPORTS_KAFKA)
    del data["streams"][0]["registered_only"]
    assert "requests the decision publishes" in _error(tmp_path, lambda d: d.update(data))
    message = _error(tmp_path, lambda d: (
        with_registrations(d), d["streams"].append(dict(VISITS, shards=2)),
        d["kafka"].update(clock="data", trust_input_clock=True),
    ))  # fmt: skip
    assert "kafka.clock: stream(s) ['visits'] set shards: user shards need the markers clock" in (
        message
    ), message


def test_a_property_value_is_never_shown(tmp_path: Path) -> None:
    """A client property may be a credential: its error names the key, not the value."""
    message = _error(tmp_path, _set("kafka", properties={"sasl.password": 918273645}))
    assert 'kafka.properties."sasl.password": must be a string' in message
    assert "918273645" not in message


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(missing))}: cannot read"):
        load(missing)
    bad = tmp_path / "bad.toml"
    bad.write_text("[kafka\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(bad))}: not a valid TOML file"):
        load(bad)


def test_config_check_prints_every_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = copy.deepcopy(BASE)
    data["streams"].append({**CGM_STREAM, "share": 0.25, "window": 48})
    assert main(["config", "check", str(_write(tmp_path, data))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "stream country: ldp-ids LPA; d = 8; ε = 0.5 × 2 = 1; w = 20",
        "stream speed: cgm CGM; range [0, 120]; ε = 0.25 × 2 = 0.5, δ = 1e-05; w = 48; "
        f"Gaussian DP: μ = {agm_mu(0.5, 1e-5):.6g} (ε 0.5 at δ)",
        "2 stream(s), n = 1000: shares sum to 0.75, so a user in every stream spends at most "
        "1.5 of ε = 2 and 1e-05 of δ = 1e-05 (1/n = 0.001) per 20 slots",
    ]


def test_config_check_of_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(DEPLOY / "flow.toml")]) == 0
    out = capsys.readouterr().out
    assert (
        "stream visits: personalized PBD; d = 2; ε = 0.3 × 2 = 0.6 (registered users: 0.3 × ε_i)"
        in out
    )
    assert "shares sum to 1, so a user in every stream spends at most 2 of ε = 2 per 20" in out


def test_config_check_refuses_a_bad_file_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = copy.deepcopy(BASE)
    data["streams"][0]["share"] = 1.5
    path = _write(tmp_path, data)
    assert main(["config", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f'privstream: error: {path}: streams["country"].share: share must lie in (0, 1], got 1.5\n'
    )


# -- δ composes across the streams of a population (issue 18 §4) ---------------------------------


def _cgm_streams(*deltas: float | None, share: float = 0.25) -> list[dict[str, Any]]:
    """CGM streams ``s1, s2, …``, each with its own ``delta`` (None: none given)."""
    out = []
    for k, delta in enumerate(deltas, start=1):
        stream = {**CGM_STREAM, "name": f"s{k}", "share": share}
        if delta is not None:
            stream["delta"] = delta
        out.append(stream)
    return out


@pytest.mark.parametrize(("deltas", "total"), [((0.6, 0.6), 1.2), ((0.5, 0.5, 0.5, 0.5), 2.0)])
def test_deltas_that_sum_past_one_are_refused(
    tmp_path: Path, deltas: tuple[float, ...], total: float
) -> None:
    """The audit's flow files: every stream's δ < 1, but Σ δ = 1.2 or 2.0 loaded and ``config
    check`` printed "at most 1 of ε". Streams compose, so their δ add up: refused by name."""
    message = _error(tmp_path, lambda d: d.update(streams=_cgm_streams(*deltas)))
    assert f"population.delta: the streams' δ sum to {total:g} >= 1" in message
    allowed = _error(
        tmp_path,
        lambda d: d.update(
            streams=_cgm_streams(*deltas), population={**BASE["population"], "delta": 1e-5}
        ),
    )
    assert f"the streams' δ sum to {total:g} > population δ = 1e-05" in allowed
    assert ", ".join(f"s{k} {d:g}" for k, d in enumerate(deltas, start=1)) in allowed


def test_a_delta_at_least_one_over_n_is_refused_unless_allowed(tmp_path: Path) -> None:
    """n = 1000: δ = 1e−3 (= 1/n) is refused, given or summed (two streams of 5e−4), and names
    the override; ``allow_large_delta = true`` accepts it; δ < 1/n always passes."""
    given = {**BASE["population"], "delta": 1e-3}
    message = _error(tmp_path, lambda d: d.update(population=given, streams=_cgm_streams(None)))
    assert "population.delta: δ = 0.001 is at least 1/n = 1/1000" in message
    assert "set population.allow_large_delta = true" in message and "1e-05" in message
    summed = _error(tmp_path, lambda d: d.update(streams=_cgm_streams(5e-4, 5e-4)))
    assert "δ = 0.001 is at least 1/n" in summed
    data = copy.deepcopy(BASE)
    data.update(population={**given, "allow_large_delta": True}, streams=_cgm_streams(None))
    assert load(_write(tmp_path, data)).population.delta == 1e-3
    data.update(population={**BASE["population"], "delta": 9.99e-4}, streams=_cgm_streams(None))
    assert load(_write(tmp_path, data)).population.delta == 9.99e-4
    data["population"]["allow_large_delta"] = "yes"
    with pytest.raises(ConfigError, match="allow_large_delta: must be true or false"):
        load(_write(tmp_path, data))


def test_population_delta_is_shared_by_share_or_given_per_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``population.delta`` a stream without its own δ takes ``share × δ``; an explicit one
    is kept; the sum is checked against the population's δ and ``config check`` prints them."""
    data = copy.deepcopy(BASE)
    data["population"]["delta"] = 1e-5
    data["streams"] = [*_cgm_streams(None, 2e-6, share=0.5)]
    config = load(_write(tmp_path, data))
    assert [s.options["delta"] for s in config.streams] == [5e-6, 2e-6]
    assert config.population.delta == 1e-5
    assert main(["config", "check", str(_write(tmp_path, data))]) == 0
    out = capsys.readouterr().out
    assert "ε = 0.5 × 2 = 1, δ = 5e-06; w = 20" in out and "δ = 2e-06; w = 20" in out
    assert "at most 2 of ε = 2 and 7e-06 of δ = 1e-05 (1/n = 0.001) per 20 slots" in out
    # a Gaussian-DP stream in its own unit: μ, its ε named as the ε at δ (never μ² as an ε)
    lines = [line for line in out.splitlines() if line.startswith("stream ")]
    shown = [float(line.split("μ = ")[1].split(" ")[0]) for line in lines]
    assert all(
        f"(ε {s.epsilon:g} at δ)" in line for s, line in zip(config.streams, lines, strict=True)
    )
    for stream, value in zip(config.streams, shown, strict=True):
        mu = agm_mu(stream.epsilon, float(stream.options["delta"]))
        assert value == pytest.approx(mu, rel=1e-5)
        assert GaussianDP(value).epsilon(float(stream.options["delta"])) == pytest.approx(
            stream.epsilon, rel=1e-4
        )
    del data["population"]["delta"]  # without it the population's δ is the streams' sum
    assert load(_write(tmp_path, data)).population.delta == pytest.approx(1e-5 + 2e-6)
    assert load(_write(tmp_path, BASE)).population.delta is None  # no stream has a δ


def test_config_check_refuses_deltas_past_one_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = copy.deepcopy(BASE)
    data["streams"] = _cgm_streams(0.6, 0.6)
    assert main(["config", "check", str(_write(tmp_path, data))]) == 2
    assert "δ sum to 1.2 >= 1" in capsys.readouterr().err


def test_the_adapted_samplers_take_their_options_by_name(tmp_path: Path) -> None:
    """LP-DSAT and LB-RescueDP in a flow file, with DSAT's C and RescueDP's Kalman prior; a bad
    interval rule is refused naming its key."""
    data = copy.deepcopy(BASE)
    _stream(mechanisms="lp-dsat,LB-RescueDP", budget_split="equal", publications=3,
            process_variance=1e-4, interval_rule="literal")(data)  # fmt: skip
    (country,) = load(_write(tmp_path, data)).streams
    assert country.mechanisms == ("LP-DSAT", "LB-RescueDP")
    assert (country.options["publications"], country.options["process_variance"]) == (3, 1e-4)
    assert country.options["interval_rule"] == "literal"
    message = _error(tmp_path, _stream(interval_rule="sometimes"))
    assert 'streams["country"].interval_rule: must be normalized or literal' in message


REPORTS_KAFKA: dict[str, Any] = {
    "bootstrap": "localhost:9092", "trust": "ldp-reports", "report_topic": "reports",
    "request_topic": "requests", "output_topic": "releases",
}  # fmt: skip


def test_an_ldp_reports_file_reads_reports_and_writes_requests(tmp_path: Path) -> None:
    """``trust = "ldp-reports"``: the report topic is the flow's input, the request topic one
    more role; the slot clock of ``privstream clock --config`` follows the request topic."""
    data = copy.deepcopy(BASE)
    data["kafka"] = dict(REPORTS_KAFKA)
    config = load(_write(tmp_path, data))
    assert config.kafka.trust == "ldp-reports"
    assert (config.kafka.input_topic, config.kafka.request_topic) == ("reports", "requests")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d["kafka"].update(input_topic="events"), "kafka.input_topic: an ldp-reports "
         "server reads no events"),
        (lambda d: d["kafka"].pop("request_topic"), "kafka.request_topic"),
        (lambda d: d["kafka"].update(request_topic="reports"), "each role needs its own topic"),
        (lambda d: d["streams"].append(dict(VISITS)), "ldp-reports runs local-DP families "
         "only; stream(s) ['visits']"),
        (lambda d: d["kafka"].update(trust="cdp"), "kafka.trust"),
    ],
)  # fmt: skip
def test_an_ldp_reports_file_refuses_what_would_break_local_dp(
    tmp_path: Path, change: Callable[[dict[str, Any]], object], expected: str
) -> None:
    def reports(data: dict[str, Any]) -> None:
        data["kafka"] = dict(REPORTS_KAFKA)
        change(data)

    assert expected in _error(tmp_path, reports)


def test_report_topics_are_refused_without_ldp_reports(tmp_path: Path) -> None:
    message = _error(tmp_path, lambda d: d["kafka"].update(request_topic="requests"))
    assert 'kafka.request_topic: is read only with trust = "ldp-reports"' in message
