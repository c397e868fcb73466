"""What a mechanism family declares: the ``Family`` type and its parts.

A family is data: one ``Family`` value, defined as ``FAMILY`` in the family's own module
(``families.ldp_ids``, ``families.personalized``, ``families.cgm``) and registered through the
``privstream.families`` entry-point group (``families.registry``), drives the generic operator,
flow, CLI, bench harness, conformance checks, metrics and audit (``docs/families.md``). This
module imports no bench scoring and no engine: the bench presentation (``BenchSpec``) and the
metric readers are plain callables the family module fills.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.contract import Mechanism
from privstream.mechanisms.tasks import EstimationTask, FrequencyTask
from privstream.mechanisms.trust import (
    TrustMode,
    is_local,
    needs_registration,
    simulates_clients,
)


class FamilyConfig(Protocol):
    """What the template needs of a family's config: the shared parameters and a share."""

    @property
    def epsilon(self) -> float: ...

    @property
    def window(self) -> int: ...

    @property
    def population(self) -> int: ...

    @property
    def task(self) -> EstimationTask: ...

    def shared(self, share: float) -> Any:
        """This config for a mechanism given the share ``s`` of the population budget."""


@dataclass(frozen=True)
class Option:
    """A family-specific config field exposed as a flow keyword and a ``--flag`` of
    ``privstream run/bench <family>`` (``--beta`` for ``beta``)."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str


@dataclass(frozen=True)
class BenchSpec:
    """What ``privstream bench <family>`` runs and reports.

    ``datasets``: the synthetic dataset names it accepts (``files``: also ``file:PATH``);
    ``counts``: releases are counts (truth scaled by n) rather than frequencies or means;
    ``independent``: a synthetic binary population draws every user's value independently
    (personalized §6.2) instead of exactly ``round(p_t·n)`` ones (LDP-IDS §5.1);
    ``score``: one run's metrics (from an ``experiments.scores.Run``), whose keys are ``fields``;
    ``mechanisms``: the default set. Plain data: the family module fills ``score`` with its
    bench scoring, so this module (and the engine-free core) imports none."""

    datasets: tuple[str, ...]
    files: bool
    counts: bool
    score: Callable[[Any], dict[str, float]]
    fields: tuple[str, ...]
    mechanisms: tuple[str, ...]
    users: int
    slots: int
    independent: bool = False


@dataclass(frozen=True)
class MetricSpec:
    """One metric family a family exports beside the generic ones (``operators.metrics``).

    ``name`` is the exposed name without the ``privstream_`` prefix; ``public`` puts it on the
    public endpoint's allow-list (``PUBLIC_METRICS``) — only a value safe to show anyone (a
    privatised estimate, a public count, the ledger's spend) may be public; ``value`` reads one
    (stream, mechanism) sample from that stream's ``Tally`` and its last ``LedgerEntry`` (None:
    no sample). Only gauges labelled ``{stream, mechanism}`` for now."""

    name: str
    help: str
    value: Callable[[Any, Any], float | None]
    public: bool = True
    labels: tuple[str, ...] = ("stream", "mechanism")


Requirements = Callable[[int, float, int, int], tuple[NDArray[np.float64], NDArray[np.int64]]]


@dataclass(frozen=True)
class Family:
    """One mechanism family: everything the generic template needs to run it."""

    name: str
    summary: str
    mechanisms: Mapping[str, type[Mechanism[Any, Any]]]
    config: Callable[..., FamilyConfig]
    epsilon: float
    window: int
    users: int
    default: str
    bench: BenchSpec
    options: tuple[Option, ...] = ()
    numeric: bool = False
    """True when the family also estimates means (``--mean-range``, ``--domain LO:HI``)."""
    histograms: bool = True
    """False when the family estimates means only."""
    length_window: bool = False
    """True when the window is the stream's length ``l`` (the reports one budget covers): it
    defaults to ``--slots``."""
    task: EstimationTask = field(default_factory=lambda: FrequencyTask(2))
    """The task of the family's examples (the conformance checks)."""
    requirements: Requirements | None = None
    """A synthetic population's per-user ``(ε_i, w_i)`` from ``(n, ε, w, seed)``; families
    whose users share one requirement have none."""
    metrics: tuple[MetricSpec, ...] = ()
    """The family's own metric families (beside the generic ones every stream exports)."""

    def __post_init__(self) -> None:
        modes = {m.trust_modes for m in self.mechanisms.values()}
        if len(modes) != 1:
            raise ValueError(f"family {self.name}: its mechanisms declare different trust modes")

    @property
    def trust(self) -> TrustMode:
        """The trust mode the family's mechanisms run in (the first they declare)."""
        return next(iter(self.mechanisms.values())).trust_modes[0]

    @property
    def local(self) -> bool:
        """The server never sees a raw value (``trust.is_local``)."""
        return is_local(self.trust)

    @property
    def needs_registration(self) -> bool:
        """A trusted curator holds registered users (``trust.needs_registration``)."""
        return needs_registration(self.trust)

    @property
    def simulates_clients(self) -> bool:
        """privstream answers for each asked user (``trust.simulates_clients``)."""
        return simulates_clients(self.trust)

    def names(self, names: str | Sequence[str]) -> list[str]:
        """Validated canonical mechanism names from a list or a comma-separated string
        (case-insensitive); refuses unknown or repeated names and an empty list."""
        raw = [n.strip() for n in (names.split(",") if isinstance(names, str) else names)]
        by_key = {name.upper(): name for name in self.mechanisms}
        unknown = [n for n in raw if n.upper() not in by_key]
        if unknown or not raw:
            raise ValueError(
                f"unknown {self.name} mechanism(s) {unknown}; choose from "
                f"{', '.join(self.mechanisms)}"
            )
        out = [by_key[n.upper()] for n in raw]
        if len(set(out)) != len(out):
            raise ValueError(f"mechanisms listed twice: {out}")
        return out

    def build(self, name: str, config: FamilyConfig) -> Mechanism[Any, Any]:
        """The mechanism called ``name`` (case-insensitive) with ``config``."""
        (canonical,) = self.names([name])
        return self.mechanisms[canonical](config)

    def build_shared(
        self, names: Sequence[str], config: FamilyConfig, shares: Sequence[float]
    ) -> list[Mechanism[Any, Any]]:
        """Every named mechanism built with its share of the population budget."""
        return [
            self.build(name, config.shared(share))
            for name, share in zip(self.names(names), shares, strict=True)
        ]

    def make_config(
        self, *, epsilon: float, window: int, population: int, task: EstimationTask, **options: Any
    ) -> FamilyConfig:
        """The family's validated config from the shared parameters and its options."""
        known = {o.name for o in self.options}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"family {self.name} has no option(s) {unknown}")
        return self.config(
            epsilon=epsilon, window=window, population=population, task=task, **options
        )


@dataclass(frozen=True)
class Registered:
    """One mechanism of one family, with the paper's defaults for a given population (what the
    conformance checks run)."""

    family: Family
    name: str

    @property
    def trust(self) -> TrustMode:
        return self.family.trust

    def example(self, population: int, task: EstimationTask | None = None) -> Mechanism[Any, Any]:
        config = self.family.make_config(
            epsilon=1.0, window=5, population=population, task=task or self.family.task
        )
        return self.family.build(self.name, config)
