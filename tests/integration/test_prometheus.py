"""A real Prometheus scrapes a running Kafka flow; PromQL must agree with what the flow published
(design §7, §9, §10 item 6).

A synthetic Sin stream goes to Kafka, ``privstream run ldp-ids`` runs three mechanisms over it,
splitting ε equally, without ``--slots`` (so it keeps running like a production flow), and
Prometheus scrapes its
``/metrics`` every second, and its internal endpoint (``--internal-metrics-port``, loopback).
Once every release is on the output topic, the privacy spend and the publication counters are
checked through Prometheus's query API against the releases and ledger entries read back from
Kafka, the true event count is found on the internal endpoint only; then SIGTERM must stop the
flow with exit code 0.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from privstream.connectors.broker import free_port
from privstream.connectors.kafka import KafkaSettings
from privstream.mechanisms.ledger import budget_limit

from .conftest import PRIVSTREAM, Topics, cli_env, run_cli
from .prometheus import FlowProcess, PrometheusServer, read_keyed

USERS, SLOTS, EPSILON, WINDOW = 5000, 60, 1.0, 20
SHARE = EPSILON / 3  # each mechanism's ε under --budget-split equal
DATA_SEED, NOISE_SECRET = 7, "590cf64da29fd26398fc4f386277c1379c5a91481a959de3d86159b217a6b507"
MECHANISMS = ("LBU", "LPA", "LBA")
STREAM = "sin"
COUNTERS = {
    "publish": "privstream_publications_total",
    "approximate": "privstream_approximations_total",
    "nullified": "privstream_nullified_total",
}
JOB = '{job="privstream"}'


def check_internal_split(prom: PrometheusServer, internal: str) -> None:
    """The true event count is scraped from the internal endpoint, and no internal series (nor
    one of its old public names) comes from any other instance."""
    query = f'privstream_internal_events_total{{job="privstream",stream="{STREAM}"}}'

    def counted() -> bool:
        return [s.value for s in prom.query(query)] == [float(USERS * SLOTS)]

    prom.wait_until(counted, "the event count on the internal endpoint", 30)
    assert [s.labels["instance"] for s in prom.query(query)] == [internal]
    internal_series = prom.query('count by (instance) ({__name__=~"privstream_internal_.+"})')
    assert [s.labels["instance"] for s in internal_series] == [internal]
    old = "privstream_(events|events_rejected|late_events)_total|privstream_step_seconds_.+"
    assert prom.query(f'{{__name__=~"{old}"}}') == []


def test_promql_matches_the_releases_and_the_spend_stays_within_epsilon(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path
) -> None:
    run_cli(
        "produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--dataset", STREAM,
        "--users", str(USERS), "--slots", str(SLOTS), "--seed", str(DATA_SEED), "--no-progress",
    )  # fmt: skip
    metrics_port, internal_port = free_port(), free_port()
    flow_command = [
        *PRIVSTREAM, "run", "ldp-ids", "--dataset", STREAM, "--mechanism", ",".join(MECHANISMS),
        "--users", str(USERS), "--epsilon", str(EPSILON), "--window", str(WINDOW),
        "--no-progress", "--internal-metrics-port", str(internal_port),
        "--budget-split", "equal", *topics.run_flags(kafka),
    ]  # fmt: skip
    targets = [f"127.0.0.1:{metrics_port}", f"127.0.0.1:{internal_port}"]
    expected = {f"{STREAM}/{m}/{t}" for m in MECHANISMS for t in range(1, SLOTS + 1)}

    with (
        PrometheusServer(targets, tmp_path / "prometheus") as prom,
        FlowProcess(
            flow_command, metrics_port, tmp_path, cli_env(PRIVSTREAM_SECRET=NOISE_SECRET)
        ) as flow,
    ):
        releases = read_keyed(kafka, topics.releases, expected, flow)
        ledger = read_keyed(kafka, topics.ledger, expected, flow)
        assert releases.keys() == expected and ledger.keys() == expected

        # What Kafka says: releases per mechanism by strategy.
        published: dict[str, Counter[str]] = {m: Counter() for m in MECHANISMS}
        for release in releases.values():
            published[release["mechanism"]][release["strategy"]] += 1
        for mechanism, counts in published.items():
            assert set(counts) <= COUNTERS.keys(), (mechanism, counts)
            assert counts.total() == SLOTS
        # The adaptive mechanisms skip fresh publications on this slowly changing stream, so the
        # three counters differ and the comparison below can tell them apart.
        for mechanism in ("LPA", "LBA"):
            assert published[mechanism]["publish"] < SLOTS, published[mechanism]
            assert published[mechanism]["approximate"] > 0, published[mechanism]
        assert published["LBU"] == Counter(publish=SLOTS)

        # The ledger's own account at every slot (Prometheus samples only every second).
        for entry in ledger.values():
            assert entry["guarantee"]["epsilon"] == SHARE, entry
            (one,) = entry["classes"]  # every user shares (w, ε): one class
            assert one["budget"] == SHARE, entry
            if entry["division"] == "budget":
                assert 0 < one["spent"] <= budget_limit(SHARE), entry
            else:
                assert 0 <= entry["details"]["window_users"] <= USERS, entry
            # composed over the three mechanisms, no user spent more than the population's ε
            assert entry["population_budget"] == EPSILON, entry
            assert 0 < entry["population_spent"] <= budget_limit(EPSILON), entry

        def counters(strategy: str) -> dict[str, float]:
            return prom.by_mechanism(COUNTERS[strategy] + JOB)

        def final_state_scraped() -> bool:
            last = prom.by_mechanism("privstream_last_released_slot" + JOB)
            if last != dict.fromkeys(MECHANISMS, float(SLOTS)):
                return False
            return all(
                counters(s) == {m: float(published[m][s]) for m in MECHANISMS} for s in COUNTERS
            )

        prom.wait_until(final_state_scraped, f"slot {SLOTS} and the final counters", 30)

        # Privacy spend: at every scraped instant, no user spent more than a mechanism's share
        # of ε in any window, nor more than ε over all of them.
        epsilon = prom.by_mechanism("privstream_budget" + JOB)
        assert epsilon == dict.fromkeys(MECHANISMS, SHARE)
        peak = prom.by_mechanism(f"max_over_time(privstream_scope_budget_spent{JOB}[10m])")
        assert peak.keys() == set(MECHANISMS), peak
        for mechanism, spent in peak.items():
            assert 0 < spent <= epsilon[mechanism], (mechanism, spent)
        over = prom.query(
            f"max_over_time(privstream_scope_budget_spent{JOB}[10m])"
            f" > on(stream, mechanism) privstream_budget{JOB}"
        )
        assert over == [], over
        remaining = prom.by_mechanism("min_over_time(privstream_scope_budget_remaining[10m])")
        assert all(0 <= r <= SHARE for r in remaining.values()), remaining
        population = f'{{job="privstream",stream="{STREAM}"}}'
        assert [s.value for s in prom.query("privstream_population_budget" + population)] == [
            EPSILON
        ]
        assert [s.value for s in prom.query("privstream_population_mechanisms" + population)] == [
            3.0
        ]
        composed = prom.query(f"max_over_time(privstream_population_budget_spent{population}[10m])")
        assert len(composed) == 1 and 0 < composed[0].value <= budget_limit(EPSILON), composed
        over = prom.query(
            f"max_over_time(privstream_population_budget_spent{population}[10m])"
            f" > on(stream) privstream_population_budget{population}"
        )
        assert over == [], over
        # a production run: a real secret, and a split budget rather than an evaluation
        assert [s.value for s in prom.query("privstream_insecure_seed" + JOB)] == [0.0]
        assert [s.value for s in prom.query("privstream_evaluation" + JOB)] == [0.0]

        # No refused charge, no halted mechanism, ever.
        violations = prom.by_mechanism("privstream_privacy_violations_total" + JOB)
        assert violations == dict.fromkeys(MECHANISMS, 0.0)
        halted = prom.by_mechanism(f"max_over_time(privstream_halted{JOB}[10m])")
        assert halted == dict.fromkeys(MECHANISMS, 0.0)

        # Publication counters equal the releases on Kafka, by strategy.
        for strategy in COUNTERS:
            assert counters(strategy) == {m: float(published[m][strategy]) for m in MECHANISMS}
        total = prom.by_mechanism(
            "sum by (mechanism) (privstream_publications_total + privstream_approximations_total"
            " + privstream_nullified_total)"
        )
        assert total == dict.fromkeys(MECHANISMS, float(SLOTS))
        last = prom.by_mechanism("privstream_last_released_slot" + JOB)
        assert last == dict.fromkeys(MECHANISMS, float(SLOTS))
        up = prom.query(f'up{{job="privstream",instance="127.0.0.1:{metrics_port}"}}')
        assert [s.value for s in up] == [1.0]
        check_internal_split(prom, targets[1])

        assert flow.terminate() == 0, flow.output()[1][-3000:]
        assert "received SIGTERM" in flow.output()[1]
