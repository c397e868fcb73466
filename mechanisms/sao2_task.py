"""SaO2's estimation task: each user's value at a slot is a binary vector ``x_t ∈ {0,1}^d``
(spec sao2 §1.1), given as one number per event.

``kind="onehot"``: the value is a category index ``c ∈ [0, d)`` and ``x_t = e_c`` (a location
cell, a state); a move from a to b costs two changes. ``kind="bits"``: the value is a bitmask
integer and ``x_t[i] = (v >> i) & 1`` (set-valued data), for ``d ≤ BITS_LIMIT`` so every mask is
exact in a float64 event value. The release is the population mean vector ``x̄_t ∈ [0, 1]^d``.

Nothing here is private or random: the guarantee is the SaO2 mechanism's (``mechanisms.sao2``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.oracles import Oracle
from privstream.mechanisms.tasks import EstimationTask

BinaryKind = Literal["onehot", "bits"]
BINARY_KINDS: Final = ("onehot", "bits")
BITS_LIMIT: Final = 52
"""The widest bitmask value: every integer below ``2^53`` is exact in a float64."""


@dataclass(frozen=True)
class BinaryTask(EstimationTask):
    """Binary vectors of ``d`` bits, one-hot (a category index) or a bitmask (spec sao2 §1.1)."""

    d: int
    kind: BinaryKind = "onehot"

    def __post_init__(self) -> None:
        if not isinstance(self.d, int) or isinstance(self.d, bool) or self.d < 1:
            raise ValueError(f"d (bits per value) must be an integer >= 1, got {self.d!r}")
        if self.kind not in BINARY_KINDS:
            raise ValueError(f"kind must be one of {BINARY_KINDS}, got {self.kind!r}")
        if self.kind == "bits" and self.d > BITS_LIMIT:
            raise ValueError(f"a bitmask value holds at most {BITS_LIMIT} bits, got d = {self.d}")

    def select(self, eps: float) -> Oracle:
        raise ValueError("a binary task is reported through the SaO2 protocol, not an LDP oracle")

    @property
    def width(self) -> int:
        """The most ones one value holds (1 for one-hot, ``d`` for a bitmask)."""
        return 1 if self.kind == "onehot" else self.d

    def in_domain(self, values: NDArray[np.float64]) -> NDArray[np.bool_]:
        v = np.asarray(values, dtype=np.float64)
        top = self.d if self.kind == "onehot" else 2.0**self.d
        ok = np.isfinite(v) & (v == np.floor(v)) & (v >= 0) & (v < top)
        return np.asarray(ok, dtype=bool)

    def encode(self, values: NDArray[Any]) -> NDArray[np.int64]:
        """The values as integers (a category index or a bitmask)."""
        return np.asarray(values, dtype=np.int64)

    def support(self, values: NDArray[Any]) -> NDArray[np.int64]:
        """Each value's ones as ``(n, width)`` coordinates, ascending, then −1 (client side)."""
        v = self.encode(values).reshape(-1)
        if self.kind == "onehot":
            return v[:, None].copy()
        bits = np.arange(self.d, dtype=np.int64)
        on = ((v[:, None] >> bits[None, :]) & 1).astype(bool)
        order = np.argsort(~on, axis=1, kind="stable")  # the set bits first, ascending
        coords = np.take_along_axis(np.broadcast_to(bits, on.shape), order, axis=1)
        return np.where(np.take_along_axis(on, order, axis=1), coords, -1)

    def dense(self, values: NDArray[Any]) -> NDArray[np.int8]:
        """The values as ``(n, d)`` 0/1 vectors (tests and small cases only)."""
        ones = self.support(values)
        out = np.zeros((ones.shape[0], self.d + 1), dtype=np.int8)
        rows = np.repeat(np.arange(ones.shape[0]), ones.shape[1])
        out[rows, np.where(ones >= 0, ones, self.d).ravel()] = 1
        return out[:, : self.d]
