"""Section 7 of `make bench`: state size and snapshot cost of one stream of 10⁶ users (issue 13).

Run alone with ``python bench/run.py --state-only`` or ``python bench/state.py`` (both write
bench/results/state.json; ``--quick`` uses 10⁵ users).

1. For every family — each LDP-IDS mechanism, LBU+LPA sharing ε, PBD and PBA with two privacy
   classes, CGM — the slotted operator's ``StreamState`` of one stream after w + 5 slots of
   named users (user-id strings, as from Kafka; every user reports at the first slot, a tenth
   at each later one, one slot still open): pickled bytes, bytes per user (and without the
   directory of named users, as with dense indices), each component, and the time to copy
   (``SlottedLogic.snapshot``), pickle, write to sqlite and unpickle it. The per-mechanism rows
   of a family are cut from one state running them side by side (``bench_state.only``).
2. The pause snapshots cause a real flow: the family's operator under Bytewax's runner with a
   recovery store and a 1 s snapshot interval against the same run without a store.

See ``privstream.experiments.state`` for what is measured and bench/README.md for the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from privstream.experiments.state import Case, build_state, flow_pause, measure, only

RESULTS = Path(__file__).resolve().parent / "results"
LDP_IDS = ("LBU", "LBD", "LBA", "LSP", "LPU", "LPD", "LPA")
LEDGER = " ledger"


def plan(quick: bool) -> list[tuple[Case, int, tuple[str, ...]]]:
    """The states to build: ``(case, slots, rows)``; ``rows`` are the mechanisms cut from a
    side-by-side state, or empty for the state as it is. CGM's window is 20 reports (its
    state does not depend on it: tests/operators/test_state_size.py), to keep the run short."""
    personalized = 40 if quick else 120
    return [
        (Case("ldp-ids", LDP_IDS, 20, compare=True), 25, LDP_IDS),
        (Case("ldp-ids", ("LBU", "LPA"), 20), 25, ()),
        (Case("personalized", ("PBD", "PBA"), personalized, compare=True), personalized + 5,
         ("PBD", "PBA")),
        (Case("cgm", ("CGM",), 20), 25, ()),
    ]  # fmt: skip


FLOWS = (
    Case("ldp-ids", ("LPA",), 20),
    Case("personalized", ("PBD",), 120),
    Case("cgm", ("CGM",), 20),
)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _row(case: Case, name: str, result: dict[str, Any], users: int) -> dict[str, Any]:
    parts = result["components"]
    ledger = sum(v for k, v in parts.items() if k.endswith(LEDGER))
    return {"family": case.family, "mechanisms": name, "window": case.window, **result,
            "ledger_bytes_per_user": ledger / users}  # fmt: skip


def run_state(users: int, quick: bool, interval: float = 1.0) -> dict[str, Any]:
    """Section 7: the states' sizes and snapshot costs, then the pause in real flows."""
    rows = []
    for case, slots, cut in plan(quick):
        log(f"7. state of {case.label} ({case.family}, w={case.window}) over {users:,} users")
        started = time.perf_counter()
        state = build_state(case, users, slots)
        log(f"   built in {time.perf_counter() - started:.0f} s ({slots} slots)")
        for name in cut or (case.label,):
            one = only(state, name) if cut else state
            rows.append(_row(case, name, measure(one, users), users))
        del state
    flows = []
    for case in FLOWS:
        log(f"7. snapshot pause of a {case.label} flow, {users:,} users, {interval:g} s interval")
        flows.append({"family": case.family, "mechanisms": case.label,
                      **flow_pause(case, users, 8 if quick else 12, interval)})  # fmt: skip
    return {"users": users, "interval_s": interval, "states": rows, "flows": flows}


def format_state(result: dict[str, Any]) -> str:
    """The section's tables: sizes and costs per stream, then the pauses in real flows."""
    n = result["users"]
    lines = [
        f"state of one stream, n = {n:,} named users (dense ids: without the directory)",
        f"{'family':<13}{'mechanisms':<10}{'B/user':>8}{'dense':>7}{'ledger':>8}{'MB':>7}"
        f"{'copy':>7}{'pickle':>8}{'write':>7}{'unpickle':>9}{'pause':>7}  ms",
    ]
    for r in result["states"]:
        lines.append(
            f"{r['family']:<13}{r['mechanisms']:<10}{r['bytes_per_user']:>8.1f}"
            f"{r['dense_bytes_per_user']:>7.1f}{r['ledger_bytes_per_user']:>8.2f}"
            f"{r['bytes'] / 1e6:>7.1f}{r['copy_ms']:>7.0f}{r['pickle_ms']:>8.0f}"
            f"{r['write_ms']:>7.0f}{r['unpickle_ms']:>9.0f}{r['pause_ms']:>7.0f}"
        )
    lines += [
        "",
        f"snapshot pause in a real flow ({result['interval_s']:g} s snapshot interval)",
        f"{'family':<13}{'mechanism':<10}{'snaps':>6}{'step':>7}{'pause':>7}{'by wall':>9}"
        f"{'copy':>6}{'store MB':>10}",
    ]
    for f in result["flows"]:
        pause = "-" if f["pause_ms"] is None else f"{f['pause_ms']:.0f}"
        copy_ms = "-" if f["copy_ms"] is None else f"{f['copy_ms']:.0f}"
        lines.append(
            f"{f['family']:<13}{f['mechanisms']:<10}{f['snapshots']:>6}{f['step_ms']:>7.0f}"
            f"{pause:>7}{f['pause_from_wall_ms']:>9.0f}{copy_ms:>6}{f['store_bytes'] / 1e6:>10.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "state.json")
    parser.add_argument("--quick", action="store_true", help="10⁵ users instead of 10⁶")
    parser.add_argument("--users", type=int, help="users per stream (overrides --quick)")
    args = parser.parse_args(argv)
    users = args.users or (100_000 if args.quick else 1_000_000)
    started = time.perf_counter()
    result = run_state(users, args.quick)
    print(format_state(result))
    record = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "environment": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "quick": args.quick,
        "state": result,
        "total_seconds": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\ntotal {record['total_seconds']:.0f} s; results written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
