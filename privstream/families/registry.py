"""Mechanism families as data: one ``Family`` entry drives the generic operator, flow, CLI,
bench harness and conformance checks (``docs/architecture.md``, "Adding a family").

A family entry names its mechanisms, its validated config type (built from the shared
parameters ε, w, n and the task plus the family's ``options``), its defaults, the trust mode its
mechanisms declare, how a synthetic population registers (central-DP families), and what its
bench reports. Nothing outside this module and the family's own mechanisms module changes when
a family is added.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import numpy as np
from numpy.typing import NDArray

from privstream.experiments import scores as utility
from privstream.mechanisms import cgm, ldp_ids, personalized
from privstream.mechanisms.contract import Mechanism
from privstream.mechanisms.tasks import EstimationTask, FrequencyTask, MeanTask
from privstream.mechanisms.trust import TrustMode


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
    ``score``: one run's metrics, whose keys are ``fields``; ``mechanisms``: the default set."""

    datasets: tuple[str, ...]
    files: bool
    counts: bool
    score: Callable[[utility.Run], dict[str, float]]
    fields: tuple[str, ...]
    mechanisms: tuple[str, ...]
    users: int
    slots: int
    independent: bool = False


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

    def __post_init__(self) -> None:
        modes = {m.trust_modes for m in self.mechanisms.values()}
        if len(modes) != 1:
            raise ValueError(f"family {self.name}: its mechanisms declare different trust modes")

    @property
    def trust(self) -> TrustMode:
        """The trust mode the family's mechanisms run in (the first they declare)."""
        return next(iter(self.mechanisms.values())).trust_modes[0]

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


def _fraction(text: str) -> float:
    value = float(text)
    if not (0 < value < 1) or math.isnan(value):
        raise ValueError(f"must lie in (0, 1), got {text}")
    return value


LDP_IDS: Final = Family(
    name="ldp-ids",
    summary="LDP-IDS mechanisms (w-event ε-LDP)",
    mechanisms=ldp_ids.MECHANISMS,
    config=ldp_ids.LdpIdsConfig,
    epsilon=1.0,
    window=20,
    users=200_000,
    default="LPA",
    numeric=True,
    options=(Option("beta", _fraction, 0.5, "share β of the dissimilarity step"),),
    bench=BenchSpec(
        datasets=("lns", "sin", "log", "lns-con", "sin-con", "log-con"),
        files=True,
        counts=False,
        score=utility.ldp_ids_scores,
        fields=("mre", "mae", "bits_per_user", "publications", "seconds"),
        mechanisms=tuple(ldp_ids.MECHANISMS),
        users=200_000,
        slots=800,
    ),
)

PERSONALIZED: Final = Family(
    name="personalized",
    summary="personalized w-event mechanisms (central DP, per-user (ε_i, w_i))",
    mechanisms=personalized.MECHANISMS,
    config=personalized.PersonalizedConfig,
    epsilon=0.6,
    window=120,
    users=20_000,
    default="PBD",
    requirements=personalized.requirement_arrays,
    bench=BenchSpec(
        datasets=("tlns", "sin", "log"),
        files=False,
        counts=True,
        score=utility.personalized_scores,
        fields=("amre", "ln_amre", "ajsd", "publications", "seconds"),
        mechanisms=("BD", "BA", "PBD", "PBA"),
        users=10_000,
        slots=10_000,
        independent=True,
    ),
)


def _open_fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise ValueError(f"must lie in (0, 1), got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"must be a finite number >= 0, got {text}")
    return value


def _scope(text: str) -> str:
    if text not in ("stream", "timestamp"):
        raise ValueError(f"must be stream or timestamp, got {text}")
    return text


CGM: Final = Family(
    name="cgm",
    summary="CGM: correlated Gaussian noise for numeric streams ((ε, δ)-LDP)",
    mechanisms=cgm.MECHANISMS,
    config=cgm.CgmConfig,
    epsilon=1.0,
    window=48,
    users=5000,
    default="CGM",
    numeric=True,
    histograms=False,
    length_window=True,
    task=MeanTask(0.0, 1.0),
    options=(
        Option("delta", _open_fraction, 1e-5, "δ of the (ε, δ) budget"),
        Option("bound", _non_negative, 0.05, "C: the most a user's value moves per slot (raw units)"),
        Option("budget_scope", _scope, "stream", "stream (one budget for l = --window reports) or timestamp (per slot)"),
        Option("lag", int, 1, "j: the values repeat with this period; one noise chain per phase"),
    ),
    bench=BenchSpec(
        datasets=("taxi", "webtraffic", "sine"),
        files=False,
        counts=False,
        score=utility.cgm_scores,
        fields=("mse", "mse_stable", "publications", "seconds"),
        mechanisms=tuple(cgm.MECHANISMS),
        users=5000,
        slots=48,
    ),
)  # fmt: skip

FAMILIES: Final[dict[str, Family]] = {f.name: f for f in (LDP_IDS, PERSONALIZED, CGM)}
"""Every family privstream ships, by name. Adding a family adds its entry here."""


def family(name: str) -> Family:
    """The family called ``name``; a clear error naming the choices otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown family {name!r}; choose from {', '.join(FAMILIES)}") from None


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


REGISTRY: Final[tuple[Registered, ...]] = tuple(
    Registered(f, name) for f in FAMILIES.values() for name in f.mechanisms
)
"""Every registered mechanism of every family."""
