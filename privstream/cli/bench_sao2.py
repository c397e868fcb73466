"""``privstream bench sao2``: the SaO2 reproduction (spec sao2 §8; ``experiments.sao2_bench``).

Without ``--offline`` it runs the whole reproduction — Tables 2–4, the d′/s sweeps, the online
comparisons on the Stock and Trajectory stand-ins, calibrated against uniform level weights —
and the performance figures, and prints every table beside the paper's and the spec's numbers
and the §8.4 claims (``--quick`` for small sizes). ``--offline`` runs one offline comparison at
``(--d-prime, --s, --epsilon, --users)``. Progress goes to stderr; ``--json`` writes the
numbers. Synthetic data only: nothing printed is a user's value.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from privstream.cli.argtypes import positive_float, positive_int

OFFLINE_FLAGS = ("d_prime", "s", "epsilon", "users", "mechanisms")
OFFLINE_DEFAULTS = {"d_prime": 128, "s": 8, "epsilon": 1.0, "users": 10_000, "seeds": 10}


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected a,b,..., got {text!r}")
    return names


def add_parser(bench_family: Any) -> None:
    """Register ``bench sao2`` on the ``privstream bench`` sub-parsers."""
    p = bench_family.add_parser(
        "sao2", help="SaO2 reproduction: ExSub against the baselines offline and online, "
        "fan-out, level weights, and the server/device costs (spec sao2 §8)",
    )  # fmt: skip
    p.add_argument(
        "--offline", action="store_true",
        help="one offline comparison on the synthetic sparse ternary vectors instead",
    )  # fmt: skip
    p.add_argument("--d-prime", type=positive_int, help="--offline: vector length d' (128)")
    p.add_argument("--s", type=positive_int, help="--offline: non-zeros per user s (8)")
    p.add_argument("--epsilon", type=positive_float, help="--offline: ε per user (1.0)")
    p.add_argument("--users", type=positive_int, help="--offline: users n (10000)")
    p.add_argument(
        "--mechanisms", type=_names, metavar="A,B,...",
        help="--offline: mechanisms to compare (default ExSub and the ten baselines)",
    )  # fmt: skip
    p.add_argument(
        "--seeds", type=positive_int,
        help="Monte-Carlo runs per cell (--offline: default 10; else every count of the plan)",
    )  # fmt: skip
    p.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    p.add_argument("--json", help="write the results as JSON to this file")


def run(args: argparse.Namespace) -> int:
    """Run the offline comparison or the reproduction; print it; write ``--json``."""
    from privstream.experiments import sao2_bench as bench
    from privstream.experiments import sao2_report as report

    if args.offline:
        value = {k: getattr(args, k) for k in (*OFFLINE_FLAGS, "seeds")}
        value = {k: OFFLINE_DEFAULTS[k] if v is None and k in OFFLINE_DEFAULTS else v
                 for k, v in value.items()}  # fmt: skip
        result = bench.offline_compare(
            value["d_prime"], value["s"], value["epsilon"], value["users"],
            value["mechanisms"] or bench.MECHANISMS, value["seeds"],
        )  # fmt: skip
        print(report.format_offline(result))
    else:
        given = [f"--{k.replace('_', '-')}" for k in OFFLINE_FLAGS if getattr(args, k) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} only apply with --offline")
        plan = bench.QUICK if args.quick else bench.FULL
        result = bench.run(bench.with_seeds(plan, args.seeds) if args.seeds else plan)
        print(report.format_result(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"results written to {args.json}", file=sys.stderr)
    return 0
