"""LDP-IDS Fig. 11 (spec ldp-ids §5.5 item 9): the adapted stream algorithms against the
paper's own at ε = 1, w = 30 on LNS, Sin and Log (n = 200,000, T = 800), mean over seeds 1–3.
The paper gives no figure values (A37), only the ordering: every LP-* variant is below its LB-*
counterpart, and the adapted algorithms can beat LBA/LPA.

On Sin and Log the ordering holds on MRE (both guards of §5.3.1) and MAE. On LNS it holds on
MAE; its MRE is decided by seed 3, whose walk comes within a few users of zero (A25), where
LB-RescueDP (all users, a large budget at rare samples) is not above LP-RescueDP — reported in
bench/README.md §1c, not asserted. Seeds: the LB/LP MAE ratios are 1.25–3 and the adapted-vs-LPA
margins 20–50 %, several per-seed standard errors apart on these fixed seeds.
"""

from __future__ import annotations

import pytest

from privstream.experiments.adapted import ADAPTED, claims, compare

N, T, SEEDS = 200_000, 800, 3


@pytest.mark.parametrize("dataset", ["lns", "sin", "log"])
def test_fig11_orderings(dataset: str) -> None:
    result = compare(dataset, N, T, SEEDS, ["LBA", "LPA", *ADAPTED])
    scores = ("mae",) if dataset == "lns" else ("mae", "mre", "mre_robust")
    for score in scores:
        held = claims(result, score)
        assert len(held) == 3 and all(held.values()), (score, held, result)
    assert result["LPA"]["mae"] < result["LBA"]["mae"]
