"""Every synthetic dataset by name: the categorical and binary populations of the LDP-IDS and
personalized papers (``connectors.synthetic``) and the numeric streams of the CGM paper
(``connectors.numeric_synthetic``). The flows and the bench harness resolve ``--dataset`` here,
so a family's flow and its bench run on the same data."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

import numpy as np
from numpy.typing import NDArray

from privstream.connectors.numeric_synthetic import NUMERIC_DATASETS, numeric_dataset
from privstream.connectors.synthetic import DATASETS as POPULATIONS
from privstream.connectors.synthetic import SyntheticStream

DATASETS: Final = (*POPULATIONS, *NUMERIC_DATASETS)


class SlotSource(Protocol):
    """What the bench harness needs from a dataset: every user's value and the truth, per
    1-based slot (a synthetic stream, or ``RecordedStream``: a user's own records)."""

    @property
    def name(self) -> str: ...

    @property
    def users(self) -> int: ...

    @property
    def slots(self) -> int: ...

    def values(self, slot: int) -> NDArray[Any]: ...

    def truth(self, slot: int) -> NDArray[np.float64]: ...


class SlotStream(SlotSource, Protocol):
    """A synthetic stream: a ``SlotSource`` that also says what its values are."""

    @property
    def numeric(self) -> bool: ...

    @property
    def d(self) -> int: ...

    @property
    def bounds(self) -> tuple[float, float]: ...


def synthetic_dataset(
    name: str, users: int, slots: int, seed: int, *, independent: bool = False
) -> SlotStream:
    """The synthetic dataset ``name`` of ``users`` users over ``slots`` slots from ``seed``;
    ``independent`` draws a binary population's users independently (personalized §6.2)."""
    key = name.lower()
    if key in NUMERIC_DATASETS:
        return numeric_dataset(key, users, slots, seed)
    if key in POPULATIONS:
        return SyntheticStream(key, users, slots, seed=seed, independent=independent)
    raise ValueError(f"unknown dataset {name!r}; use one of {', '.join(DATASETS)} or file:PATH")


def synthetic_sources(
    names: tuple[str, ...], *, independent: bool = False
) -> dict[str, Callable[[int, int, int, Any], SlotStream]]:
    """The built-in synthetic datasets ``names`` as a family's dataset factories
    (``Family.datasets``: ``(users, slots, seed, task)`` → the stream; the task is ignored)."""

    def factory(name: str) -> Callable[[int, int, int, Any], SlotStream]:
        def make(users: int, slots: int, seed: int, task: Any = None) -> SlotStream:
            return synthetic_dataset(name, users, slots, seed, independent=independent)

        return make

    return {name: factory(name) for name in names}
