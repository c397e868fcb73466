"""Shuffle amplification of SaO2's ε0-LDP reports: the central (ε_c, δ) a shuffler buys (spec
sao2 §7, §1.3, §9 A22–A25, A32, A34, A35; paper §3.2, §6, App. D–E).

Behind a shuffler the analyst sees the ``n`` users' reports as an unordered multiset. Every
ε0-LDP report is, with probability ``e^{−ε0}``, a *clone* of the differing user's report (FMT'21,
"hiding among the clones"), so the multisets of neighbouring datasets are (ε_c, δ)-close with
ε_c ≪ ε0 once there are many clones. This module states that ε_c five ways:

``fmt_closed``
    FMT'21 Thm 3.1's closed form. Proven; loosest. Valid for ``ε0 ≤ log(n/(16 log(2/δ)))``.
``classical``
    The paper's Lemma 3.4 (FMT's clone bound through the δ/2 lower tail ``Φ`` of the clone
    count; the "+1" outside the square root, spec §7.1). Proven for any ε0-LDP randomiser: the
    bound a release states in its ledger (method ``classical-7.1``).
``numerical``
    The exact hockey-stick divergence of Lemma 3.4's reduced pair (spec §7.3), bisected for the
    smallest ε with ``δ(ε) ≤ δ``. As proven as ``classical`` (same lemma, no tail bounds) and
    tighter; a ledger may state it as ``numeric-7.3``.
``online``
    The paper's Lemma 6.1 + Thm 6.2 for online shuffling of (d', s, ε0, m = 2)-ExSub, through
    ``Φ' = Φ + n·p_cc/2``. Reproduction only, never the ledger: the spec calls it unverified
    (A23), and Lemma 6.1 is in fact false as stated (``collaborative_clone_cap``: at Fig. 2's
    setting any mixture of its form has ``p_cc ≤ 0.0126``, the paper's is 0.146). Falls back
    to ``classical`` when ``m ≠ 2`` (A34) or a precondition fails.
``numerical_online``
    The exact hockey-stick with the clone count of Lemma 6.1's ``Paired`` process; rests on
    Lemma 6.1 too: reproduction only.

``n`` is the number of users whose reports share one randomiser and output space: in SaO2 the
users of one hierarchy level, ``n_h = n·W_h`` (spec §7, A35). Using the global ``n`` overstates
the amplification. Everything here is a function of public parameters only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

METHODS = ("fmt_closed", "classical", "online", "numerical", "numerical_online")
Clones = Literal["classical", "online"]
_TOLERANCE = 1e-7  # bisection width on ε; the verified (upper) end is returned


@dataclass(frozen=True)
class ShuffleSetting:
    """The public parameters of one shuffled batch.

    ``epsilon0``: each report's local ε; ``delta``: the central δ; ``n``: users sharing the
    randomiser (``n_h``); ``d_prime``, ``s``, ``m``: the ExSub domain, sparsity and output size
    (only the online bounds use them)."""

    epsilon0: float
    delta: float
    n: int
    d_prime: int | None = None
    s: int | None = None
    m: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon0) and self.epsilon0 > 0):
            raise ValueError(f"epsilon0 must be a finite number > 0, got {self.epsilon0!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")
        if self.n < 2:
            raise ValueError(f"n must be at least 2 users, got {self.n!r}")
        if (self.d_prime is None) != (self.s is None):
            raise ValueError("d_prime and s go together: give both or neither")
        if self.s is not None and self.d_prime is not None and not 1 <= self.s <= self.d_prime:
            raise ValueError(f"need 1 <= s <= d', got s = {self.s}, d' = {self.d_prime}")
        if self.m is not None and not 1 <= self.m <= (self.d_prime or self.m):
            raise ValueError(f"need 1 <= m <= d', got m = {self.m}, d' = {self.d_prime}")


@dataclass(frozen=True)
class Bound:
    """One method's ε_c. ``applicable`` is False when the method's preconditions fail: then
    ``epsilon`` is what it falls back to (ε0; ``classical`` for ``online``; ``numerical`` for
    ``numerical_online``) and ``note`` says why."""

    name: str
    epsilon: float
    applicable: bool
    note: str


# -- clone counts ----------------------------------------------------------------------------


def clone_tail(n: int, epsilon0: float, delta: float) -> float:
    """``Φ = n/e^{ε0} − sqrt(3 n log(4/δ)/e^{ε0})`` (paper Lemma 3.4): the δ/2 lower bound on
    the clone count ``C ~ Bin(n−1, e^{−ε0})`` of classical shuffling."""
    return n / math.exp(epsilon0) - math.sqrt(3 * n * math.log(4 / delta) / math.exp(epsilon0))


def omega_m2(d_prime: int, s: int, epsilon: float) -> float:
    """ExSub's normaliser at ``m = 2`` (spec §4.2, §7.2): ``C1 − (1−e^{−ε})·C2`` with exact
    integer counts ``C1 = 4·C(d',2)`` and ``C2 = 4·C(d'−s,2) + 2s(d'−s) + C(s,2)``."""
    c1 = 4 * math.comb(d_prime, 2)
    c2 = 4 * math.comb(d_prime - s, 2) + 2 * s * (d_prime - s) + math.comb(s, 2)
    return c1 - (1 - math.exp(-epsilon)) * c2


def collaborative_clone_probability(d_prime: int, s: int, epsilon: float) -> float:
    """``p_cc`` of Lemma 6.1 (spec §7.2), the exact printed formula (not the ~15× looser
    approximation the paper quotes, A24):
    ``d'(d'−1)/e^ε · ((s + (2d'−s−e^ε−2)(e^{−ε}−e^{−2ε})) / Ω)²``.

    Caveat (A23): Lemma D.1, its proof and Lemma 6.1 give three different numerators, and the
    proof's residual ``W_x(x_j)`` holds a symbol of ``x`` with mass only ``s/Ω`` (``(s−1)/Ω``
    when its reverse is in ``x_j``), far below Lemma D.1's bound. This ``p_cc`` exceeds what
    any mixture of Lemma 6.1's form allows (``collaborative_clone_cap``)."""
    e = math.exp(-epsilon)
    top = s + (2 * d_prime - s - math.exp(epsilon) - 2) * (e - e * e)
    return d_prime * (d_prime - 1) * e * (top / omega_m2(d_prime, s, epsilon)) ** 2


def collaborative_clone_cap(d_prime: int, s: int, epsilon: float) -> float:
    """The largest ``p_cc`` any mixture of Lemma 6.1's form can have; the printed
    ``collaborative_clone_probability`` exceeds it (0.146 against 0.0126 at d' = 1000, s = 20,
    ε = 1), so Lemma 6.1 is false as stated.

    Proof. Take ``x_1 = x'_1 = a`` (the lemma claims every choice in ``{a, b}``), a symbol
    ``σ`` of ``a`` and inputs ``x_j, x_{j+1}`` without ``σ``'s coordinate. Then ``σ`` is in
    ``K(x_j)`` with probability ``p_f`` and in ``K(a)`` with ``p_t`` (spec §4.5), so in the
    online-shuffled pair with ``1 − (1−p_f)²``. In the mixture it is there with at least
    ``e^{−2ε}(1 − (1−p_t)²)`` from the first part and ``w·p_t`` from the second (it holds a
    ``K(a)``), ``w = 2(1−e^{−ε})e^{−ε} + p_cc``. Hence
    ``p_cc ≤ (1 − (1−p_f)² − e^{−2ε}(1 − (1−p_t)²))/p_t − 2(1−e^{−ε})e^{−ε}``. At m = 2,
    ``p_t = A/Ω``, ``p_f = (A − (1−e^{−ε})C_f)/Ω`` with ``A = 2(d'−1)``, ``C_f = 2(d'−s−1) + s``.
    Needs ``d' > s`` (a coordinate outside both supports)."""
    omega, e = omega_m2(d_prime, s, epsilon), math.exp(-epsilon)
    a, c_f = 2 * (d_prime - 1), 2 * (d_prime - s - 1) + s
    p_t, p_f = a / omega, (a - (1 - e) * c_f) / omega
    held = -math.expm1(2 * math.log1p(-p_f)) - e * e * -math.expm1(2 * math.log1p(-p_t))
    return held / p_t - 2 * (1 - e) * e


def online_clone_tail(n: int, epsilon0: float, delta: float, d_prime: int, s: int) -> float:
    """``Φ' = Φ + n·p_cc/2`` (paper Thm 6.2): the δ/2 lower bound on the clone count the paper
    claims for online shuffling of (d', s, ε0, 2)-ExSub. The mean of that count is about
    ``n/e^{ε0} + n·p_cc/2`` (App. E calls it the mean of one ``Paired``, A32). Rests on Lemma
    6.1, which fails as stated (``collaborative_clone_cap``)."""
    return (
        clone_tail(n, epsilon0, delta)
        + n * collaborative_clone_probability(d_prime, s, epsilon0) / 2
    )


def epsilon_from_clone_tail(phi: float, epsilon0: float, delta: float) -> float:
    """Lemma 3.4's ε_c from a δ/2 lower bound ``phi`` on the clone count (spec §7.1):
    ``log(1 + (e^{ε0}−1)/(e^{ε0}+1) · (2·sqrt(L·Φ/2) + 1) / (Φ/2 − sqrt(L·Φ/2)))``,
    ``L = log(4/δ)``. Without amplification (``Φ ≤ 2L``) it is ε0; never more than ε0."""
    big_l = math.log(4 / delta)
    if phi <= 2 * big_l:
        return epsilon0
    root = math.sqrt(big_l * phi / 2)
    factor = (math.exp(epsilon0) - 1) / (math.exp(epsilon0) + 1)
    return min(epsilon0, math.log1p(factor * (2 * root + 1) / (phi / 2 - root)))


# -- closed-form bounds ----------------------------------------------------------------------


def fmt_closed_bound(epsilon0: float, n: int, delta: float) -> Bound:
    """FMT'21 Thm 3.1 (spec §7.1, reference closed form): ``log(1 + (e^{ε0}−1)/(e^{ε0}+1) ·
    (8 sqrt(e^{ε0} log(4/δ))/sqrt(n) + 8 e^{ε0}/n))`` for ``ε0 ≤ log(n/(16 log(2/δ)))``; ε0
    otherwise. Proven (FMT'21)."""
    limit = math.log(n / (16 * math.log(2 / delta)))
    if epsilon0 > limit:
        why = f"FMT'21 Thm 3.1 needs epsilon0 <= {limit:.4g}"
        return Bound("fmt_closed", epsilon0, False, f"not applicable ({why}); epsilon0")
    e0 = math.exp(epsilon0)
    spread = 8 * math.sqrt(e0 * math.log(4 / delta)) / math.sqrt(n) + 8 * e0 / n
    value = math.log1p((e0 - 1) / (e0 + 1) * spread)
    return Bound("fmt_closed", min(value, epsilon0), True, "FMT'21 Thm 3.1")


def classical_bound(epsilon0: float, n: int, delta: float) -> Bound:
    """Lemma 3.4 (spec §7.1): ``epsilon_from_clone_tail(Φ)``. Holds for classical and, since
    online-shuffled output is a function of the classically shuffled one (spec §1.3), for online
    shuffling: the ε_c a SaO2 release states (with ``n = n_h``)."""
    phi = clone_tail(n, epsilon0, delta)
    if phi <= 2 * math.log(4 / delta):
        why = "Phi <= 2 log(4/delta): no amplification"
        return Bound("classical", epsilon0, False, f"not applicable ({why}); epsilon0")
    return Bound("classical", epsilon_from_clone_tail(phi, epsilon0, delta), True, "Lemma 3.4")


def paired_preconditions(setting: ShuffleSetting) -> str | None:
    """Why Lemma 6.1's ``Paired`` clone count does not apply (None: it does): it needs ExSub's
    ``d'``, ``s`` and ``m = 2`` (A34), and ``p_cc ≤ (1 − e^{−ε0})²`` (App. E assumes it;
    otherwise the lemma's "else" weight ``(1−e^{−ε0})² − p_cc`` is negative: the printed
    ``p_cc`` cannot be right there, which happens at small ε0 or large s/d', e.g. d' = 1000,
    s = 20, ε0 ≤ 0.1)."""
    if setting.d_prime is None or setting.s is None or setting.m is None:
        return "needs d', s and m"
    if setting.m != 2:
        return f"Lemma 6.1 covers m = 2 only, got m = {setting.m}"
    if setting.d_prime < 2:
        return "m = 2 needs d' >= 2"
    p_cc = collaborative_clone_probability(setting.d_prime, setting.s, setting.epsilon0)
    if p_cc > (1 - math.exp(-setting.epsilon0)) ** 2:
        return f"p_cc = {p_cc:.4g} exceeds (1 - e^-epsilon0)^2"
    return None


def online_preconditions(setting: ShuffleSetting) -> str | None:
    """Why Thm 6.2 does not apply to ``setting`` (None: it applies): ``paired_preconditions``,
    ``n ≥ 16 e^{ε0} log(4/δ)`` and ``ε0 ≤ log 3``."""
    why = paired_preconditions(setting)
    if why is not None:
        return why
    floor = 16 * math.exp(setting.epsilon0) * math.log(4 / setting.delta)
    if setting.n < floor:
        return f"Thm 6.2 needs n >= {floor:.1f}"
    if setting.epsilon0 > math.log(3):
        return "Thm 6.2 needs epsilon0 <= log 3"
    return None


def online_bound(setting: ShuffleSetting) -> Bound:
    """Lemma 6.1 + Thm 6.2 (spec §7.2): ``epsilon_from_clone_tail(Φ')``; where a precondition
    fails (``online_preconditions``), the ``classical`` bound.

    The paper claims this is strictly below ``classical`` for online shuffling of m = 2 ExSub.
    Its proof is incomplete (A23: Lemma D.1's case analysis misses the reference input's own
    symbols, whose residual mass is far below the claimed bound; three different numerators of
    ``p_cc``) and Lemma 6.1 is false as stated (``collaborative_clone_cap``), so we state it for
    reproduction only, never for the ledger. Lemma 6.1's printed middle weight
    ``2(1−e^{ε})/e^{ε}`` is read as ``2(1−e^{−ε})e^{−ε}`` (A22)."""
    why = online_preconditions(setting)
    if why is not None:
        fallback = classical_bound(setting.epsilon0, setting.n, setting.delta).epsilon
        return Bound("online", fallback, False, f"not applicable ({why}); classical")
    assert setting.d_prime is not None and setting.s is not None
    phi = online_clone_tail(setting.n, setting.epsilon0, setting.delta, setting.d_prime, setting.s)
    value = epsilon_from_clone_tail(phi, setting.epsilon0, setting.delta)
    return Bound("online", value, True, "Lemma 6.1 + Thm 6.2 as printed: reproduction only")


# -- the exact (numerical) accountant --------------------------------------------------------


@dataclass(frozen=True)
class ClonePmf:
    """The law of the clone count ``C`` on a window: ``pmf[i] = P[C = offset + i]``;
    ``missing`` is the mass left outside it (charged to δ as fully distinguishing)."""

    offset: int
    pmf: NDArray[np.float64]
    missing: float


@functools.cache
def _binom() -> Any:
    """``scipy.stats.binom``, imported when an exact bound is computed: ``scipy.stats`` costs
    about half a second of every process's start (each flow process and cluster launcher
    loads every family, SaO2 among them), and only the numerical bounds need it."""
    from scipy import stats

    return stats.binom


def _window(trials: int, p: float, tail: float) -> tuple[int, int]:
    """A range of ``Bin(trials, p)`` leaving about ``tail`` on either side (each upper quantile
    from the mirrored law's lower one: scipy's ``isf`` returns ``trials`` for tiny tails). Only
    tightness depends on it: callers charge the mass outside exactly."""
    binom = _binom()
    lo = max(int(binom.ppf(tail, trials, p)) - 1, 0)
    hi = min(trials - int(binom.ppf(tail, trials, 1 - p)) + 1, trials)
    return lo, hi


def binomial_clones(n: int, epsilon0: float, tail: float) -> ClonePmf:
    """``C ~ Bin(n−1, e^{−ε0})`` (classical shuffling, Lemma 3.4), on the window that leaves
    at most ``tail`` on either side."""
    binom = _binom()
    trials, p = n - 1, math.exp(-epsilon0)
    lo, hi = _window(trials, p, tail)
    counts = np.arange(lo, hi + 1)
    missing = float(binom.cdf(lo - 1, trials, p) + binom.sf(hi, trials, p))
    return ClonePmf(lo, binom.pmf(counts, trials, p), missing)


def paired_clones(n: int, epsilon0: float, p_cc: float, tail: float) -> ClonePmf:
    """``C = Σ_{i=1}^{⌊(n−1)/2⌋} Paired_i`` (Lemma 6.1, spec §7.2): each pair gives 2 clones
    with probability ``e^{−2ε0}``, 1 with ``2(1−e^{−ε0})e^{−ε0} + p_cc`` (A22), else 0. The
    user left over when ``n−1`` is odd is counted as no clone (conservative, as the spec).

    Exact: ``C = 2·N2 + N1`` with ``N2 ~ Bin(N, p2)`` and ``N1 | N2 ~ Bin(N − N2, p1/(1−p2))``,
    summed over a window of both (``tail`` per side and row), rows in blocks to bound memory."""
    binom = _binom()
    pairs, p = (n - 1) // 2, math.exp(-epsilon0)
    p2, p1 = p * p, 2 * (1 - p) * p + p_cc
    if p1 + p2 > 1:
        raise ValueError(f"p_cc = {p_cc:.4g} exceeds (1 - e^-epsilon0)^2: no such mixture")
    p1c = p1 / (1 - p2)
    lo2, hi2 = _window(pairs, p2, tail)
    missing = float(binom.cdf(lo2 - 1, pairs, p2) + binom.sf(hi2, pairs, p2))
    pmf = np.zeros(2 * pairs + 1)
    for start in range(lo2, hi2 + 1, 256):
        n2 = np.arange(start, min(start + 256, hi2 + 1))
        rest, weight = pairs - n2, binom.pmf(n2, pairs, p2)
        lo1, hi1 = _window(int(rest[-1]), p1c, tail)[0], _window(int(rest[0]), p1c, tail)[1]
        n1 = np.arange(lo1, hi1 + 1)
        grid = weight[:, None] * binom.pmf(n1[None, :], rest[:, None], p1c)
        at = (2 * n2[:, None] + n1[None, :]).ravel()
        pmf += np.bincount(at, weights=grid.ravel(), minlength=pmf.size)[: pmf.size]  # n1 ≤ rest
        outside = binom.cdf(lo1 - 1, rest, p1c) + binom.sf(hi1, rest, p1c)
        missing += float(np.dot(weight, outside))
    used = np.flatnonzero(pmf)
    return ClonePmf(int(used[0]), pmf[used[0] : used[-1] + 1], missing)


def hockey_stick(clones: ClonePmf, epsilon0: float, epsilon: float) -> float:
    """``δ(ε)`` of Lemma 3.4's pair ``P = (A+B, C−A+1−B)``, ``Q = (A+1−B, C−A+B)`` with
    ``A ~ Bin(C, ½)``, ``B ~ Bern(q)``, ``q = e^{ε0}/(e^{ε0}+1)`` (spec §7.3):
    ``Σ_c P[C=c] Σ_k max(0, P_c(k) − e^ε Q_c(k))``, plus ``clones.missing``.

    ``P_c(k)/Q_c(k)`` grows with ``k``, so the inner sum is a tail: for the threshold ``t``,
    ``Σ_{k≥t} (P_c − e^ε Q_c) = α·b_c(t−1) + (1−e^ε)·P[X ≥ t]`` with ``X ~ Bin(c, ½)``,
    ``b_c`` its pmf and ``α = q − e^ε(1−q)``; the best ``t`` is found in closed form and its
    neighbours are tried too, against rounding."""
    binom = _binom()
    q = math.exp(epsilon0) / (math.exp(epsilon0) + 1)
    alpha, beta = q - math.exp(epsilon) * (1 - q), math.exp(epsilon) * q - (1 - q)
    if alpha <= 0:  # ε ≥ ε0: the pair is ε0-indistinguishable
        return clones.missing
    c = clones.offset + np.arange(clones.pmf.size)
    rho = beta / alpha
    first = np.floor(rho * (c + 1) / (1 + rho)).astype(np.int64) + 1
    best = np.zeros(c.size)
    for shift in (-1, 0, 1):
        t = np.clip(first + shift, 0, c + 1)
        mass = alpha * binom.pmf(t - 1, c, 0.5) + (1 - math.exp(epsilon)) * binom.sf(t - 1, c, 0.5)
        best = np.maximum(best, mass)
    return float(np.dot(clones.pmf, best)) + clones.missing


def smallest_epsilon(delta_of: Callable[[float], float], epsilon0: float, delta: float) -> float:
    """The smallest ε in ``[0, ε0]`` with ``delta_of(ε) ≤ δ``, by bisection on the
    non-increasing ``delta_of``, to ``_TOLERANCE``; the verified (upper) end is returned."""
    lo, hi = 0.0, epsilon0
    if delta_of(hi) > delta:
        return epsilon0
    while hi - lo > _TOLERANCE:
        mid = (lo + hi) / 2
        if delta_of(mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def clone_law(setting: ShuffleSetting, clones: Clones) -> ClonePmf:
    """The clone count's law for ``numerical`` (``classical``) or ``numerical_online``."""
    tail = max(setting.delta * 1e-6, 1e-100)
    if clones == "classical":
        return binomial_clones(setting.n, setting.epsilon0, tail)
    assert setting.d_prime is not None and setting.s is not None
    p_cc = collaborative_clone_probability(setting.d_prime, setting.s, setting.epsilon0)
    return paired_clones(setting.n, setting.epsilon0, p_cc, tail)


def numerical_bound(setting: ShuffleSetting, clones: Clones = "classical") -> Bound:
    """The smallest ε with ``hockey_stick(ε) ≤ δ`` (spec §7.3). ``classical``: exact for Lemma
    3.4's pair, so as proven as ``classical_bound`` and never above it. ``online``: the same
    with the ``Paired`` clone count of Lemma 6.1 (m = 2 only), which fails as stated:
    reproduction only; where it does not apply, the classical numerical bound."""
    if clones == "online" and (why := paired_preconditions(setting)) is not None:
        fallback = numerical_bound(setting).epsilon
        return Bound("numerical_online", fallback, False, f"not applicable ({why}); numerical")
    law = clone_law(setting, clones)
    value = smallest_epsilon(
        lambda eps: hockey_stick(law, setting.epsilon0, eps), setting.epsilon0, setting.delta
    )
    name, note = (
        ("numerical", "exact hockey-stick of Lemma 3.4's pair")
        if clones == "classical"
        else ("numerical_online", "exact hockey-stick, Lemma 6.1's clones: reproduction only")
    )
    return Bound(name, value, True, note)


# -- every bound at once ---------------------------------------------------------------------


@dataclass(frozen=True)
class ShuffleReport:
    """Every bound of one setting, with the clone-count tails: ``phi`` (Φ), ``phi_online``
    (Φ′; None without d' and s, or with ``m ≠ 2``), their ``ratio``, the printed ``p_cc`` and
    the most any mixture of Lemma 6.1's form allows (``p_cc_cap``). ``bounds`` in ``METHODS``
    order."""

    setting: ShuffleSetting
    phi: float
    phi_online: float | None
    p_cc: float | None
    p_cc_cap: float | None
    bounds: tuple[Bound, ...]
    STATED: ClassVar[str] = "classical"  # the bound a release's ledger states (spec §7.2)

    @property
    def ratio(self) -> float | None:
        """``Φ′/Φ``: how many more clones online shuffling claims (None when not defined)."""
        if self.phi_online is None or self.phi <= 0:
            return None
        return self.phi_online / self.phi

    def bound(self, name: str) -> Bound:
        return next(b for b in self.bounds if b.name == name)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form (``privstream accountant shuffle --json``)."""
        return {
            "setting": dataclasses.asdict(self.setting),
            "stated": self.STATED,
            "phi": self.phi,
            "phi_online": self.phi_online,
            "phi_ratio": self.ratio,
            "p_cc": self.p_cc,
            "p_cc_cap": self.p_cc_cap,
            "bounds": {
                b.name: {"epsilon": b.epsilon, "applicable": b.applicable, "note": b.note}
                for b in self.bounds
            },
        }


def shuffle_bounds(setting: ShuffleSetting) -> ShuffleReport:
    """Every method of ``METHODS`` for ``setting`` (module docstring says which one to state)."""
    e0, n, delta = setting.epsilon0, setting.n, setting.delta
    phi_online = p_cc = cap = None
    d_prime, s = setting.d_prime, setting.s
    if d_prime is not None and s is not None and d_prime >= 2 and setting.m in (None, 2):
        p_cc = collaborative_clone_probability(d_prime, s, e0)
        cap = collaborative_clone_cap(d_prime, s, e0) if s < d_prime else None
        phi_online = online_clone_tail(n, e0, delta, d_prime, s)
    bounds = (
        fmt_closed_bound(e0, n, delta),
        classical_bound(e0, n, delta),
        online_bound(setting),
        numerical_bound(setting),
        numerical_bound(setting, "online"),
    )
    return ShuffleReport(setting, clone_tail(n, e0, delta), phi_online, p_cc, cap, bounds)


def amplify(method: str, eps0: float, n: int, delta: float, **params: int) -> float:
    """``ε_c`` of ``method`` (one of ``METHODS``) for ``n`` users at local ``eps0`` (spec §7's
    interface); ``params``: ``d_prime``, ``s``, ``m`` for the online methods. A method whose
    preconditions fail returns its fallback (``Bound.note``)."""
    setting = ShuffleSetting(eps0, delta, n, **params)
    if method == "fmt_closed":
        return fmt_closed_bound(eps0, n, delta).epsilon
    if method == "classical":
        return classical_bound(eps0, n, delta).epsilon
    if method == "online":
        return online_bound(setting).epsilon
    if method in ("numerical", "numerical_online"):
        clones: Clones = "classical" if method == "numerical" else "online"
        return numerical_bound(setting, clones).epsilon
    raise ValueError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
