"""The claims and tables of a SaO2 bench result (``sao2_bench.run``; spec sao2 §8.4).

``claims`` restates the spec's §8.4 claims as ratios: ours (Monte Carlo on the synthetic
substitutes, and our analytic model), the paper's (its tables, or its plots as the spec reads
them) and the spec author's analytic ones, each with whether our Monte-Carlo numbers bear the
claim out (``holds``) and a note where the three disagree. ``format_result`` prints every
table beside the paper's and the spec's numbers, then the claims.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from privstream.experiments import sao2_paper as paper

Cell = Mapping[str, Any]
Results = Mapping[str, Mapping[str, float]]
TREND_DIMENSION = ("PCKV-GRR", "PrivKV", "KVUE")
"""Figs. 3 and 5: the mechanisms whose gap to ExSub grows with d' and shrinks with s."""
TREND_SPARSITY = ("PCKV-UE", "EFMRTT", "ToPL", "DDRM")
"""Fig. 5: the mechanisms whose gap to ExSub grows with s."""
FAMILY_KEYS = ("tve", "prefix_tve", "all_tve")


def ln(x: float) -> float:
    """The natural log the paper's plots use (``-inf`` for 0)."""
    return math.log(x) if x > 0 else -math.inf


def best_competitor(results: Results, key: str) -> tuple[str, float]:
    """The baseline with the least mean ``key`` (ExSub excluded)."""
    name = min((n for n in results if n != "ExSub"), key=lambda n: results[n][key])
    return name, results[name][key]


def reduction(exsub: float, other: float) -> float:
    """How much less error ExSub has than ``other``: ``1 − exsub/other`` (negative: more)."""
    return 1.0 - exsub / other


def paper_at(row: Sequence[float | None], grid: Sequence[float], eps: float) -> float | None:
    """The paper's value at ``eps`` of a row printed over ``grid`` (None where not printed)."""
    return row[grid.index(eps)] if eps in grid else None


def near_one(cells: Sequence[Cell]) -> float:
    """The ε of ``cells`` closest to 1 (the claims' reference budget)."""
    return float(min((c["eps"] for c in cells), key=lambda e: abs(math.log(e))))


def g(x: float | None) -> str:
    """Three significant digits, ``–`` for a value not printed."""
    return "–" if x is None else f"{x:.3g}"


def joined(values: Sequence[float | None], fmt: str = "{:.3g}") -> str:
    return "/".join("–" if v is None else fmt.format(v) for v in values)


def pct(values: Sequence[float | None]) -> str:
    return " / ".join("–" if v is None else f"{100 * v:.0f} %" for v in values)


def _row(key: str, setting: str, ours: str, printed: str, spec: str, holds: bool,
         note: str = "") -> dict[str, Any]:  # fmt: skip
    return {
        "claim": key,
        "paper_claim": paper.PAPER_CLAIMS[key],
        "setting": setting,
        "ours": ours,
        "paper": printed,
        "spec": spec,
        "holds": holds,
        "note": note,
    }


# -- the claims (spec §8.4) -------------------------------------------------------------------


def _against_optimal(tve: Mapping[str, float | None]) -> float | None:
    """ExSub's TVE reduction against the better of Collision and SUCCINCT."""
    e, c, s = tve["ExSub"], tve["Collision"], tve["SUCCINCT"]
    return None if e is None or c is None or s is None else reduction(e, min(c, s))


def _offline_part(setting: Cell, printed: Cell, spec: Cell) -> tuple[str, str, str, str, bool]:
    cells = setting["cells"]
    ours = [_against_optimal({m: r["tve"] for m, r in c["results"].items()}) for c in cells]
    theirs = [
        _against_optimal({m: paper_at(row, paper.EXTREME_EPS, c["eps"])
                          for m, row in printed["tve"].items()})
        for c in cells
    ]  # fmt: skip
    spec_tve = [paper_at(spec["tve"], paper.EXTREME_EPS, c["eps"]) for c in cells]
    label = f"n={setting['n']:,} d'={setting['d_prime']} s={setting['s']}"
    analytic = (
        f"{label}: spec {joined(spec_tve)}; ours analytic "
        f"{joined([c['analytic']['tve'] for c in cells])}, MC "
        f"{joined([c['results']['ExSub']['tve'] for c in cells])}"
    )
    holds = all(v is not None and v > 0 for v in ours)
    return label, pct(ours), pct(theirs), analytic, holds


def _offline_claim(result: Cell) -> dict[str, Any]:
    """Tables 2 and 4 at the spec's readings (n = 50,000; d' = 512, the last settings run)."""
    parts = [
        _offline_part(result["table2"][-1], paper.PAPER_TABLE2, paper.SPEC_TABLE2),
        _offline_part(result["table4"][-1], paper.PAPER_TABLE4, paper.SPEC_TABLE4),
    ]
    eps = joined([c["eps"] for c in result["table2"][-1]["cells"]], "{:g}")
    return _row(
        "offline",
        f"ε={eps}; " + " | ".join(p[0] for p in parts),
        "less TVE than the better of Collision/SUCCINCT: " + " | ".join(p[1] for p in parts),
        " | ".join(p[2] for p in parts),
        "ExSub TVE " + " | ".join(p[3] for p in parts),
        all(p[4] for p in parts),
        "Table 2 matches at n = 50,000, not the caption's 10,000 (A27); Table 4 at d' = 512, "
        "not 1024 (A28)",
    )


def _gaps(cells: Sequence[Cell], key: str, names: Sequence[str]) -> dict[str, list[float]]:
    """Per mechanism, its TVE over ExSub's at the ε nearest 1, along ``key`` (d' or s)."""
    eps = near_one(cells)
    row = sorted((c for c in cells if c["eps"] == eps), key=lambda c: c[key])
    return {m: [c["results"][m]["tve"] / c["results"]["ExSub"]["tve"] for c in row]
            for m in names}  # fmt: skip


def _ln_exsub(cells: Sequence[Cell], key: str, value: int, eps: float) -> str:
    cell = next(c for c in cells if c[key] == value and c["eps"] == eps)
    return f"{ln(cell['analytic']['tve']):.2f}/{ln(cell['results']['ExSub']['tve']):.2f}"


def _dimension_claim(result: Cell) -> dict[str, Any]:
    cells = result["dimension"]
    eps, dims = near_one(cells), sorted({c["d_prime"] for c in cells})
    best = all(best_competitor(c["results"], "tve")[1] > c["results"]["ExSub"]["tve"]
               for c in cells)  # fmt: skip
    gaps = _gaps(cells, "d_prime", TREND_DIMENSION)
    grows = all(v[-1] > v[0] for v in gaps.values())
    shown = [d for d in dims if d in paper.SPEC_FIG3]
    return _row(
        "dimension",
        f"n={cells[0]['n']:,}, s=8, d'={joined(dims, '{}')}, ε={g(eps)}",
        f"ExSub best in {'every' if best else 'not every'} (d', ε) cell; TVE/ExSub "
        + "; ".join(f"{m} {joined(v)}" for m, v in gaps.items()),
        "ExSub ln TVE "
        + "; ".join(
            f"d'={d} {g(paper_at(paper.PAPER_FIG3_EXSUB_LN_TVE[d], paper.FIG_EPS, eps))}"
            for d in paper.PAPER_FIG3_EXSUB_LN_TVE
        ),
        "ExSub ln TVE (spec; ours analytic/MC) "
        + "; ".join(
            f"d'={d} {g(paper_at(paper.SPEC_FIG3[d]['ln_tve'], paper.FIG_EPS, eps))}; "
            f"{_ln_exsub(cells, 'd_prime', d, eps)}"
            for d in shown
        ),
        best and grows,
    )


def _sparsity_claim(result: Cell) -> dict[str, Any]:
    cells = result["sparsity"]
    eps, ss = near_one(cells), sorted({c["s"] for c in cells})
    gaps = _gaps(cells, "s", (*TREND_SPARSITY, *TREND_DIMENSION))
    behind = all(gaps[m][-1] > gaps[m][0] for m in TREND_SPARSITY)
    catch_up = all(gaps[m][-1] < gaps[m][0] for m in TREND_DIMENSION)
    shown = [s for s in ss if s in paper.SPEC_FIG5_LN_TVE]
    return _row(
        "sparsity",
        f"d'=256, n={cells[0]['n']:,}, s={joined(ss, '{}')}, ε={g(eps)}",
        "TVE/ExSub " + "; ".join(f"{m} {joined(v)}" for m, v in gaps.items()),
        "trend only (plot)",
        "ExSub ln TVE (spec; ours analytic/MC) "
        + "; ".join(
            f"s={s} {g(paper.SPEC_FIG5_LN_TVE[s].get(eps))}; {_ln_exsub(cells, 's', s, eps)}"
            for s in shown
        ),
        behind and catch_up,
    )


def _reductions(cells: Sequence[Cell], key: str) -> list[float]:
    return [reduction(c["results"]["ExSub"][key], best_competitor(c["results"], key)[1])
            for c in cells]  # fmt: skip


def _printed_reduction(rows: Mapping[str, Sequence[float | None]], eps: float) -> float | None:
    """1 − e^{ln TVE(ExSub) − ln TVE(PCKV-GRR)} from the plot values (None where unread)."""
    e = paper_at(rows["ExSub"], paper.ONLINE_EPS, eps)
    other = paper_at(rows["PCKV-GRR"], paper.ONLINE_EPS, eps)
    return None if e is None or other is None else 1 - math.exp(e - other)


def _ln_row(cells: Sequence[Cell], key: str, source: str = "results") -> str:
    values = [c[source]["ExSub"][key] if source == "results" else c[source][key] for c in cells]
    return joined([ln(v) for v in values], "{:.2f}")


def _stock_claim(result: Cell) -> dict[str, Any]:
    cells = result["stock"]
    ours = _reductions(cells, "tve")
    names = "/".join(best_competitor(c["results"], "tve")[0] for c in cells)
    return _row(
        "stock",
        f"n={cells[0]['n']:,}, {cells[0]['seeds']} runs, ε={joined([c['eps'] for c in cells], '{:g}')}",
        f"less TVE than the best competitor ({names}): {pct(ours)}; ExSub ln TVE "
        f"{_ln_row(cells, 'tve')}",
        pct([_printed_reduction(paper.PAPER_FIG6_LN_TVE, c["eps"]) for c in cells])
        + " (vs PCKV-GRR); ExSub ln TVE "
        + joined(
            [paper_at(paper.PAPER_FIG6_LN_TVE["ExSub"], paper.ONLINE_EPS, c["eps"]) for c in cells]
        ),
        f"ExSub ln TVE ≈ 0.4 at ε = 1 (§8.1); ours analytic {_ln_row(cells, 'tve', 'analytic')}",
        all(v > 0 for v in ours),
        "a run's running-state TVE spreads 40-65 %: compare within the seed spread",
    )


def _trajectory_claims(result: Cell) -> list[dict[str, Any]]:
    cells = result["trajectory"]
    runs = int(cells[0]["results"]["ExSub"]["runs"])
    setting = f"n={_users(result)}, {runs} run(s), ε={joined([c['eps'] for c in cells], '{:g}')}"
    ours = _reductions(cells, "tve")
    names = "/".join(best_competitor(c["results"], "tve")[0] for c in cells)
    spec = joined([paper_at(paper.SPEC_FIG7_LN_TVE, paper.ONLINE_EPS, c["eps"]) for c in cells])
    mean = _row(
        "trajectory",
        setting,
        f"less TVE than the best competitor ({names}): {pct(ours)}; ExSub ln TVE "
        f"{_ln_row(cells, 'tve')}",
        pct([_printed_reduction(paper.PAPER_FIG7_LN_TVE, c["eps"]) for c in cells])
        + " (vs PCKV-GRR); ExSub ln TVE "
        + joined(
            [paper_at(paper.PAPER_FIG7_LN_TVE["ExSub"], paper.ONLINE_EPS, c["eps"]) for c in cells]
        ),
        f"ExSub ln TVE {spec}; ours analytic {_ln_row(cells, 'tve', 'analytic')}",
        all(v > 0 for v in ours),
    )
    prefix, every = _reductions(cells, "prefix_tve"), _reductions(cells, "all_tve")
    ratio = [c["results"]["ExSub"][k] / c["analytic"][k] for c in cells
             for k in ("prefix_tve", "all_tve") if c["eps"] == near_one(cells)]  # fmt: skip
    ranges = _row(
        "ranges",
        setting,
        f"less TVE than the best competitor: prefix {pct(prefix)}; all ranges {pct(every)}",
        "≈ 50 % (competitors not read); ExSub ln TVE prefix "
        + joined(
            [
                paper_at(paper.PAPER_FIG8_EXSUB_LN_TVE["prefix"], paper.ONLINE_EPS, c["eps"])
                for c in cells
            ]
        ),
        "the paper's range TVE is 1.8× (prefix) to 5.7× (all) the analytic model at ε = 1",
        all(v > 0 for v in (*prefix, *every)),
        f"ours: MC/analytic at ε = {g(near_one(cells))} prefix/all {joined(ratio)}: the paper "
        "normalises range TVE differently; a run's range TVE spreads 12-16 %",
    )
    return [mean, ranges]


def _users(result: Cell) -> str:
    return f"{result['plan']['trajectory_users']:,}"


def _fanout_part(cells: Sequence[Cell], eps: float) -> tuple[str, str, str, bool]:
    row = sorted((c for c in cells if c["eps"] == eps), key=lambda c: c["r"])
    mae = [c["results"]["ExSub"]["mae"] for c in row]
    analytic = [c["analytic"]["mae"] for c in row]
    printed = paper.PAPER_TABLE3_MAE["ExSub"].get(eps)
    spec = paper.SPEC_TABLE3_EXSUB_MAE.get(eps)
    ours = (f"ε={g(eps)}: ExSub MAE {joined(mae)} (analytic {joined(analytic)}), "
            f"DDRM {joined([c['results']['DDRM']['mae'] for c in row])}")  # fmt: skip
    holds = abs(mae[1] / mae[0] - 1) <= 0.1 and min(mae[2:]) > mae[1]
    return (ours, f"ε={g(eps)}: {joined(printed or [])}", f"ε={g(eps)}: {joined(spec or [])}",
            holds)  # fmt: skip


def _fanout_claim(result: Cell) -> dict[str, Any]:
    cells = result["table3"]
    parts = [_fanout_part(cells, eps) for eps in sorted({c["eps"] for c in cells})]
    runs = int(cells[0]["results"]["ExSub"]["runs"])
    return _row(
        "fanout",
        f"n={result['plan']['fanout_users']:,}, d=1, T=128, s=8, r=2/4/8/16, {runs} runs",
        "; ".join(p[0] for p in parts),
        "; ".join(p[1] for p in parts),
        "ExSub analytic MAE " + "; ".join(p[2] for p in parts),
        all(p[3] for p in parts),
        "holds: MAE(r=4) within 10 % of MAE(r=2), and r = 8 and 16 both worse than r = 4. "
        "The Gaussian model assumes independent errors across t, so it overstates the MAE of "
        "correlated slots; the paper prints one DDRM row for both ε (A30)",
    )


def _weight_ratios(cell: Cell, source: str) -> dict[str, list[float]]:
    base = cell[source]["uniform"]
    return {s: [cell[source][s][k] / base[k] for k in FAMILY_KEYS]
            for s in cell[source] if s != "uniform"}  # fmt: skip


def _weights_claim(result: Cell) -> dict[str, Any]:
    parts, calibrated, optimal = [], True, True
    for label in ("fig9", "fig10"):
        for cell in result[label]:
            mc, an = _weight_ratios(cell, "results"), _weight_ratios(cell, "analytic")
            calibrated &= mc["calibrated-paper"][1] < 1 and mc["calibrated-paper"][2] < 1
            optimal &= label == "fig9" or mc["optimal-prefix"][1] < 1
            parts.append(f"{label} ε={g(cell['eps'])}: " + "; ".join(
                f"{s} {joined(v)} (analytic {joined(an[s])})" for s, v in mc.items()))  # fmt: skip
    printed = "; ".join(
        f"Fig. 10 {family} ε={g(e)} {math.exp(c - u):.2f}"
        for family, rows in paper.PAPER_FIG10_LN_TVE.items()
        for e, (u, c) in rows.items()
    )
    return _row(
        "calibrated",
        "TVE over uniform W's, mean/prefix/all",
        " | ".join(parts),
        "calibrated/uniform: " + printed,
        "; ".join(
            f"{s} {v['mean']}/{v['prefix']}/{v['all']}"
            for s, v in paper.SPEC_CALIBRATED_RATIOS.items()
        ),
        calibrated,
        "holds: the paper's calibrated formula lowers both range TVEs. As spec §3.5 (A18-A19) "
        "predicts, it does not; the spec's optimal (∝ √G_h) weights lower prefix-range TVE "
        f"{'in every' if optimal else 'not in every'} Fig. 10 cell (Fig. 9: "
        f"{result['plan']['fig9_seeds']} run(s) at n = {_users(result)}; a run's range TVE "
        "spreads 12-16 %)",
    )


def claims(result: Cell) -> list[dict[str, Any]]:
    """The §8.4 claims, ours beside the paper's and the spec's (``PAPER_CLAIMS`` order)."""
    return [
        _offline_claim(result),
        _dimension_claim(result),
        _sparsity_claim(result),
        _stock_claim(result),
        *_trajectory_claims(result),
        _fanout_claim(result),
        _weights_claim(result),
    ]


# -- tables -----------------------------------------------------------------------------------


def format_offline(cell: Cell) -> str:
    """One ``offline_compare`` result: TVE and MAE per mechanism (mean ± sd over seeds)."""
    lines = [
        f"offline: d' = {cell['d_prime']}, s = {cell['s']}, ε = {cell['eps']}, "
        f"n = {cell['n']:,}, {cell['seeds']} seed(s); ExSub m* = {cell['m']}",
        f"{'mechanism':<17} {'TVE':>10} {'± sd':>9} {'MAE':>10} {'± sd':>9}",
    ]
    for name, r in cell["results"].items():
        lines.append(
            f"{name:<17} {r['tve']:>10.4g} {r['tve_sd']:>9.2g} {r['mae']:>10.4g} {r['mae_sd']:>9.2g}"
        )
    a = cell["analytic"]
    lines.append(f"{'ExSub (analytic)':<17} {a['tve']:>10.4g} {'':>9} {a['mae']:>10.4g}")
    return "\n".join(lines)


def _cell_text(ours: float, printed: float | None) -> str:
    return f"{g(ours):>8} ({g(printed)})".ljust(20)


def _extreme(setting: Cell, printed: Cell, spec: Cell, title: str) -> list[str]:
    cells = setting["cells"]
    lines = [
        f"{title}: n = {setting['n']:,}, d' = {setting['d_prime']}, s = {setting['s']}, "
        f"{cells[0]['seeds']} seed(s); ours (paper), analytic (spec's analytic)"
    ]
    for metric in ("tve", "mae"):
        lines.append(f"  {metric.upper():<17}" + "".join(f"ε={c['eps']:<18g}" for c in cells))
        for name in cells[0]["results"]:
            row = printed[metric].get(name, ())
            lines.append(f"  {name:<17}" + "".join(
                _cell_text(c["results"][name][metric], paper_at(row, paper.EXTREME_EPS, c["eps"]))
                for c in cells))  # fmt: skip
        lines.append(f"  {'ExSub analytic':<17}" + "".join(
            _cell_text(c["analytic"][metric], paper_at(spec[metric], paper.EXTREME_EPS, c["eps"]))
            for c in cells))  # fmt: skip
    return lines


def _grid(title: str, cells: Sequence[Cell], rows: Sequence[tuple[str, list[float]]]) -> list[str]:
    head = f"  {title:<17}" + "".join(f"ε={c['eps']:<8g}" for c in cells)
    return [head] + [f"  {name:<17}" + "".join(f"{v:<10.2f}" for v in values)
                     for name, values in rows]  # fmt: skip


def _sweep(cells: Sequence[Cell], key: str, title: str) -> list[str]:
    lines = [f"{title}: ln TVE, n = {cells[0]['n']:,}, {cells[0]['seeds']} seed(s)"]
    for value in sorted({c[key] for c in cells}):
        row = [c for c in cells if c[key] == value]
        rows = [(name, [ln(c["results"][name]["tve"]) for c in row]) for name in row[0]["results"]]
        rows.append(("ExSub analytic", [ln(c["analytic"]["tve"]) for c in row]))
        lines += _grid(f"{key} = {value}", row, rows)
    return lines


def _online(cells: Sequence[Cell], keys: Sequence[str], title: str, printed: Cell) -> list[str]:
    runs = int(cells[0]["results"]["ExSub"]["runs"])
    lines = [f"{title}: ln of the error, {runs} run(s)"]
    for key in keys:
        rows = [(n, [ln(c["results"][n][key]) for c in cells]) for n in cells[0]["results"]]
        rows.append(("ExSub analytic", [ln(c["analytic"][key]) for c in cells]))
        lines += _grid(key, cells, rows)
        for name, row in printed.items() if key == "tve" else ():
            values = [paper_at(row, paper.ONLINE_EPS, c["eps"]) for c in cells]
            lines.append(f"  {'paper ' + name:<17}" + "".join(f"{g(v):<10}" for v in values))
    return lines


def _table3(cells: Sequence[Cell]) -> list[str]:
    runs = int(cells[0]["results"]["ExSub"]["runs"])
    lines = [f"Table 3: MAE of mean queries (d = 1, T = 128, s = 8), {runs} run(s)"]
    for eps in sorted({c["eps"] for c in cells}):
        row = sorted((c for c in cells if c["eps"] == eps), key=lambda c: c["r"])
        lines.append(f"  ε = {eps:<13g}" + "".join(f"r={c['r']:<8}" for c in row))
        table = [(name, [c["results"][name]["mae"] for c in row]) for name in ("ExSub", "DDRM")]
        table += [(f"paper {n}", list(paper.PAPER_TABLE3_MAE[n].get(eps, ())))
                  for n in ("ExSub", "DDRM")]  # fmt: skip
        table += [("ExSub analytic", [c["analytic"]["mae"] for c in row]),
                  ("spec analytic", list(paper.SPEC_TABLE3_EXSUB_MAE.get(eps, ())))]  # fmt: skip
        lines += [f"  {n:<17}" + "".join(f"{v:<10.3g}" for v in vs) for n, vs in table if vs]
    return lines


def _weights(cells: Sequence[Cell], title: str) -> list[str]:
    runs = int(cells[0]["results"]["uniform"]["runs"])
    lines = [f"{title}: ExSub ln TVE by level weights, {runs} run(s) (analytic)"]
    for cell in cells:
        lines.append(f"  ε = {cell['eps']:<16g}{'mean':<16}{'prefix':<16}{'all ranges':<16}")
        for strategy, r in cell["results"].items():
            a = cell["analytic"][strategy]
            lines.append(f"  {strategy:<20}" + "".join(
                f"{ln(r[k]):.2f} ({ln(a[k]):.2f})".ljust(16) for k in FAMILY_KEYS))  # fmt: skip
    return lines


def format_performance(p: Cell) -> list[str]:
    return [
        f"Performance (n = {p['n']:,}, d = {p['d']}, T = {p['T']}, s = {p['s']}, r = {p['r']}, "
        f"ε = {p['eps']}, m per level {p['m']}):",
        f"  server: {p['server_ms_per_slot']:.2f} ms per slot "
        f"(max {p['server_ms_per_slot_max']:.2f})",
        f"  device: {p['device_us_per_user']:.1f} µs per user and horizon (pure Python); "
        f"vectorised simulation {p['batch_encode_us_per_user']:.2f} µs per user",
    ]


def format_claims(rows: Sequence[Cell]) -> list[str]:
    lines = ["Claims (spec §8.4): ours | paper | spec"]
    for row in rows:
        verdict = "holds" if row["holds"] else "does NOT hold"
        lines += [
            f"* {row['claim']} [{verdict}]: {row['paper_claim']} ({row['setting']})",
            f"    ours:  {row['ours']}",
            f"    paper: {row['paper']}",
            f"    spec:  {row['spec']}",
        ]
        if row["note"]:
            lines.append(f"    note:  {row['note']}")
    return lines


def format_result(result: Cell) -> str:
    """Every table of a ``sao2_bench.run`` result, then the claims."""
    parts: list[list[str]] = []
    parts += [
        _extreme(s, paper.PAPER_TABLE2, paper.SPEC_TABLE2, "Table 2") for s in result["table2"]
    ]
    parts += [
        _extreme(s, paper.PAPER_TABLE4, paper.SPEC_TABLE4, "Table 4") for s in result["table4"]
    ]
    parts.append(_sweep(result["dimension"], "d_prime", "Fig. 3 (s = 8)"))
    parts.append(_sweep(result["sparsity"], "s", "Fig. 5 (d' = 256)"))
    parts.append(_online(result["stock"], ("tve", "mae"), "Fig. 6 Stock stand-in",
                         paper.PAPER_FIG6_LN_TVE))  # fmt: skip
    parts.append(_online(result["trajectory"], ("tve", "mae", "prefix_tve", "all_tve"),
                         "Figs. 7-8 Trajectory stand-in", paper.PAPER_FIG7_LN_TVE))  # fmt: skip
    parts.append(_weights(result["fig9"], "Fig. 9 Trajectory stand-in"))
    parts.append(_weights(result["fig10"], "Fig. 10 synthetic (d = 8, T = 128, s = 20)"))
    parts.append(_table3(result["table3"]))
    parts.append(format_performance(result["performance"]))
    parts.append(format_claims(result["claims"]))
    return "\n\n".join("\n".join(part) for part in parts)
