"""The main job (``make demo``): all seven LDP-IDS mechanisms on the Sin stream, through the flow.

Runs the Bytewax dataflow over the synthetic Sin population (n = 200,000, T = 800, ε = 1,
w = 20 by default), reads the releases back from the JSON-lines output, scores them against the
true stream (spec ldp-ids §5.3) and saves a plot of the true value-1 frequency against every
mechanism's releases.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from privstream import experiments
from privstream.connectors.synthetic import SyntheticStream
from privstream.flows.ldp_ids import build
from privstream.mechanisms.ldp_ids import MECHANISMS


def read_releases(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Releases per mechanism, ordered by slot, from a JSON-lines file."""
    by_mechanism: dict[str, list[dict[str, Any]]] = {}
    with path.open() as f:
        for line in f:
            release = json.loads(line)
            by_mechanism.setdefault(release["mechanism"], []).append(release)
    for releases in by_mechanism.values():
        releases.sort(key=lambda r: r["slot"])
    return by_mechanism


def score(
    stream: SyntheticStream, releases: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, float]]:
    """MRE, MAE, bits per user and publications of each mechanism's releases."""
    truth = np.array([stream.truth(t) for t in range(1, stream.slots + 1)])
    table: dict[str, dict[str, float]] = {}
    for name, rels in releases.items():
        if len(rels) != stream.slots:
            raise RuntimeError(f"{name}: expected {stream.slots} releases, read {len(rels)}")
        estimates = np.array([r["estimate"] for r in rels])
        table[name] = {
            "mre": experiments.mre(estimates, truth, 1 / stream.users),
            "mae": experiments.mae(estimates, truth),
            "bits_per_user": experiments.bits_per_user(
                sum(r["bits"] for r in rels), stream.users, stream.slots
            ),
            "publications": float(sum(r["strategy"] == "publish" for r in rels)),
        }
    return table


def run_demo(
    out_dir: Path,
    users: int,
    slots: int,
    epsilon: float,
    window: int,
    seed: int,
    run_flow: Callable[[Any, int, str | None], None],
    progress_bar: Callable[[int | None, str], Any],
) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    releases_path, ledger_path = out_dir / "releases.jsonl", out_dir / "ledger.jsonl"
    names = list(MECHANISMS)
    print(
        f"privstream demo: {', '.join(names)} on Sin, n={users}, T={slots}, ε={epsilon}, w={window}",
        file=sys.stderr,
    )
    bar = progress_bar(slots * len(names), "release")
    flow = build(
        dataset="sin", mechanisms=names, users=users, slots=slots, epsilon=epsilon, window=window,
        seed=seed, out=str(releases_path), ledger_out=str(ledger_path), progress=lambda _r: bar.update(1),
    )  # fmt: skip
    started = time.perf_counter()
    run_flow(flow, 1, None)
    bar.close()
    seconds = time.perf_counter() - started

    stream = SyntheticStream("sin", users, slots, seed=seed)
    releases = read_releases(releases_path)
    table = score(stream, releases)
    result = {
        "params": {
            "dataset": "sin",
            "users": users,
            "slots": slots,
            "epsilon": epsilon,
            "window": window,
            "seed": seed,
        },
        "results": {name: {**table[name], "seconds": seconds} for name in names},
    }
    text = experiments.format_table(result)
    print(text)
    print("seconds: wall time of the one flow that ran all seven mechanisms side by side")
    (out_dir / "table.txt").write_text(text + "\n")
    (out_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    plot = out_dir / "sin.png"
    experiments.plot_releases(
        np.array([stream.truth(t)[1] for t in range(1, slots + 1)]),
        {name: np.array([r["estimate"][1] for r in releases[name]]) for name in names},
        plot,
        title=f"Sin stream, n={users}, ε={epsilon}, w={window}: true frequency of value 1 vs releases",
    )
    print(
        f"flow time {seconds:.1f} s; releases {releases_path}, ledger {ledger_path}, plot {plot}",
        file=sys.stderr,
    )
    return 0
