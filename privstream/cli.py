"""The ``privstream`` command line: run flows, run benchmarks, run the demo.

``privstream run ldp-ids``, ``privstream bench ldp-ids`` and ``privstream demo`` are contracts:
their flags and output formats are what scripts and later checks rely on.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from privstream.mechanisms.ldp_ids import MECHANISMS

ALL_LDP_IDS = ",".join(MECHANISMS)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _mean_range(text: str) -> tuple[float, float]:
    try:
        lower, upper = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOWER:UPPER, got {text}") from None
    return lower, upper


def _common(p: argparse.ArgumentParser, *, users: int = 200_000) -> None:
    p.add_argument(
        "--dataset",
        default="sin",
        help="lns, sin, log, their -con variants, or file:PATH (default sin)",
    )
    p.add_argument(
        "--users",
        type=_positive_int,
        default=users,
        help="registered population size n (default %(default)s)",
    )
    p.add_argument(
        "--slots",
        type=_positive_int,
        default=800,
        help="slots of a synthetic stream (default %(default)s)",
    )
    p.add_argument(
        "--epsilon", type=_positive_float, default=1.0, help="window budget ε (default %(default)s)"
    )
    p.add_argument(
        "--window", type=_positive_int, default=20, help="window size w (default %(default)s)"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="privstream", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run a ready dataflow")
    run_family = run.add_subparsers(dest="family", required=True)
    ldp = run_family.add_parser("ldp-ids", help="LDP-IDS mechanisms (w-event LDP)")
    _common(ldp)
    ldp.add_argument(
        "--mechanism", default="LPA", help=f"one or more of {ALL_LDP_IDS}, comma separated"
    )
    ldp.add_argument(
        "--seed", type=int, default=1, help="secret seed of the mechanisms' randomness"
    )
    ldp.add_argument("--out", default="releases.jsonl", help="releases, one JSON object per line")
    ldp.add_argument("--ledger-out", help="ledger entries as JSON lines (optional)")
    ldp.add_argument(
        "--dead-letter-out", help="rejected events with reasons as JSON lines (optional)"
    )
    ldp.add_argument(
        "--beta", type=float, default=0.5, help="share β of the dissimilarity step (default 0.5)"
    )
    ldp.add_argument(
        "--lateness",
        type=int,
        default=1,
        help="slots a slot stays open for late events (default 1)",
    )
    ldp.add_argument("--client-path", choices=("aggregate", "per-user"), default="aggregate")
    ldp.add_argument(
        "--domain", type=_positive_int, help="categories d of a file dataset (default 2)"
    )
    ldp.add_argument(
        "--mean-range",
        type=_mean_range,
        help="LOWER:UPPER: a file dataset is numeric, clipped to it",
    )
    ldp.add_argument("--stream", help="stream name (default: the dataset name)")
    ldp.add_argument(
        "--workers", type=_positive_int, default=1, help="Bytewax worker threads (default 1)"
    )
    ldp.add_argument("--recovery-dir", help="Bytewax recovery store directory (created if missing)")
    ldp.add_argument("--no-progress", action="store_true", help="do not show a progress bar")

    bench = commands.add_parser(
        "bench", help="run a reproduction benchmark on the engine-free core"
    )
    bench_family = bench.add_subparsers(dest="family", required=True)
    bldp = bench_family.add_parser("ldp-ids", help="LDP-IDS mechanisms")
    _common(bldp)
    bldp.add_argument(
        "--mechanisms", default=ALL_LDP_IDS, help="comma-separated mechanisms (default all seven)"
    )
    bldp.add_argument(
        "--seeds", type=_positive_int, default=1, help="seeds 1..K to average over (default 1)"
    )
    bldp.add_argument("--json", help="write the results as JSON to this file")
    bldp.add_argument(
        "--domain",
        type=_positive_int,
        help="categories d of a file dataset (default: largest value + 1)",
    )
    bldp.add_argument(
        "--numeric", action="store_true", help="a file dataset holds numbers: estimate their mean"
    )

    demo = commands.add_parser(
        "demo", help="the main job: all seven LDP-IDS mechanisms on Sin through the flow"
    )
    demo.add_argument(
        "--out", default="demo-out", help="directory for releases, ledger, table and plot"
    )
    demo.add_argument("--users", type=_positive_int, default=200_000)
    demo.add_argument("--slots", type=_positive_int, default=800)
    demo.add_argument("--epsilon", type=_positive_float, default=1.0)
    demo.add_argument("--window", type=_positive_int, default=20)
    demo.add_argument("--seed", type=int, default=1)
    return parser


def _run_flow(flow: Any, workers: int, recovery_dir: str | None) -> None:
    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.run import cli_main

    recovery = None
    if recovery_dir:
        path = Path(recovery_dir)
        if not path.exists():
            path.mkdir(parents=True)
            init_db_dir(path, 1)
        recovery = RecoveryConfig(path)
    cli_main(flow, workers_per_process=workers, recovery_config=recovery)


def _progress_bar(total: int | None, unit: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, file=sys.stderr, dynamic_ncols=True, mininterval=0.5)


def run_ldp_ids(args: argparse.Namespace) -> int:
    from privstream.flows.ldp_ids import build
    from privstream.mechanisms.ldp_ids import mechanism_names

    names = mechanism_names(args.mechanism)
    synthetic = not args.dataset.startswith("file:")
    bar = (
        None
        if args.no_progress
        else _progress_bar(args.slots * len(names) if synthetic else None, "release")
    )
    flow = build(
        dataset=args.dataset,
        mechanisms=names,
        users=args.users,
        slots=args.slots,
        epsilon=args.epsilon,
        window=args.window,
        seed=args.seed,
        out=args.out,
        ledger_out=args.ledger_out,
        dead_letter_out=args.dead_letter_out,
        beta=args.beta,
        lateness=args.lateness,
        client_path=args.client_path,
        domain=args.domain,
        mean_range=args.mean_range,
        stream=args.stream,
        progress=(lambda _release: bar.update(1)) if bar is not None else None,
    )
    for path in (args.out, args.ledger_out, args.dead_letter_out):
        if path:  # outputs exist after the run even when nothing was written to them
            Path(path).touch()
    started = time.perf_counter()
    _run_flow(flow, args.workers, args.recovery_dir)
    if bar is not None:
        bar.close()
    print(f"wrote releases to {args.out} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def bench_ldp_ids(args: argparse.Namespace) -> int:
    from privstream import experiments

    result = experiments.bench_ldp_ids(
        dataset=args.dataset,
        users=args.users,
        slots=args.slots,
        epsilon=args.epsilon,
        window=args.window,
        mechanisms=[m.strip().upper() for m in args.mechanisms.split(",")],
        seeds=args.seeds,
        domain=args.domain,
        numeric=args.numeric,
    )
    print(experiments.format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def demo(args: argparse.Namespace) -> int:
    from privstream.demo import run_demo

    return run_demo(
        out_dir=Path(args.out),
        users=args.users,
        slots=args.slots,
        epsilon=args.epsilon,
        window=args.window,
        seed=args.seed,
        run_flow=_run_flow,
        progress_bar=_progress_bar,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "run":
            return run_ldp_ids(args)
        if args.command == "bench":
            return bench_ldp_ids(args)
        return demo(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"privstream: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
