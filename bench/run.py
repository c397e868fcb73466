"""`make bench`: LDP-IDS reproduction and performance benchmarks (see bench/README.md).

1. Reproduction (spec ldp-ids §5.4 defaults): the seven mechanisms on Sin, n = 200,000,
   T = 800, ε = 1, w = 20, one seed — table and wall time; then Table 2 bits per user on Sin and
   Log (5 seeds) against the paper (spec §5.5.1), with MRE beside the spec author's
   cross-check (§5.5.2).
2. Performance (design §8), ratios measured in this run: the aggregate fast path against the
   per-user path of the simulated clients (LBU and LPA on Sin, n = 200,000), and warm LPA
   slots on a 1,000,000-user, d = 100 categorical population.
3. Kafka read throughput (design §8): the LDP-IDS flow on one worker against a plain
   confluent-kafka consumer, same embedded broker, topic and messages (``privstream bench
   kafka``), 2,000,100 messages, five runs of each.
4. Personalized w-event reproduction (spec personalized-w-event §6): BD, BA, PBD and PBA on
   TLNS, Sin and Log at the defaults (n = T = 10,000, ε = 0.6, w = 120, 3 seeds), AMRE and the
   reductions PBD vs BD and PBA vs BA beside the paper's 68% and 24.9%.

5. Hardened randomness (design §6): the keyed AES-CTR stream against PCG64 for the client
   draws of 10⁶ users, the exact discrete Laplace against float Laplace per draw, and one PBD
   slot over 10⁶ users (``privstream bench noise``).

Writes everything to bench/results/latest.json (override with --out) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from privstream import harness
from privstream.bench_kafka import bench_kafka, format_result
from privstream.bench_noise import bench_noise, format_noise
from privstream.mechanisms.client import ClientPath
from privstream.mechanisms.registry import LDP_IDS, PERSONALIZED
from privstream.mechanisms.tasks import FrequencyTask
from privstream.mechanisms.utility import Run, reductions
from privstream.paper_results import (
    MECHANISM_ORDER,
    PAPER_HEADLINES,
    PAPER_TABLE2_BITS,
    SPEC_CROSSCHECK_MRE,
)
from privstream.runner import run_dataflow

RESULTS = Path(__file__).resolve().parent / "results"
ALL = list(MECHANISM_ORDER)
PATHS: tuple[ClientPath, ...] = ("aggregate", "per-user")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_ldp_ids(name: str, source: harness.SlotSource, path: ClientPath) -> Run:
    """One LDP-IDS mechanism over ``source`` at ε = 1, w = 20, seed 1."""
    return harness.run_lockstep(LDP_IDS, [name], source, 1.0, 20, 1, path=path)[name]


# --- 1. reproduction ------------------------------------------------------------------------


def default_run(users: int, slots: int, progress: bool) -> dict[str, Any]:
    started = time.perf_counter()
    result = harness.bench(LDP_IDS, "sin", users, slots, 1.0, 20, ALL, seeds=1, progress=progress)
    result["wall_seconds"] = time.perf_counter() - started
    return result


def table2(
    datasets: list[str], users: int, slots: int, seeds: int, progress: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dataset in datasets:
        started = time.perf_counter()
        result = harness.bench(
            LDP_IDS, dataset, users, slots, 1.0, 20, ALL, seeds=seeds, progress=progress
        )
        paper = PAPER_TABLE2_BITS[(1.0, 20, dataset)]
        crosscheck = SPEC_CROSSCHECK_MRE.get(dataset, {})
        rows = {}
        for name, r in result["results"].items():
            rows[name] = {
                **r,
                "paper_bits_per_user": paper[name],
                "bits_rel_dev": r["bits_per_user"] / paper[name] - 1,
                "spec_crosscheck_mre": crosscheck.get(name),
            }
        out[dataset] = {
            "params": result["params"],
            "results": rows,
            "wall_seconds": time.perf_counter() - started,
        }
    return out


def format_table2(t2: dict[str, Any]) -> str:
    lines = []
    for dataset, block in t2.items():
        p = block["params"]
        lines.append(
            f"Table 2, {dataset}: n={p['users']} T={p['slots']} ε={p['epsilon']} "
            f"w={p['window']}, mean of {p['seeds']} seeds ({block['wall_seconds']:.0f} s)"
        )
        head = f"{'mech':5} {'bits sim':>9} {'paper':>8} {'dev':>7}   {'MRE sim':>8} {'§5.5.2':>7}"
        lines += [head, "-" * len(head)]
        for name, r in block["results"].items():
            cc = r["spec_crosscheck_mre"]
            lines.append(
                f"{name:5} {r['bits_per_user']:9.4f} {r['paper_bits_per_user']:8.4f} "
                f"{100 * r['bits_rel_dev']:+6.2f}%   {r['mre']:8.4f} "
                f"{'' if cc is None else f'{cc:7.3f}'}"
            )
        lines.append("")
    return "\n".join(lines)


# --- 2. performance -------------------------------------------------------------------------


def path_ratio(name: str, users: int, slots: int) -> dict[str, Any]:
    """One mechanism over the first ``slots`` slots of Sin through both client paths."""
    stream = harness.load_dataset(LDP_IDS, "sin", users, slots, seed=1)
    timing: dict[str, dict[str, float]] = {}
    for path in PATHS:
        run = run_ldp_ids(name, stream, path)
        timing[path] = {
            "ms_per_slot": 1000 * run.seconds / slots,
            "publications": run.publications,
            "mre": run.mre(),
        }
    return {
        "mechanism": name,
        "dataset": "sin",
        "users": users,
        "slots": slots,
        **timing,
        "per_user_over_aggregate": timing["per-user"]["ms_per_slot"]
        / timing["aggregate"]["ms_per_slot"],
    }


@dataclass(frozen=True)
class ZipfStream:
    """A categorical population of ``users`` users over ``d`` values: each slot, values are
    drawn iid from a Zipf(s) law over the categories whose rank order rotates by one every
    ``period`` slots (so LPA sees real changes). A pure function of (seed, slot)."""

    users: int
    d: int
    slots: int
    seed: int = 1
    s: float = 1.1
    period: int = 10
    name: str = "zipf"
    task: FrequencyTask = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "task", FrequencyTask(self.d))

    def _probabilities(self, slot: int) -> NDArray[np.float64]:
        weights = 1.0 / np.arange(1, self.d + 1) ** self.s
        return np.roll(weights / weights.sum(), (slot - 1) // self.period)

    def _counts(self, rng: np.random.Generator, slot: int) -> NDArray[np.int64]:
        return rng.multinomial(self.users, self._probabilities(slot))

    def values(self, slot: int) -> NDArray[np.int64]:
        rng = np.random.default_rng([self.seed, slot])
        counts = self._counts(rng, slot)
        return rng.permutation(np.repeat(np.arange(self.d, dtype=np.int64), counts))

    def truth(self, slot: int) -> NDArray[np.float64]:
        """The histogram of ``values(slot)``: its counts are the slot generator's first draw."""
        return self._counts(np.random.default_rng([self.seed, slot]), slot) / self.users


def large_lpa(users: int, d: int, warm: int, measured: int) -> dict[str, Any]:
    """Warm LPA steps on a ``users``-user, ``d``-category population, both client paths."""
    stream = ZipfStream(users, d, warm + measured)
    out: dict[str, Any] = {"mechanism": "LPA", "users": users, "d": d, "warmup_slots": warm}
    out["oracle"] = stream.task.select(1.0).name
    for path in PATHS:
        log(f"  LPA n={users:,} d={d} {path}: {warm} warm-up + {measured} timed slots")
        run = run_ldp_ids("LPA", stream, path)
        ms = 1000 * run.slot_seconds[warm:]
        strategies = np.array(run.strategies[warm:])
        published = strategies == "publish"
        out[path] = {
            "timed_slots": measured,
            "ms_per_slot_mean": float(ms.mean()),
            "ms_per_slot_median": float(np.median(ms)),
            "ms_per_slot_max": float(ms.max()),
            "publications": int(published.sum()),
            "ms_publish_mean": float(ms[published].mean()) if published.any() else None,
            "ms_other_mean": float(ms[~published].mean()) if (~published).any() else None,
        }
    out["per_user_over_aggregate"] = (
        out["per-user"]["ms_per_slot_mean"] / out["aggregate"]["ms_per_slot_mean"]
    )
    return out


def format_perf(perf: dict[str, Any]) -> str:
    lines = ["Client paths (same mechanism and seed; ms per slot of the mechanism step):"]
    for r in perf["paths"]:
        lines.append(
            f"  {r['mechanism']} on {r['dataset']} n={r['users']:,}, {r['slots']} slots: "
            f"aggregate {r['aggregate']['ms_per_slot']:.2f} ms "
            f"({r['aggregate']['publications']:.0f} publications), "
            f"per-user {r['per-user']['ms_per_slot']:.2f} ms "
            f"({r['per-user']['publications']:.0f}), "
            f"ratio per-user/aggregate {r['per_user_over_aggregate']:.1f}×"
        )
    big = perf["large_lpa"]
    lines.append(
        f"LPA, n={big['users']:,}, d={big['d']} ({big['oracle']}), warm slots after "
        f"{big['warmup_slots']}:"
    )
    for path in PATHS:
        r = big[path]
        pub = "" if r["ms_publish_mean"] is None else f", publish slots {r['ms_publish_mean']:.1f}"
        lines.append(
            f"  {path:9}: mean {r['ms_per_slot_mean']:.1f} ms/slot (median "
            f"{r['ms_per_slot_median']:.1f}, max {r['ms_per_slot_max']:.1f}{pub}; "
            f"{r['publications']} publications in {r['timed_slots']} slots)"
        )
    lines.append(f"  ratio per-user/aggregate {big['per_user_over_aggregate']:.1f}×")
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    parser.add_argument("--seeds", type=int, default=5, help="seeds of the Table 2 comparison")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: small populations and few slots"
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--no-kafka", action="store_true", help="skip the Kafka read-throughput benchmark"
    )
    parser.add_argument(
        "--no-personalized", action="store_true", help="skip the personalized reproduction"
    )
    args = parser.parse_args(argv)
    progress = not args.no_progress
    if args.quick:
        users, slots, seeds, big_users, warm, timed, path_slots = 20_000, 100, 2, 50_000, 20, 5, 20
        kafka_slots, kafka_repeats = 20, 2
        pers_users, pers_slots, pers_seeds = 2_000, 1_000, 1
    else:
        users, slots, seeds = 200_000, 800, args.seeds
        big_users, warm, timed, path_slots = 1_000_000, 40, 20, 100
        kafka_slots, kafka_repeats = 100, 5
        pers_users, pers_slots, pers_seeds = 10_000, 10_000, 3

    started = time.perf_counter()
    log("1a. default reproduction: seven mechanisms on Sin, one seed")
    default = default_run(users, slots, progress)
    print(harness.format_table(default))
    print(f"wall time {default['wall_seconds']:.1f} s (data generation included)\n")

    log(f"1b. Table 2 bits per user on Sin and Log, {seeds} seeds")
    t2 = table2(["sin", "log"], users, slots, seeds, progress)
    print(format_table2(t2))

    log("2. performance")
    perf = {
        "paths": [path_ratio(name, users, path_slots) for name in ("LBU", "LPA")],
        "large_lpa": large_lpa(big_users, 100, warm, timed),
    }
    print(format_perf(perf))

    kafka = None
    if not args.no_kafka:
        log(f"3. Kafka read throughput: flow vs raw consumer, {kafka_repeats} runs each")
        kafka = bench_kafka(
            settings=None,
            dataset="sin",
            users=20_000,
            slots=kafka_slots,
            mechanisms="LBU",
            repeats=kafka_repeats,
            run_flow=run_dataflow,
            progress=progress,
        )
        print("\n" + format_result(kafka))

    personalized = None
    if not args.no_personalized:
        log(f"4. personalized w-event: BD, BA, PBD, PBA, {pers_seeds} seed(s)")
        personalized = {}
        for dataset in ("tlns", "sin", "log"):
            result = harness.bench(
                PERSONALIZED, dataset, pers_users, pers_slots, PERSONALIZED.epsilon,
                PERSONALIZED.window, ["BD", "BA", "PBD", "PBA"], pers_seeds, progress=progress,
            )  # fmt: skip
            amre = {name: r["amre"] for name, r in result["results"].items()}
            result["reductions"] = {
                "PBD_vs_BD": reductions(amre["BD"], amre["PBD"]),
                "PBA_vs_BA": reductions(amre["BA"], amre["PBA"]),
                "paper": {
                    "PBD_vs_BD": PAPER_HEADLINES["PBD/BD real data"],
                    "PBA_vs_BA": PAPER_HEADLINES["PBA/BA synthetic data"],
                },
            }
            personalized[dataset] = result
            print(harness.format_table(result))
            print(f"reductions: {json.dumps(result['reductions'])}\n")

    log("5. hardened randomness: keyed AES-CTR vs PCG64, discrete vs float Laplace")
    noise = bench_noise(users=1_000_000, repeats=3 if args.quick else 7)
    print("\n" + format_noise(noise))

    total = time.perf_counter() - started
    record = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "quick": args.quick,
        "environment": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "default": default,
        "table2": t2,
        "performance": perf,
        "kafka": kafka,
        "personalized": personalized,
        "noise": noise,
        "total_seconds": total,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\ntotal {total:.0f} s; results written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
