"""DPI's queries, score and the two updates of its sampling distributions (spec ``dpi.md``
§3.1, §3.6, §3.11-A).

* ``public_prior`` (production, spec §3.11-A): each draw is an exponential mechanism over a
  public candidate set, so its nominal account is a rigorous bound. A query is chosen with
  ``P(q) ∝ π_Q(q)·exp(α_Q·(−g_q))`` (badly answered queries gain weight, score sensitivity
  ``s_g``), ``α_Q = ε_Q/(2 s_g)``; then ``M`` candidates are drawn from the public prior
  ``π_t(q)`` of pool indices, independently of the data, and each of the ``n_A`` released
  synopses is drawn from ``exp(α_A·g(a))`` over them, ``α_A = ε_A/(2 s_g n_A)``. The slot
  costs ``ε_Q + n_A·2 s_g α_A = ε_t`` by basic composition. The priors move only towards what
  was released (``π ← (1−κ)π + κ·released``): post-processing.
* ``paper`` (Algorithm 1, reproduction only): multiplicative weights on log-weights ``L_Q``,
  ``L_A`` with the paper's per-round charge (Theorem 5.1). Under the standard analysis a draw's
  loss grows with the cumulative step sizes (A9, A31), so its outputs are marked ``evaluation``
  and its ledger carries the conservative account beside the nominal one (§3.10).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.dpi_pool import SynopsisPool

Query = Literal["acc", "inst", "mean"]
QUERIES: Final[tuple[Query, ...]] = ("acc", "inst", "mean")
FloatArray = NDArray[np.float64]


def normalized(counts: NDArray[np.float64] | NDArray[np.int64]) -> FloatArray:
    """A histogram as a PDF; the uniform PDF when it is empty (spec §3.1: an empty slot is
    processed like any other, so the public ε_t sequence never shows it was empty)."""
    total = float(np.sum(counts))
    k = counts.shape[0]
    if total <= 0:
        return np.full(k, 1.0 / k)
    return np.asarray(counts, dtype=np.float64) / total


def smoothed(counts: NDArray[np.int64], prior_mass: float) -> FloatArray:
    """``(h + N₀·u)/(‖h‖₁ + N₀)`` (spec §3.11-B, a uniform public prior of mass ``N₀``)."""
    if prior_mass <= 0:
        return normalized(counts)
    k = counts.shape[0]
    return np.asarray(
        (counts + prior_mass / k) / (float(counts.sum()) + prior_mass), dtype=np.float64
    )


def score(d: FloatArray, lam: float, mu: float) -> FloatArray:
    """``g(d)``: +1 when ``d ≤ λ``, −1 when ``d ≥ λ+μ``, linear in between (spec §3.1, A7:
    if/elif/else, so g stays in [−1, 1] and is continuous at λ and λ+μ). The branches are
    explicit: the linear formula alone rounds to −1 + 4.4e−16 at ``d = λ+μ`` (0.2 + 0.05)."""
    d = np.asarray(d, dtype=np.float64)
    between = np.clip(1.0 - 2.0 * (d - lam) / mu, -1.0, 1.0)
    return np.where(d <= lam, 1.0, np.where(d >= lam + mu, -1.0, between))


def softmax(log_weights: FloatArray) -> FloatArray:
    """A distribution from log-weights, the maximum subtracted first (no overflow)."""
    z = np.exp(log_weights - log_weights.max())
    return np.asarray(z / z.sum(), dtype=np.float64)


@dataclass
class Drawn:
    """One slot's draw: the query, its released PDF and the pool indices it averaged."""

    query: int
    release: FloatArray
    synopses: NDArray[np.int64]


def exponential_choice(
    base: FloatArray,
    scores: FloatArray,
    alpha: float,
    rng: np.random.Generator,
    size: int,
    distinct: bool = False,
) -> NDArray[np.int64]:
    """``size`` draws from ``P(i) ∝ base(i)·exp(α·score(i))``: an exponential mechanism
    costing ``2·α·Δ(score)`` per draw. ``distinct``: without replacement — each draw is that
    exponential mechanism over the items not drawn yet, so the cost per draw is the same."""
    p = softmax(np.log(np.maximum(base, 1e-300)) + alpha * scores)
    return np.asarray(rng.choice(p.shape[0], size=size, p=p, replace=not distinct), dtype=np.int64)


def public_prior_draw(
    pool: SynopsisPool,
    targets: list[FloatArray],
    last: list[FloatArray],
    priors: tuple[FloatArray, FloatArray],
    alphas: tuple[float, float],
    sizes: tuple[int, int],
    params: tuple[float, float],
    rngs: tuple[np.random.Generator, np.random.Generator, np.random.Generator],
) -> Drawn:
    """Spec §3.11-A for one slot (``k_Q = 1``): the query by an exponential mechanism on how
    badly its last release answers it, then ``n_A`` synopses by exponential mechanisms over
    ``M`` candidates drawn from the public prior of that query. ``targets`` are the true PDFs
    ``y_q`` (curator side), ``last`` each query's last release (public)."""
    (query_prior, synopsis_prior), (alpha_q, alpha_a) = priors, alphas
    (candidates, n_a), (lam, mu) = sizes, params
    badly = -score(
        np.array([np.abs(y - r).sum() for y, r in zip(targets, last, strict=True)]), lam, mu
    )
    q = int(exponential_choice(query_prior, badly, alpha_q, rngs[0], 1)[0])
    prior = synopsis_prior[q]
    # distinct candidates and distinct released synopses: a repeated synopsis in the mean of
    # n_A would only add variance (the prior concentrates on what was released)
    size = min(candidates, int(np.count_nonzero(prior)))
    pool_ids = np.asarray(
        rngs[1].choice(prior.shape[0], size=size, p=prior, replace=False), dtype=np.int64
    )
    g = score(pool.l1_errors(pool_ids, targets[q]), lam, mu)
    chosen = pool_ids[
        exponential_choice(np.ones(size), g, alpha_a, rngs[2], min(n_a, size), distinct=True)
    ]
    return Drawn(q, pool.mean_of(chosen), chosen)


def move_prior(prior: FloatArray, chosen: NDArray[np.int64], rate: float) -> FloatArray:
    """``π ← (1−κ)·π + κ·(empirical distribution of the released indices)``: post-processing
    of a release, so the next slot's candidates stay public."""
    released = np.bincount(chosen, minlength=prior.shape[0]) / chosen.shape[0]
    return np.asarray((1.0 - rate) * prior + rate * released, dtype=np.float64)


def paper_draw(
    pool: SynopsisPool,
    log_q: FloatArray,
    log_a: FloatArray,
    n_a: int,
    rngs: tuple[np.random.Generator, np.random.Generator],
) -> Drawn:
    """Algorithm 1 lines 6–11: a query from ``softmax(L_Q)``, ``n_A`` i.i.d. pool indices from
    ``softmax(L_A[q])``, released before the update (``release_timing = pre``)."""
    q = int(rngs[0].choice(log_q.shape[0], p=softmax(log_q)))
    chosen = np.asarray(
        rngs[1].choice(log_a.shape[1], size=n_a, p=softmax(log_a[q])), dtype=np.int64
    )
    return Drawn(q, pool.mean_of(chosen), chosen)


def paper_update(
    pool: SynopsisPool,
    drawn: Drawn,
    target: FloatArray,
    logs: tuple[FloatArray, FloatArray],
    alphas: tuple[float, float],
    params: tuple[float, float],
) -> None:
    """Algorithm 1 lines 13–17 (signs of A1, incremental form of A3): accurate synopses gain
    weight, badly answered queries gain weight. ``logs`` are updated in place."""
    (log_q, log_a), (alpha_q, alpha_a), (lam, mu) = logs, alphas, params
    distinct = np.unique(drawn.synopses)
    log_a[drawn.query, distinct] += alpha_a * score(pool.l1_errors(distinct, target), lam, mu)
    answered = score(np.array([np.abs(target - drawn.release).sum()]), lam, mu)[0]
    log_q[drawn.query] -= alpha_q * answered
