"""Flow files with the worked example's external measure and division
(``tests/extension/site``) against the embedded Kafka broker, then ``privstream audit`` of
their topics: ``renyi`` (``example-measure``: Rényi DP at α = 8 with its own charge and ledger)
and ``cohorts`` (``example-division``: k public cohorts charged round-robin, audited by the
division's own recomputation).

Every slot is released once, each estimate within 4 standard deviations of the truth
(``(p(1−p) + σ²)/n``, ``example_measure.variance``); every ledger entry states its spend in
ε(α) (sliding over the window: ``min(t, w)·ε/w``), and the audit passes at the (ε, δ) the
measure's own conversion gives (ε + ln(1/δ)/(α−1)) and fails just below it.
"""

from __future__ import annotations

import importlib
import json
import math
import uuid
from pathlib import Path
from typing import Any

from privstream.cli import main
from privstream.connectors.datasets import synthetic_dataset
from privstream.connectors.kafka import KafkaSettings
from tests.extension.conftest import external_site  # noqa: F401  (the fixture)

from .conftest import read_all
from .extension_flows import produce, released_once, run_flow, tagged_flow

USERS, SLOTS, LAST, EPS, WINDOW = 2000, 10, 8, 5.0, 5


STREAM = {"name": "renyi", "family": "example-measure", "mechanisms": ["RGM"], "domain": 2,
          "share": 1.0}  # fmt: skip


def _flow(directory: Path, kafka: KafkaSettings, events: str, tag: str,
          stream: dict[str, Any] = STREAM) -> Path:  # fmt: skip
    population = {"users": USERS, "epsilon": EPS, "window": WINDOW}
    return tagged_flow(directory, kafka, events, tag, population=population, streams=[stream])


def _produce(kafka: KafkaSettings, stream: str) -> str:
    return produce(kafka, "sin", (stream,), USERS, SLOTS)


SEED = ("--insecure-seed", "19")
"""Public reproducible noise: the tolerances below hold for these draws every run (a secret
run without a store draws a fresh incarnation each time)."""


def _run(flow: Path) -> None:
    run_flow(flow, "--slots", str(LAST), *SEED)


def _released(kafka: KafkaSettings, tag: str) -> tuple[dict[int, Any], list[dict[str, Any]]]:
    by_slot = {r["slot"]: r for r in released_once(kafka, f"releases-{tag}")}
    last = max(by_slot)  # --slots stops once slot LAST is released (a later one may be too)
    assert last >= LAST and sorted(by_slot) == list(range(1, last + 1))
    return by_slot, [json.loads(m.value()) for m in read_all(kafka, f"ledger-{tag}")]


def test_an_external_measure_runs_from_a_flow_file_and_audits(
    kafka: KafkaSettings,
    tmp_path: Path,
    external_site: dict[str, str],  # noqa: F811
) -> None:
    tag = uuid.uuid4().hex[:8]
    flow = _flow(tmp_path, kafka, _produce(kafka, "renyi"), tag)
    _run(flow)
    by_slot, ledger = _released(kafka, tag)
    last = max(by_slot)
    site = importlib.import_module("example_measure")
    config = site.RgmConfig(EPS, WINDOW, USERS)
    data = synthetic_dataset("sin", USERS, SLOTS, 1)
    for t, release in by_slot.items():
        p = float(data.truth(t)[1])
        assert abs(release["estimate"][1] - p) <= 4 * math.sqrt(site.variance(config, p)), t
        assert release["guarantee"]["unit"] == "ε(α)"
    spent = {e["slot"]: e["classes"][0]["spent"] for e in ledger if e["kind"] == "ledger"}
    assert spent == {t: min(t, WINDOW) * EPS / WINDOW for t in range(1, last + 1)}
    at_delta = EPS + math.log(1e5) / (site.ALPHA - 1)
    argv = ["audit", "--allow-insecure-seed", "--bootstrap", kafka.bootstrap, "--release-topic", f"releases-{tag}",
            "--ledger-topic", f"ledger-{tag}", "--population", str(USERS), "--expect-slots",
            str(last), "--max-delta", "1e-5", "--no-progress"]  # fmt: skip
    assert main([*argv, "--max-epsilon", f"{at_delta * 1.001}"]) == 0
    assert main([*argv, "--max-epsilon", f"{at_delta * 0.999}"]) != 0


COHORTS = {"name": "cohorts", "family": "example-division", "mechanisms": ["COH"],
           "domain": 2, "cohorts": 3, "share": 1.0}  # fmt: skip


def test_an_external_division_runs_from_a_flow_file_and_audits(
    kafka: KafkaSettings,
    tmp_path: Path,
    external_site: dict[str, str],  # noqa: F811
) -> None:
    """k = 3 cohorts over w = 5: ε_s = ε/⌈5/3⌉ = ε/2; each release within 4 sd of the truth
    (the cohort's responses and its sampling), each entry's spend the most-charged cohort's,
    and the audit recomputes it from the topic."""
    tag = uuid.uuid4().hex[:8]
    flow = _flow(tmp_path, kafka, _produce(kafka, "cohorts"), tag, COHORTS)
    _run(flow)
    by_slot, ledger = _released(kafka, tag)
    site = importlib.import_module("example_division")
    data, m, eps_s = synthetic_dataset("sin", USERS, SLOTS, 1), USERS // 3, EPS / 2
    for t, release in by_slot.items():
        p = float(data.truth(t)[1])
        var = site.variance(eps_s, m) + p * (1 - p) * (1 - m / USERS) / m
        assert abs(release["estimate"][1] - p) <= 4 * math.sqrt(var), t
        assert release["details"]["cohort"] == (t - 1) % 3
    entries = {e["slot"]: e for e in ledger if e["kind"] == "ledger"}
    assert {t: e["division"] for t, e in entries.items()} == dict.fromkeys(by_slot, "cohort")
    # a cohort is charged at slots c+1, c+4, …: twice within a window of 5 from slot 4 on
    assert {t: e["classes"][0]["spent"] for t, e in entries.items()} == {
        t: eps_s * (2 if t >= 4 else 1) for t in by_slot
    }
    argv = ["audit", "--allow-insecure-seed", "--bootstrap", kafka.bootstrap, "--release-topic", f"releases-{tag}",
            "--ledger-topic", f"ledger-{tag}", "--population", str(USERS), "--expect-slots",
            str(max(by_slot)), "--max-epsilon", str(EPS), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
