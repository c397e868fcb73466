"""What a mechanism family declares: the ``Family`` type and its parts.

A family is data: one ``Family`` value, defined as ``FAMILY`` in the family's own module
(``families.ldp_ids``, ``families.personalized``, ``families.cgm``) and registered through the
``privstream.families`` entry-point group (``families.registry``), drives the generic operator,
flow, CLI, bench harness, conformance checks, metrics and audit (``docs/families.md``). This
module imports no bench scoring and no engine: the bench presentation (``BenchSpec``) and the
metric readers are plain callables the family module fills.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.accounting import DivisionSpec, register_division
from privstream.mechanisms.contract import ExtraRecord, Mechanism
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


def open_fraction(text: str) -> float:
    """An option's value in the open interval (0, 1) (a share β, a δ): the parser families
    share for it; anything else, NaN included, is refused naming the value."""
    value = float(text)
    if not 0 < value < 1:
        raise ValueError(f"must lie in (0, 1), got {text}")
    return value


def positive(text: str) -> float:
    """An option's positive finite number (a scale, a rate); NaN and ∞ refused."""
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a positive finite number, got {text}")
    return value


def non_negative(text: str) -> float:
    """An option's finite number ≥ 0 (a variance, a mass, a bound); NaN and ∞ refused."""
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"must be a finite number >= 0, got {text}")
    return value


def at_least(low: int) -> Callable[[str], int]:
    """A parser of an option's integer ``>= low``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise ValueError(f"must be an integer >= {low}, got {text}")
        return value

    return parse


def choice(*allowed: str) -> Callable[[str], str]:
    """A parser of an option that is one of ``allowed`` words."""

    def parse(text: str) -> str:
        if text not in allowed:
            words = " or ".join(allowed) if len(allowed) < 3 else f"one of {', '.join(allowed)}"
            raise ValueError(f"must be {words}, got {text}")
        return text

    return parse


@dataclass(frozen=True)
class Option:
    """A family-specific config field exposed as a flow keyword and a ``--flag`` of
    ``privstream run/bench <family>`` (``--beta`` for ``beta``)."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    key: str | None = None
    """The flag and flow-file key when the config field's name is not what a user types
    (DPI's λ is the field ``lam`` — ``lambda`` is a Python keyword — and the flag ``--lambda``);
    None: ``name``."""

    @property
    def word(self) -> str:
        """What a user types: the flow-file key, and the flag with ``_`` as ``-``."""
        return self.key or self.name


class FlowTable(Protocol):
    """What a task type's flow-file parser reads: the stream's table (``flows.config``), whose
    readers raise the config's own error naming the key."""

    @property
    def data(self) -> Mapping[str, Any]: ...

    def integer(self, key: str, low: int) -> int: ...

    def number(self, key: str) -> float: ...

    def numbers(self, key: str, what: str) -> tuple[float, ...]: ...

    def table(self, key: str) -> Any: ...

    def error(self, key: str | None, message: str) -> Exception: ...


@dataclass(frozen=True)
class TaskType:
    """One kind of estimation task a family releases, and how a flag or a flow-file value
    parses into it.

    ``key``: the flow-file key it owns (``domain = 8``, ``threshold = 0.5``); ``describe``: how
    the config's messages show that key; ``parse_flow(table)`` reads the key from a stream's
    table into the stream's task value (refusing with ``table.error``); ``classes``: the
    ``EstimationTask`` classes it covers (what a source's task is judged against); ``flag``,
    ``help``, ``parse_flag(text)``: the ``privstream run/bench <family>`` flag it owns (None:
    none beyond the generic ``--domain``), ``dest`` its argparse name; ``keyword``: the
    ``flows.dataflow.build`` keyword the parsed flag value goes to (``task``: an
    ``EstimationTask``); ``show(value)``: the task value as the config summary prints it."""

    name: str
    key: str
    describe: str
    parse_flow: Callable[[FlowTable], Any]
    classes: tuple[type[EstimationTask], ...]
    flag: str | None = None
    help: str = ""
    parse_flag: Callable[[str], Any] | None = None
    keyword: str = "task"
    show: Callable[[Any], str] = repr

    @property
    def dest(self) -> str:
        """The argparse name of ``flag`` (``--mean-range`` → ``mean_range``)."""
        return (self.flag or "").removeprefix("--").replace("-", "_")


DatasetFactory = Callable[[int, int, int, "EstimationTask | None"], Any]
"""A dataset: ``(users, slots, seed, task)`` → a slot source (``connectors.datasets.SlotSource``;
``task``: the run's task where one was given, else None)."""


@dataclass(frozen=True)
class BenchCommand:
    """A family's own ``privstream bench <family>`` command, in place of the generic harness
    run (a reproduction with its own flags): ``module`` names a module with
    ``add_parser(bench_subparsers)``, registering the ``<family>`` sub-command, and
    ``run(args) -> int``. Imported only when the command line is built."""

    module: str

    def load(self) -> Any:
        import importlib

        return importlib.import_module(self.module)


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
    command: BenchCommand | None = None
    """The family's own bench command (None: the generic harness run with ``datasets`` etc.;
    the harness runs the family either way)."""


@dataclass(frozen=True)
class MetricSpec:
    """One metric family a family exports beside the generic ones (``operators.metrics``).

    ``name`` is the exposed name without the ``privstream_`` prefix; ``public`` puts it on the
    public endpoint's allow-list (``PUBLIC_METRICS``) — only a value safe to show anyone (a
    privatised estimate, a public count, the ledger's spend) may be public; ``value`` reads one
    (stream, mechanism) sample from that stream's ``Tally`` and its last ``LedgerEntry`` (None:
    no sample). Gauges only. A metric with labels beyond ``{stream, mechanism}`` (``labels``
    ``("stream", "mechanism", "level")``) has a reader answering a mapping from the tuple of
    the extra labels' values to the value, one sample each."""

    name: str
    help: str
    value: Callable[[Any, Any], float | Mapping[tuple[str, ...], float] | None]
    public: bool = True
    labels: tuple[str, ...] = ("stream", "mechanism")


@dataclass(frozen=True)
class OutputSpec:
    """One extra output a family's steps emit beside releases and ledger entries (DPI's
    internal audit stream): ``ExtraRecord``s whose ``output`` is ``name``.

    ``public``: safe to show anyone; an internal output (the default) is written only where the
    operator names a sink for it and never onto a public one (the release topic). ``record``:
    the type of its records (``ExtraRecord``: ``to_dict`` gives the JSON line); ``help``: the
    ``--<name>-out`` / ``--<name>-topic`` flags' help. ``name`` is a lowercase word (``-``
    allowed): the flags are ``--<name>-out``/``--<name>-topic``, the flow key ``<name>_topic``."""

    name: str
    help: str
    public: bool = False
    record: type = ExtraRecord

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9-]*", self.name) or self.name in RESERVED_OUTPUTS:
            raise ValueError(
                f"output {self.name!r}: a lowercase word (letters, digits, '-') other than "
                f"{', '.join(sorted(RESERVED_OUTPUTS))}"
            )

    @property
    def dest(self) -> str:
        """Its name as a Python identifier and flow-file key stem (``audit-log`` → ``audit_log``)."""
        return self.name.replace("-", "_")


RESERVED_OUTPUTS = frozenset(
    {"output", "ledger", "dead-letter", "dead-letters", "releases", "input", "metrics"}
)
"""Names whose ``--<name>-out`` / ``<name>_topic`` the generic flows already own."""


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
    tasks: tuple[TaskType, ...] = ()
    """The task types the family releases (``families.tasks``: the built-in frequency, mean and
    ball types; a family may declare its own); empty: frequencies only."""
    datasets: Mapping[str, DatasetFactory] = field(default_factory=dict)
    """The family's own datasets by name (``sources``: these, or else the built-in synthetic
    datasets ``bench.datasets`` names)."""
    window_default: str = "fixed"
    """``fixed``: the window defaults to ``window``; ``slots``: the window is the stream's length
    ``l`` (the reports one budget covers) and defaults to ``--slots``."""
    oracle_reports: bool = True
    """Users report through an LDP frequency oracle, simulated per user or in aggregate
    (``--client-path``, flow key ``client_path``) when privstream simulates the clients."""
    delta_option: str | None = None
    """The option that is the δ of an (ε, δ) budget: bounded by ``1/users`` unless
    ``--allow-large-delta`` (``population.allow_large_delta``), defaulted from
    ``population.delta``."""
    task: EstimationTask = field(default_factory=lambda: FrequencyTask(2))
    """The task of the family's examples (the conformance checks)."""
    requirements: Requirements | None = None
    """A synthetic population's per-user ``(ε_i, w_i)`` from ``(n, ε, w, seed)``; families
    whose users share one requirement have none."""
    metrics: tuple[MetricSpec, ...] = ()
    """The family's own metric families (beside the generic ones every stream exports)."""
    outputs: tuple[OutputSpec, ...] = ()
    """The family's extra outputs (``ExtraRecord``s its steps emit), routed by name."""
    release_key: tuple[str, ...] = ()
    """The parts of its release key beyond ``stream/mechanism/slot`` (DPI: ``("query",)``):
    each release carries them in ``Release.key``, in this order."""
    divisions: tuple[DivisionSpec, ...] = ()
    """The family's own divisions (``accounting.DivisionSpec``: name, payer, the audit's
    recomputation), registered at discovery; the audit asks the family for them by name."""

    def __post_init__(self) -> None:
        modes = {m.trust_modes for m in self.mechanisms.values()}
        if len(modes) != 1:
            raise ValueError(f"family {self.name}: its mechanisms declare different trust modes")
        for division in self.divisions:
            register_division(division)
        names = [o.name for o in self.outputs]
        if len(set(names)) != len(names):
            raise ValueError(f"family {self.name}: an output declared twice in {names}")

    def output(self, name: str) -> OutputSpec:
        """The declared output ``name``; refuses an undeclared one, naming the declared."""
        for spec in self.outputs:
            if spec.name == name or spec.dest == name:
                return spec
        declared = ", ".join(o.name for o in self.outputs) or "none"
        raise ValueError(
            f"the {self.name} family declares no output {name!r} (its outputs: {declared})"
        )

    @property
    def task_types(self) -> tuple[TaskType, ...]:
        """The declared task types (the frequency type where none is declared)."""
        if self.tasks:
            return self.tasks
        from privstream.families.tasks import FREQUENCY

        return (FREQUENCY,)

    def takes(self, key: str) -> bool:
        """The family declares a task type owning the flow-file key ``key``."""
        return any(t.key == key for t in self.task_types)

    def accepts(self, task: EstimationTask) -> bool:
        """``task`` is of a class one of the family's task types covers."""
        return any(isinstance(task, t.classes) for t in self.task_types)

    @property
    def sources(self) -> Mapping[str, DatasetFactory]:
        """Every dataset the family's bench and harness accept, by name (``privstream run``
        also accepts every built-in synthetic dataset)."""
        if self.datasets:
            return self.datasets
        from privstream.connectors.datasets import synthetic_sources

        return synthetic_sources(self.bench.datasets, independent=self.bench.independent)

    @property
    def client_path(self) -> bool:
        """The family's runs choose how simulated users report (``--client-path``)."""
        return self.simulates_clients and self.oracle_reports

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
        window = self.family.mechanisms[self.name].conformance.window
        config = self.family.make_config(
            epsilon=1.0, window=window, population=population, task=task or self.family.task
        )
        return self.family.build(self.name, config)
