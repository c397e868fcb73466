"""DPI's Random Budget Allocation: which series element a slot spends (spec dpi §3.4, §3.5).

Each slot spends one unused element ε_i of the budget series (:mod:`dpi_series`), so over
infinite time the spend is at most Σ_i ε_i = ε (spec §1.5).

* **Algorithm 3** (:class:`Alg3State`): draw S ~ Exp(rate Λ) (numpy ``scale = 1/Λ``, A17) and
  take the unused index whose ε_i is nearest to S (ties to the larger index, the smaller value).
  The search is lazy over the infinite series; the used indices are an interval set; it never
  runs out.
* **Algorithm 4** (:class:`Alg4State`): index blocks (default [1, 10⁴), [10⁴, 2·10⁴),
  [2·10⁴, ∞)), each a FIFO in ascending order; each slot pops the front of a block chosen
  uniformly among the non-empty ones. With only finite blocks and all of them empty the draw is
  :data:`~dpi_series.NO_INDEX` with ε_t = 0 (``exhausted``).

Both states are small picklable objects; :func:`draw` advances one in place and returns
``(index, epsilon)``. Every index is returned at most once (I5).

**Public, and why it costs no privacy.** RBA reads only its own randomness, never user data
(spec §1.3): its draws i_t and ε_t may be published. The generator passed in should still be
the stream's keyed secret one (its state, not the data, is what it hides), so that a replayed
slot draws the same index (spec §10).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Final, NamedTuple

import numpy as np

from privstream.mechanisms.dpi_series import NO_INDEX, BudgetSeries

DEFAULT_RATE: Final = 1e8
"""Λ, the rate of Algorithm 3's exponential (mean 1/Λ; spec §2)."""
DEFAULT_BLOCKS: Final[tuple[tuple[int, int | None], ...]] = (
    (1, 10_000),
    (10_000, 20_000),
    (20_000, None),
)
"""Algorithm 4's index blocks [start, end) (None: unbounded; spec §3.5)."""


class Draw(NamedTuple):
    """One slot's series element: its index i_t (≥ 1, or 0 = no draw) and ε_t = ε_{i_t}.

    The field names are the ledger's detail keys (``series_index``; ε_t is ``epsilon``).
    """

    series_index: int
    epsilon: float

    @property
    def exhausted(self) -> bool:
        """True when no element was left to draw (Algorithm 4 with finite blocks only)."""
        return self.series_index == NO_INDEX


EXHAUSTED: Final = Draw(NO_INDEX, 0.0)


@dataclass
class Alg3State:
    """Algorithm 3's state: the series, Λ and the used indices as disjoint intervals.

    ``starts``/``ends`` are sorted, inclusive and merged (no two intervals touch), so the
    nearest unused index on either side of any i is one bisection away.
    """

    series: BudgetSeries
    rate: float = DEFAULT_RATE
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"rba_lambda (Λ) must be a finite number > 0, got {self.rate!r}")

    @property
    def n_used(self) -> int:
        """How many indices have been drawn."""
        return sum(e - s + 1 for s, e in zip(self.starts, self.ends, strict=True))

    def is_used(self, i: int) -> bool:
        """Whether index i was already drawn."""
        pos = bisect.bisect_right(self.starts, i) - 1
        return pos >= 0 and self.ends[pos] >= i

    def unused_at_or_below(self, i: int) -> int:
        """The largest unused index ≤ i, or 0 when 1 … i are all used (or i < 1)."""
        pos = bisect.bisect_right(self.starts, i) - 1
        if pos >= 0 and self.ends[pos] >= i:
            return self.starts[pos] - 1  # intervals are merged: start − 1 is unused (or 0)
        return max(i, 0)

    def unused_above(self, i: int) -> int:
        """The smallest unused index > i (always exists: the series is infinite)."""
        candidate = max(i + 1, 1)
        pos = bisect.bisect_right(self.starts, candidate) - 1
        if pos >= 0 and self.ends[pos] >= candidate:
            return self.ends[pos] + 1
        return candidate

    def mark_used(self, i: int) -> None:
        """Add the unused index i to the interval set, merging with its neighbours."""
        pos = bisect.bisect_right(self.starts, i)  # intervals [0, pos) start ≤ i
        joins_left = pos > 0 and self.ends[pos - 1] == i - 1
        joins_right = pos < len(self.starts) and self.starts[pos] == i + 1
        if joins_left and joins_right:
            self.ends[pos - 1] = self.ends[pos]
            del self.starts[pos], self.ends[pos]
        elif joins_left:
            self.ends[pos - 1] = i
        elif joins_right:
            self.starts[pos] = i
        else:
            self.starts.insert(pos, i)
            self.ends.insert(pos, i)


def nearest_unused(state: Alg3State, value: float) -> int:
    """The unused index whose ε_i is nearest to ``value`` (ties → larger index; spec §3.4).

    With i₀ = max{i : ε_i > value}, the candidates are the nearest unused index ≤ i₀ and the
    nearest unused index > i₀; ε is decreasing, so no other unused index can be nearer.
    """
    i0 = state.series.largest_index_above(value)
    above = state.unused_above(i0)  # ε_above ≤ value
    below = state.unused_at_or_below(i0)  # ε_below > value, when it exists
    if below == NO_INDEX:
        return above
    gap_below = state.series.epsilon_i(below) - value
    gap_above = value - state.series.epsilon_i(above)
    return above if gap_above <= gap_below else below


def draw_alg3(state: Alg3State, rng: np.random.Generator) -> Draw:
    """Algorithm 3: S ~ Exp(rate Λ), take the unused index nearest in value, mark it used."""
    s = float(rng.exponential(scale=1.0 / state.rate))
    i = nearest_unused(state, s)
    state.mark_used(i)
    return Draw(i, state.series.epsilon_i(i))


@dataclass
class Alg4State:
    """Algorithm 4's state: the series, the blocks [start, end) and each block's next index.

    Blocks are sorted and disjoint, start at ≥ 1, and only the last may be unbounded (None).
    """

    series: BudgetSeries
    blocks: tuple[tuple[int, int | None], ...] = DEFAULT_BLOCKS
    next_index: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.blocks = tuple((int(s), None if e is None else int(e)) for s, e in self.blocks)
        _check_blocks(self.blocks)
        if not self.next_index:
            self.next_index = [start for start, _ in self.blocks]
        if len(self.next_index) != len(self.blocks):
            raise ValueError("next_index needs one entry per block")

    def non_empty(self) -> list[int]:
        """The blocks that still have an index, in order."""
        return [
            b for b, (_, end) in enumerate(self.blocks) if end is None or self.next_index[b] < end
        ]


def _check_blocks(blocks: tuple[tuple[int, int | None], ...]) -> None:
    if not blocks:
        raise ValueError("rba4_blocks needs at least one block")
    previous_end = 1
    for b, (start, end) in enumerate(blocks):
        if start < previous_end:
            raise ValueError(
                f"rba4_blocks must be sorted, disjoint and start at ≥ 1: block {b} "
                f"[{start}, {end}) starts below {previous_end}"
            )
        if end is None and b != len(blocks) - 1:
            raise ValueError(f"only the last rba4 block may be unbounded, block {b} is")
        if end is not None and end <= start:
            raise ValueError(f"rba4 block {b} [{start}, {end}) is empty")
        previous_end = start if end is None else end


def draw_alg4(state: Alg4State, rng: np.random.Generator) -> Draw:
    """Algorithm 4: pop the front of a block chosen uniformly among the non-empty ones.

    All (finite) blocks empty → :data:`EXHAUSTED` without consuming randomness.
    """
    candidates = state.non_empty()
    if not candidates:
        return EXHAUSTED
    b = candidates[int(rng.integers(len(candidates)))]
    i = state.next_index[b]
    state.next_index[b] = i + 1
    return Draw(i, state.series.epsilon_i(i))


RbaState = Alg3State | Alg4State


def draw(state: RbaState, rng: np.random.Generator) -> Draw:
    """One slot's RBA draw: advances ``state`` in place; its only other input is ``rng``."""
    if isinstance(state, Alg3State):
        return draw_alg3(state, rng)
    return draw_alg4(state, rng)
