"""The papers' published numbers that the benchmarks and reproduction tests compare against.

LDP-IDS (Ren et al.): Table 2's bits per user and an independent simulation's MRE values;
personalized w-event (Du et al.): the AMRE reductions of the evaluation and its headlines.
The bench prints its own numbers beside these (``bench/README.md``).
"""

from __future__ import annotations

from typing import Final

MECHANISM_ORDER: Final = ("LBU", "LSP", "LPU", "LBD", "LBA", "LPD", "LPA")
PERSONALIZED_ORDER: Final = ("BD", "BA", "PLBU", "PBD", "PBA")  # the paper's comparison set

# Spec §5.5.1 (paper Table 2): time-average bits per user on the synthetic streams, keyed by
# (ε, w, dataset), then mechanism. The reproduction targets.
_TABLE2_COLUMNS = ("LBU", "LBD", "LBA", "LSP", "LPU", "LPD", "LPA")
_TABLE2_ROWS: dict[tuple[float, int, str], tuple[float, ...]] = {
    (1.0, 20, "lns"): (1.0, 1.5585, 1.3410, 0.1, 0.1, 0.0912, 0.0804),
    (1.0, 20, "sin"): (1.0, 1.5516, 1.3380, 0.1, 0.1, 0.0913, 0.0806),
    (1.0, 20, "log"): (1.0, 1.5572, 1.3284, 0.1, 0.1, 0.0915, 0.0803),
    (2.0, 20, "lns"): (1.0, 1.5500, 1.3540, 0.1, 0.1, 0.0934, 0.0825),
    (2.0, 20, "sin"): (1.0, 1.5410, 1.3580, 0.1, 0.1, 0.0933, 0.0828),
    (2.0, 20, "log"): (1.0, 1.5540, 1.3368, 0.1, 0.1, 0.0937, 0.0822),
    (2.0, 40, "lns"): (1.0, 1.5420, 1.3395, 0.05, 0.05, 0.0485, 0.0410),
    (2.0, 40, "sin"): (1.0, 1.5268, 1.3656, 0.05, 0.05, 0.0484, 0.0411),
    (2.0, 40, "log"): (1.0, 1.4832, 1.3148, 0.05, 0.05, 0.0490, 0.0414),
}
PAPER_TABLE2_BITS: dict[tuple[float, int, str], dict[str, float]] = {
    key: dict(zip(_TABLE2_COLUMNS, row, strict=True)) for key, row in _TABLE2_ROWS.items()
}

# Spec §5.5.2: the spec author's independent simulation (not paper numbers): MRE at δ = 1/n,
# both bins, mean of 5 seeds, ε = 1, w = 20, n = 200,000, T = 800. Ballpark checks only.
_CROSSCHECK_COLUMNS = ("LBU", "LBD", "LBA", "LSP", "LPU", "LPD", "LPA")
SPEC_CROSSCHECK_MRE: dict[str, dict[str, float]] = {
    "sin": dict(
        zip(_CROSSCHECK_COLUMNS, (0.304, 0.303, 0.183, 0.029, 0.065, 0.056, 0.049), strict=True)
    ),
    "log": dict(
        zip(_CROSSCHECK_COLUMNS, (0.104, 0.098, 0.062, 0.008, 0.024, 0.021, 0.018), strict=True)
    ),
}

# Spec §6.5: the paper's AMRE reductions (ε-sweep and w-sweep rows) and its two headlines.
PAPER_REDUCTIONS: Final[dict[tuple[str, str], dict[str, float]]] = {
    ("taxi", "PBD/BD"): {"epsilon": 0.708, "window": 0.631},
    ("foursquare", "PBD/BD"): {"epsilon": 0.696, "window": 0.684},
    ("tlns", "PBA/BA"): {"epsilon": 0.369, "window": 0.351},
    ("sin", "PBA/BA"): {"epsilon": 0.277, "window": 0.042},
    ("log", "PBA/BA"): {"epsilon": 0.289, "window": 0.166},
}
PAPER_HEADLINES: Final = {"PBD/BD real data": 0.68, "PBA/BA synthetic data": 0.249}
