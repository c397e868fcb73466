"""``privstream accountant shuffle``: the central (ε_c, δ) a shuffler buys for n users' ε0-LDP
reports, every bound of ``privstream.mechanisms.shuffle_accountant`` by name (docs/accountant.md).
Public parameters in, public numbers out: no data is read."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from privstream.cli.argtypes import positive_float, positive_int

if TYPE_CHECKING:
    from privstream.mechanisms.shuffle_accountant import ShuffleReport


def _probability(text: str) -> float:
    """A number strictly between 0 and 1."""
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {text}")
    return value


def _users(text: str) -> int:
    """An integer ≥ 2: a shuffle needs someone to hide among."""
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be an integer >= 2, got {text}")
    return value


def add_parser(commands: Any) -> None:
    """Register ``accountant shuffle``."""
    acc = commands.add_parser("accountant", help="privacy accountants (docs/accountant.md)")
    kinds = acc.add_subparsers(dest="accountant_command", required=True)
    p = kinds.add_parser(
        "shuffle",
        help="shuffle amplification of SaO2's eps0-LDP reports: every bound (fmt_closed, "
        "classical, online, numerical, numerical_online) with the clone counts Phi, Phi'",
    )
    p.add_argument("--epsilon0", type=positive_float, required=True, help="each report's local ε0")
    p.add_argument("--delta", type=_probability, required=True, help="the central δ, in (0, 1)")
    p.add_argument(
        "--n", type=_users, required=True,
        help="users whose reports share one randomiser: n_h, the users of one SaO2 level",
    )  # fmt: skip
    p.add_argument("--d-prime", type=positive_int, help="ExSub's domain d' (online bounds)")
    p.add_argument("--s", type=positive_int, help="ExSub's sparsity s <= d' (online bounds)")
    p.add_argument("--m", type=positive_int, help="ExSub's output size m (online: m = 2 only)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")


def run(args: argparse.Namespace) -> int:
    """Print every bound; a bad combination (s > d', m > d', d' without s) raises ValueError,
    which the command line reports as ``privstream: error: …`` with exit 2."""
    from privstream.mechanisms.shuffle_accountant import ShuffleSetting, shuffle_bounds

    setting = ShuffleSetting(args.epsilon0, args.delta, args.n, args.d_prime, args.s, args.m)
    report = shuffle_bounds(setting)
    if args.json:
        print(json.dumps(report.as_dict(), sort_keys=True))
        return 0
    for line in _table(report):
        print(line)
    return 0


def _number(value: float | None, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def _epsilon(value: float) -> str:
    return f"{value:.4f}" if value >= 1e-3 else f"{value:.3e}"


def _table(report: ShuffleReport) -> list[str]:
    s = report.setting
    lines = [
        f"shuffle amplification (spec sao2 §7): epsilon0 = {s.epsilon0:g}, delta = {s.delta:g}, "
        f"n = {s.n}, d' = {_number(s.d_prime, 'd')}, s = {_number(s.s, 'd')}, "
        f"m = {_number(s.m, 'd')}",
        f"clones: Phi = {report.phi:.1f}, Phi' = {_number(report.phi_online, '.1f')}, "
        f"Phi'/Phi = {_number(report.ratio, '.3f')}, p_cc = {_number(report.p_cc, '.6f')}"
        + ("" if report.p_cc_cap is None else f" (Lemma 6.1 allows <= {report.p_cc_cap:.6f})"),
        f"{'bound':<18}{'epsilon_c':<11}note",
    ]
    for bound in report.bounds:
        value = _epsilon(bound.epsilon) if bound.applicable else "n/a"
        lines.append(f"{bound.name:<18}{value:<11}{bound.note}")
    stated = report.bound(report.STATED)
    lines.append(
        f"a release states {stated.name} = {_epsilon(stated.epsilon)} (n = n_h, the users of one "
        "level); online and numerical_online rest on Lemma 6.1, false as stated: reproduction only"
        if stated.applicable
        else f"a release states epsilon0 = {s.epsilon0:g}: {stated.name} gives no amplification"
    )
    return lines
