"""The real local-DP demo (``make demo-ldp``, ``privstream demo-ldp``): ``ldp-reports`` end to
end on the embedded default, every piece its own process as in a deployment.

1. start the embedded Kafka-protocol broker (Tansu) on a free port;
2. create the report, request, release, dead-letter and ledger topics, and write the flow
   file ``OUT/flow.toml``: one stream, ``sin``, served by the seven LDP-IDS mechanisms of the
   paper with an equal budget split (ε each, of the devices' 7ε per window);
3. start the server stage (``privstream run --config``: it reads reports only, never a raw
   value);
4. start the HTTP gateway (``privstream gateway``) and the simulated devices
   (``privstream devices --gateway``: n devices holding the synthetic Sin stream, the last
   ``--liars`` of them lying, one way each);
5. start the round clock (``privstream clock --config --now``: it opens the slots and closes
   each round ``--round-seconds`` after its request appeared, with the clock key only), and
   follow the release topic until every mechanism released every slot;
6. read back the releases, requests and dead letters, score each mechanism against the true
   per-slot histogram of the devices' data, print the table and the refusals by reason, and
   save the releases, requests, table, results and a plot in ``OUT``; stop everything.

Why one stream with ``budget_split = "equal"`` and a population ε of 7ε: the seven mechanisms
are compared on the same devices, each with the ε it would have alone. Each device's own
ledger admits the sum, 7ε per window, and refuses anything beyond; a deployment serves one
mechanism (or splits its ε). With ε/7 each, n = 2,000 devices give estimates far noisier than
the signal (LBU's standard deviation would be about 0.9 for a frequency in [0, 1]).

The noise secret is ``$PRIVSTREAM_SECRET`` or a fresh random one that is never stored; only
the server stage gets it, the clock gets its clock key, the gateway and the devices neither.
Privacy of the outputs: releases, public requests and counts by reason; no dead letter's
content (it would carry a device id), no raw value.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

MECHANISMS = ("LBU", "LPU", "LSP", "LBD", "LBA", "LPD", "LPA")
STREAM = "sin"
TOPICS = {"reports": "reports", "requests": "requests", "releases": "releases",
          "dead_letters": "dead-letters", "ledger": "ledger"}  # fmt: skip
FLOW = """\
# privstream demo-ldp: the seven LDP-IDS mechanisms of one stream in ldp-reports mode
[kafka]
bootstrap = "{bootstrap}"
trust = "ldp-reports"
report_topic = "{reports}"
request_topic = "{requests}"
output_topic = "{releases}"
dead_letter_topic = "{dead_letters}"
ledger_topic = "{ledger}"

[population]
users = {users}
epsilon = {population_epsilon}  # 7 mechanisms x epsilon = {epsilon} each
window = {window}

[[streams]]
name = "{stream}"
family = "ldp-ids"
mechanisms = {mechanisms}
budget_split = "equal"
domain = 2
share = 1.0
"""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class DemoParams:
    """The demo's size and budget: ``epsilon`` is each mechanism's ε per ``window`` slots."""

    users: int = 2000
    slots: int = 12
    epsilon: float = 1.0
    window: int = 6
    seed: int = 1
    round_seconds: float = 1.5
    liars: int = 8

    @property
    def population_epsilon(self) -> float:
        """Each device's ε per window over the seven mechanisms."""
        return self.epsilon * len(MECHANISMS)


def add_parser(commands: Any) -> None:
    """Register ``privstream demo-ldp``."""
    p = commands.add_parser(
        "demo-ldp",
        help="real local DP end to end: embedded broker, the seven LDP-IDS mechanisms as the "
        "ldp-reports server stage, round clock, HTTP gateway and simulated devices over HTTP; "
        "table, refusals by reason and plot",
    )
    d = DemoParams()
    p.add_argument("--out", default="demo-ldp-out", help="directory for the outputs and logs")
    p.add_argument("--users", type=int, default=d.users, help="simulated devices")
    p.add_argument("--slots", type=int, default=d.slots, help="slots to release")
    p.add_argument("--epsilon", type=float, default=d.epsilon, help="each mechanism's ε")
    p.add_argument("--window", type=int, default=d.window, help="the window w in slots")
    p.add_argument("--seed", type=int, default=d.seed, help="the synthetic data's seed")
    p.add_argument("--round-seconds", type=float, default=d.round_seconds,
                   help="the devices' time to answer a request")  # fmt: skip
    p.add_argument("--liars", type=int, default=d.liars,
                   help="devices that lie, one way each (8: every kind of lie once)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """``privstream demo-ldp``."""
    params = DemoParams(args.users, args.slots, args.epsilon, args.window, args.seed,
                        args.round_seconds, args.liars)  # fmt: skip
    if min(params.users, params.slots, params.window) < 1 or not 0 <= params.liars < params.users:
        raise ValueError("--users, --slots and --window must be >= 1, --liars in [0, --users)")
    if not (params.epsilon > 0 and params.round_seconds > 0):
        raise ValueError("--epsilon and --round-seconds must be > 0")
    try:
        return run_demo_ldp(Path(args.out), params)
    except (DemoFailed, TimeoutError, subprocess.TimeoutExpired) as exc:
        print(f"privstream demo-ldp: error: {exc}", file=sys.stderr)
        return 1


class DemoFailed(RuntimeError):
    """A piece of the demo failed (the message names its log)."""


class Processes:
    """The demo's child processes (``privstream`` commands), each logging to ``LOGS/NAME.log``;
    on exit every one still running is stopped (SIGINT, then SIGKILL)."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        logs.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *_exc: object) -> None:
        for name in list(self.running):
            self.stop(name)

    def start(self, name: str, args: Sequence[str], env: dict[str, str]) -> None:
        with (self.logs / f"{name}.log").open("wb") as log:
            self.running[name] = subprocess.Popen(
                [sys.executable, "-m", "privstream.cli", *args], env=env,
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def stop(self, name: str, signum: int = signal.SIGINT, timeout: float = 30.0) -> None:
        from privstream.connectors.broker import stop_process

        process = self.running.pop(name, None)
        if process is not None:
            stop_process(process, signum, timeout)

    def wait(self, name: str, timeout: float) -> int:
        """Wait for ``name`` to exit by itself; its exit status."""
        code = self.running[name].wait(timeout)
        del self.running[name]
        return code

    def check(self, finishing: str = "server") -> None:
        """Refuse to go on once a child failed, or stopped before its time (all but
        ``finishing``, which stops by itself once done); its log names why."""
        for name, process in self.running.items():
            code = process.poll()
            if code is not None and (code != 0 or name != finishing):
                raise DemoFailed(f"the {name} process stopped (exit {code}); see "
                                 f"{self.logs / name}.log")  # fmt: skip


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child: no ``PRIVSTREAM_`` variable but ``extra`` (each process
    gets only the key it needs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVSTREAM_")}
    return env | extra


def _create_topics(settings: Any) -> None:
    from privstream.connectors.kafka import RELEASE_TOPIC_CONFIG, TopicSpec, create_topics

    compacted = {"releases", "ledger"}  # like every release topic
    specs = [TopicSpec(name, config=RELEASE_TOPIC_CONFIG) if key in compacted else TopicSpec(name)
             for key, name in TOPICS.items()]  # fmt: skip
    created = create_topics(settings, specs)
    say(f"[2/6] topics: {', '.join(created)}")


def write_flow(out_dir: Path, bootstrap: str, p: DemoParams) -> Path:
    """The server stage's flow file (one stream, seven mechanisms, equal split)."""
    flow = out_dir / "flow.toml"
    flow.write_text(FLOW.format(bootstrap=bootstrap, users=p.users, epsilon=p.epsilon,
                                population_epsilon=p.population_epsilon, window=p.window,
                                stream=STREAM, mechanisms=json.dumps(list(MECHANISMS)),
                                **TOPICS))  # fmt: skip
    return flow


def _start_server(procs: Processes, flow: Path, p: DemoParams, secret: str) -> None:
    """Start the server stage with the noise secret (it starts up while the rest does)."""
    from privstream.flows.secret import ENV_SECRET

    procs.start("server", ["run", "--config", str(flow), "--slots", str(p.slots)],
                child_env(**{ENV_SECRET: secret}))  # fmt: skip
    say(f"[3/6] server stage: {', '.join(MECHANISMS)} (ε = {p.epsilon:g} each, w = "
        f"{p.window}), flow file {flow}")  # fmt: skip


def _start_devices(procs: Processes, bootstrap: str, p: DemoParams) -> str:
    """Start the gateway (rate limit: what the server stage's own allows) and the simulated
    devices polling it; the gateway's URL once it answers."""
    from privstream.connectors.broker import free_port, wait_until_ready
    from privstream.operators.report_book import ROUNDS_PER_SLOT

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    limit = ROUNDS_PER_SLOT * len(MECHANISMS) * p.window
    procs.start("gateway", [
        "gateway", "--bootstrap", bootstrap, "--request-topic", TOPICS["requests"],
        "--report-topic", TOPICS["reports"], "--port", str(port),
        "--rate-window", str(p.window), "--rate-limit", str(limit),
    ], child_env())  # fmt: skip
    if not wait_until_ready(procs.running["gateway"], lambda: _health(url) is not None, 60):
        procs.check()
        raise DemoFailed("the gateway did not answer within 60 s")
    procs.start("devices", [
        "devices", "--gateway", url, "--dataset", STREAM, "--users", str(p.users),
        "--slots", str(p.slots), "--seed", str(p.seed), "--epsilon", str(p.population_epsilon),
        "--window", str(p.window), "--liars", str(p.liars), "--idle-seconds", "600",
        "--poll-seconds", "0.1",
    ], child_env())  # fmt: skip
    say(f"[4/6] gateway on {url}; {p.users:,} simulated devices ({p.liars} lying) poll it")
    return url


def _health(url: str) -> dict[str, Any] | None:
    """The gateway's ``/healthz`` answer, or None."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as answer:
            found = json.load(answer)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _start_clock(procs: Processes, flow: Path, p: DemoParams, secret: str) -> None:
    """Start the round clock with its clock key only; its first markers open the slots."""
    from privstream.flows.secret import ENV_CLOCK_KEY
    from privstream.mechanisms.seeding import NoiseKey

    clock_key = NoiseKey.from_text(secret).clock_key().hex()
    procs.start("clock", [
        "clock", "--config", str(flow), "--now", "--through", str(p.slots),
        "--round-seconds", str(p.round_seconds), "--idle-seconds", "600",
    ], child_env(**{ENV_CLOCK_KEY: clock_key}))  # fmt: skip
    say(f"[5/6] round clock: slots 1..{p.slots} open, rounds of {p.round_seconds:g} s")


def follow_releases(settings: Any, procs: Processes, p: DemoParams) -> list[bytes]:
    """Read the release topic until every mechanism released every slot, a progress line per
    slot all seven released; the releases' values."""
    from privstream.connectors.kafka import wait_for_messages

    started, done = time.monotonic(), [0]

    def complete(got: list[Any]) -> bool:
        procs.check()
        slots = Counter(json.loads(m.value())["slot"] for m in _unique(got))
        while slots[done[0] + 1] >= len(MECHANISMS):
            done[0] += 1
            say(f"[5/6] slot {done[0]}/{p.slots} released by all {len(MECHANISMS)} mechanisms "
                f"({time.monotonic() - started:.1f} s)")  # fmt: skip
        return done[0] >= p.slots

    timeout = 120 + p.slots * (20 + 4 * p.round_seconds)
    return [m.value() for m in _unique(wait_for_messages(settings, TOPICS["releases"], complete,
                                                         timeout))]  # fmt: skip


def _unique(messages: Sequence[Any]) -> list[Any]:
    """One message per key (a replayed release is byte-identical)."""
    return list({m.key(): m for m in messages}.values())


def read_topics(settings: Any, topics: Sequence[str]) -> dict[str, list[Any]]:
    """Every message of ``topics`` by topic (read until they are quiet for a second)."""
    from privstream.connectors.kafka import read_until_idle

    found: dict[str, list[Any]] = {topic: [] for topic in topics}
    for batch in read_until_idle(settings, topics, 1.0):
        for message in batch:
            found[message.topic()].append(message)
    return found


def _finish(settings: Any, procs: Processes, url: str) -> dict[str, Any]:
    """Wait for the server, take the gateway's counts, stop the rest; the requests, dead
    letters by reason and the devices' own counts."""
    from privstream.connectors.kafka import DEAD_LETTER_REASON_HEADER

    if procs.wait("server", 120) != 0:
        raise DemoFailed(f"the server stage failed; see {procs.logs / 'server.log'}")
    gateway = (_health(url) or {}).get("counts", {})
    procs.stop("clock", signal.SIGTERM)  # done: it has closed the last round
    for name in ("devices", "gateway"):
        procs.stop(name)  # SIGINT: each prints its counts
    found = read_topics(settings, [TOPICS["requests"], TOPICS["dead_letters"]])
    requests = {json.loads(m.value())["id"]: json.loads(m.value())
                for m in found[TOPICS["requests"]]}  # fmt: skip
    dead = Counter(dict(m.headers() or [])[DEAD_LETTER_REASON_HEADER].decode()
                   for m in found[TOPICS["dead_letters"]])  # fmt: skip
    devices = (procs.logs / "devices.log").read_text().strip().splitlines()
    return {"requests": list(requests.values()), "gateway": gateway, "dead_letters": dict(dead),
            "devices": devices}  # fmt: skip


def truth_histograms(p: DemoParams) -> np.ndarray:
    """The true per-slot histogram of the devices' data (slot t in row t − 1), as the
    simulated devices hold it (``privstream devices --dataset sin --seed``)."""
    from privstream.connectors.datasets import synthetic_dataset

    source = synthetic_dataset(STREAM, p.users, p.slots, p.seed)
    return np.array([np.bincount(source.values(t).astype(int), minlength=source.d) / p.users
                     for t in range(1, p.slots + 1)])  # fmt: skip


def score(
    releases: dict[str, list[dict[str, Any]]],
    truth: np.ndarray,
    requests: Sequence[dict[str, Any]],
    users: int,
) -> dict[str, dict[str, float]]:
    """Per mechanism: MAE and MRE of its releases against ``truth`` (spec ldp-ids §5.3), the
    requests it published, the reports it accepted (those its releases used) and its
    publications."""
    from privstream.experiments import scores as utility

    asked = Counter(r["purpose"].split(".")[0] for r in requests)
    table: dict[str, dict[str, float]] = {}
    for name in MECHANISMS:
        rels = releases.get(name, [])
        if [r["slot"] for r in rels] != list(range(1, len(truth) + 1)):
            raise RuntimeError(f"{name}: expected slots 1..{len(truth)}, read {len(rels)}")
        estimates = np.array([r["estimate"] for r in rels])
        table[name] = {
            "mae": utility.mae(estimates, truth),
            "mre": utility.mre(estimates, truth, 1 / users),
            "requests": asked[name],
            "reports": sum(r["details"]["users_m1"] + r["details"]["users_m2"] for r in rels),
            "publications": sum(r["strategy"] == "publish" for r in rels),
        }
    return table


def format_report(result: dict[str, Any]) -> str:
    """The table per mechanism, then the refusals at the gateway and the server by reason."""
    p = result["params"]
    rows = [("mechanism", "MAE", "MRE", "requests", "reports accepted", "published")]
    rows += [(name, f"{r['mae']:.4f}", f"{r['mre']:.4f}", str(r["requests"]), f"{r['reports']:,}",
              f"{r['publications']}/{p['slots']}") for name, r in result["results"].items()]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in
                                                    zip(row[1:], widths[1:], strict=True))])
             for row in rows]  # fmt: skip
    rule = "-" * len(lines[0])
    gateway = dict(result["gateway"])
    accepted = gateway.pop("accepted", 0)
    return "\n".join([
        f"n={p['users']:,} devices ({p['liars']} lying), T={p['slots']}, w={p['window']}, "
        f"ε={p['epsilon']:g} per mechanism (devices: {p['population_epsilon']:g} per window), "
        f"rounds of {p['round_seconds']:g} s, {result['seconds']:.0f} s in all",
        rule, lines[0], rule, *lines[1:], rule,
        f"gateway: accepted {accepted:,} reports; refused (never on the report topic): "
        f"{_reasons(gateway)}",
        f"server stage dead letters (report topic): {_reasons(result['dead_letters'])}",
        *(f"devices: {line}" for line in result["devices"]
          if line.startswith(("refused by the device ledger", "lies sent"))),
        f"each mechanism had ε = {p['epsilon']:g} per window, a 1/7 share of what each "
        f"device's own ledger admits ({p['population_epsilon']:g}): a comparison on the same "
        "devices; a deployment serves one mechanism or splits its ε",
    ])  # fmt: skip


def _reasons(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items())) or "none"


def save_outputs(out_dir: Path, result: dict[str, Any], text: str, truth: np.ndarray,
                 releases: dict[str, list[dict[str, Any]]], requests: Sequence[Any]) -> Path:  # fmt: skip
    """Write the table, results, releases, requests (JSON lines) and the plot of value 1's
    true frequency against each mechanism's releases; the plot's path."""
    from privstream.experiments import plots

    (out_dir / "table.txt").write_text(text + "\n")
    (out_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    for name, rows in (("releases", [r for rs in releases.values() for r in rs]),
                       ("requests", requests)):  # fmt: skip
        (out_dir / f"{name}.jsonl").write_text(
            "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))  # fmt: skip
    p = result["params"]
    return plots.plot_releases(
        truth[:, 1],
        {name: np.array([r["estimate"][1] for r in releases[name]]) for name in MECHANISMS},
        out_dir / f"{STREAM}.png",
        title=f"ldp-reports: Sin, n={p['users']:,} devices over HTTP, ε={p['epsilon']:g} each, "
        f"w={p['window']}: true frequency of value 1 vs releases",
    )


def run_demo_ldp(out_dir: Path, p: DemoParams) -> int:
    """Run the demo (steps 1 to 6 of the module docstring); its outputs in ``out_dir``.
    Without the ``demo`` extra it refuses before starting anything (``MissingExtra``)."""
    from privstream.cli.demo import group_releases
    from privstream.connectors.broker import EmbeddedBroker
    from privstream.connectors.kafka import KafkaSettings
    from privstream.extras import DEMO_MODULES, require
    from privstream.flows.secret import ENV_SECRET

    require("demo", (*DEMO_MODULES, "aiohttp"), "privstream demo-ldp")
    out_dir.mkdir(parents=True, exist_ok=True)
    say(f"privstream demo-ldp: {', '.join(MECHANISMS)} in ldp-reports mode, {p.users:,} "
        f"simulated devices over HTTP, T={p.slots}, ε={p.epsilon:g} each, w={p.window}")  # fmt: skip
    started = time.perf_counter()
    secret = os.environ.get(ENV_SECRET) or secrets.token_hex(32)  # never stored
    with EmbeddedBroker(log_path=out_dir / "broker.log") as broker, \
            Processes(out_dir / "logs") as procs:  # fmt: skip
        settings = KafkaSettings((broker.bootstrap,))
        say(f"[1/6] embedded broker (Tansu) on {broker.bootstrap}")
        _create_topics(settings)
        flow = write_flow(out_dir, broker.bootstrap, p)
        _start_server(procs, flow, p, secret)
        url = _start_devices(procs, broker.bootstrap, p)
        _start_clock(procs, flow, p, secret)
        lines = follow_releases(settings, procs, p)
        say("[6/6] reading back the requests and dead letters; stopping the processes")
        outcome = _finish(settings, procs, url)
    releases = group_releases(lines)
    truth = truth_histograms(p)
    result = {
        "params": {**asdict(p), "population_epsilon": p.population_epsilon,
                   "mechanisms": list(MECHANISMS), "transport": "http gateway + kafka (Tansu)"},
        "results": score(releases, truth, outcome["requests"], p.users),
        "seconds": time.perf_counter() - started,
        **{k: outcome[k] for k in ("gateway", "dead_letters", "devices")},
    }  # fmt: skip
    text = format_report(result)
    print(text)
    plot = save_outputs(out_dir, result, text, truth, releases, outcome["requests"])
    say(f"outputs in {out_dir}/: table.txt, results.json, releases.jsonl, requests.jsonl, "
        f"flow.toml, {plot.name}, logs/")  # fmt: skip
    return 0
