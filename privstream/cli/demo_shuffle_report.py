"""The shuffle demo's scoring, table and plot (``privstream demo-shuffle``, step 6): the
releases of the shuffled run and of an ``ldp-simulated`` run of the same data against the true
mean vectors, the batch sizes from the manifests, and the privacy line (local ε per horizon,
ε_life, the central ε_c each level's releases state). Aggregates only: no report or id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from privstream.cli.demo_shuffle import STREAM, ShuffleParams, params_dict


def _unique(messages: list[Any]) -> list[dict[str, Any]]:
    """One record per key (a release topic is at-least-once; a shuffler may re-forward)."""
    by_key = {m.key(): json.loads(m.value()) for m in messages}
    return sorted(by_key.values(), key=lambda r: (r.get("slot", 0), r.get("level", 0)))


def simulated(p: ShuffleParams, data: Any) -> np.ndarray:
    """The same data through ``ldp-simulated`` SaO2 (the family's mechanism, in-process)."""
    import privstream.families.sao2  # noqa: F401  (registers the division)
    from privstream.families.registry import family
    from privstream.mechanisms.client import SimulatedClientPort
    from privstream.mechanisms.contract import Release, Slot
    from privstream.mechanisms.sao2_task import BinaryTask
    from privstream.mechanisms.seeding import SlotRandomness

    fam = family("sao2")
    config = fam.make_config(epsilon=p.epsilon, window=p.window, population=p.users,
                             task=BinaryTask(p.cells), horizons=p.horizons, s=p.changes)  # fmt: skip
    mech = fam.build("SaO2", config)
    state, clients, out = mech.initial_state(), mech.client_state(), []
    for t in range(1, p.slots + 1):
        randomness = SlotRandomness(p.seed + 1000, STREAM, t, mech.name)
        port = SimulatedClientPort(np.asarray(data.values(t), dtype=np.float64), config.task,
                                   randomness, client_state=clients)  # fmt: skip
        state, events = mech.step(state, Slot(STREAM, t, port, randomness))
        clients = port.client_state_after or clients
        out.append(next(e for e in events if isinstance(e, Release)).estimate)
    return np.asarray(out)


def report(out: Path, p: ShuffleParams, data: Any, topics: dict[str, list[Any]], written: int,
           seconds: tuple[float, float], total: float) -> int:  # fmt: skip
    """Score, print and save; 0 when every slot was released."""
    releases = [r for r in _unique(topics["releases"]) if r["stream"] == STREAM]
    batches = _unique(topics["shuffled"])
    truth = np.stack([data.truth(t) for t in range(1, p.slots + 1)])
    shuffled = np.asarray([r["estimate"] for r in releases])
    sim = simulated(p, data)
    rows = [_row(r, truth[i], shuffled[i], sim[i], batches) for i, r in enumerate(releases)]
    result = {"params": params_dict(p), "rows": rows, "reports": written,
              "writing_seconds": seconds[0], "end_to_end_seconds": seconds[1],
              "reports_per_second": written / seconds[1], "seconds": total,
              "batches": len(batches), "batch_sizes": sorted({b["n"] for b in batches}),
              "policies": sorted({b["policy"] for b in batches}),
              "epsilon_local": p.epsilon / p.horizons, "epsilon_life": p.epsilon,
              "epsilon_central": releases[-1]["details"]["epsilon_central"] if releases else [],
              "mae_shuffled": float(np.abs(shuffled - truth).mean()),
              "mae_simulated": float(np.abs(sim - truth).mean())}  # fmt: skip
    text = format_report(result)
    print(text)
    (out / "table.txt").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    for name, items in (("releases", releases), ("manifests", batches)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
    _plot(out, truth, shuffled, sim, p)
    return 0 if len(releases) == p.slots else 1


def _row(release: dict[str, Any], truth: np.ndarray, shuffled: np.ndarray, sim: np.ndarray,
         batches: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    d = release["details"]
    mine = [b for b in batches if b["slot"] == release["slot"]]
    return {"slot": release["slot"], "strategy": release["strategy"],
            "mae_shuffled": float(np.abs(shuffled - truth).mean()),
            "mae_simulated": float(np.abs(sim - truth).mean()), "stderr": d["stderr"],
            "n": [b["n"] for b in mine], "levels": [b["level"] for b in mine]}  # fmt: skip


def format_report(r: dict[str, Any]) -> str:
    p = r["params"]
    lines = [f"SaO2 behind a shuffler: {p['users']:,} devices, d={p['cells']} cells, "
             f"{p['horizons']} horizons of T={p['window']}",
             "slot  strategy   MAE shuffled  MAE simulated  stated SE  batches (level: n)",
             "----  ---------  ------------  -------------  ---------  ------------------"]  # fmt: skip
    for row in r["rows"]:
        se = "-" if row["stderr"] is None else f"{row['stderr']:.4f}"
        sizes = ", ".join(f"{h}: {n}" for h, n in zip(row["levels"], row["n"], strict=True))
        lines.append(f"{row['slot']:>4}  {row['strategy']:<9}  {row['mae_shuffled']:>12.4f}  "
                     f"{row['mae_simulated']:>13.4f}  {se:>9}  {sizes}")  # fmt: skip
    central = ", ".join(f"{e:.3f}" for e in r["epsilon_central"])
    lines += ["",
              f"MAE over all slots: shuffled {r['mae_shuffled']:.4f}, ldp-simulated {r['mae_simulated']:.4f}",
              f"privacy: ε = {r['epsilon_local']:g} per horizon on the device, ε_life = "
              f"{r['epsilon_life']:g}; stated central ε_c per level (Lemma 3.4 at the manifests' n): {central}",
              f"shuffler: {r['batches']} batches, sizes {r['batch_sizes'][0]}–{r['batch_sizes'][-1]}, "
              f"policies {', '.join(r['policies'])}",
              f"throughput: {r['reports']:,} reports written in {r['writing_seconds']:.1f} s; devices → "
              f"shuffler → server → last release in {r['end_to_end_seconds']:.1f} s "
              f"({r['reports_per_second']:,.0f} reports/s end to end)"]  # fmt: skip
    return "\n".join(lines)


def _plot(out: Path, truth: np.ndarray, shuffled: np.ndarray, sim: np.ndarray,
          p: ShuffleParams) -> Path:  # fmt: skip
    from privstream.experiments import plots

    return plots.plot_releases(
        truth[:, 0],
        {"ldp-shuffled": shuffled[:, 0], "ldp-simulated": sim[:, 0]},
        out / f"{STREAM}.png",
        title=f"SaO2, n={p.users:,}: share of users in cell 0 vs the releases (ε_life={p.epsilon:g})",
        ylabel="share in cell 0",
    )
