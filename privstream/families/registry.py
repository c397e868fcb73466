"""Family discovery: every family is an entry point of the ``privstream.families`` group.

A distribution registers a family by naming its ``Family`` value under the family's name::

    [project.entry-points."privstream.families"]
    toy = "toyfam.family:FAMILY"

privstream registers its own three the same way (``pyproject.toml``). ``families()`` loads the
group once (``importlib.metadata``: installed distributions and any ``*.dist-info`` directory on
``sys.path``) and caches it; a broken entry point (it fails to import, is not a ``Family``, or
its name differs from the family's) or two distributions naming one family stop discovery with
an error that names the distribution. Every surface — ``privstream run/bench <family>``, flow
files, the harness, the conformance checks, the metrics and the audit — picks families here, so
a family in another installed package needs no edit to privstream (``docs/families.md``).

An editable install older than the source tree carries no entry points of the group, so the
project's own lines (``BUILTIN``, the same as ``pyproject.toml``; a test pins them equal) are
always added to what the metadata declares, identical lines counted once: a checkout runs before
it is reinstalled, and another distribution naming a built-in family is a duplicate.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Final, overload

from privstream.families.spec import (
    BenchSpec,
    Family,
    FamilyConfig,
    MetricSpec,
    Option,
    Registered,
)

__all__ = [
    "BUILTIN",
    "FAMILIES",
    "GROUP",
    "REGISTRY",
    "BenchSpec",
    "Family",
    "FamilyConfig",
    "FamilyDiscoveryError",
    "MetricSpec",
    "Option",
    "Registered",
    "families",
    "family",
]

GROUP: Final = "privstream.families"
"""The entry-point group a distribution registers its families in."""

BUILTIN: Final[dict[str, str]] = {
    "ldp-ids": "privstream.families.ldp_ids:FAMILY",
    "personalized": "privstream.families.personalized:FAMILY",
    "cgm": "privstream.families.cgm:FAMILY",
    "dpi": "privstream.families.dpi:FAMILY",
    "sao2": "privstream.families.sao2:FAMILY",
}
"""privstream's own entry points (``pyproject.toml``), read even when the install predates them."""


class FamilyDiscoveryError(RuntimeError):
    """A ``privstream.families`` entry point that cannot serve: the message names its
    distribution and what to fix."""


@dataclass(frozen=True)
class _Point:
    name: str
    value: str
    origin: str  # "distribution version" — who registered it


def _origin(point: metadata.EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    if dist is None:
        return "an unknown distribution"
    return f"distribution {dist.metadata['Name']} {dist.version}"


def _points() -> list[_Point]:
    """The group's entry points and the built-in lines, identical lines (one distribution seen
    twice on sys.path, or privstream's own declared by its metadata) counted once."""
    seen: dict[tuple[str, str], _Point] = {}
    for point in metadata.entry_points(group=GROUP):
        seen.setdefault((point.name, point.value), _Point(point.name, point.value, _origin(point)))
    for name, value in BUILTIN.items():
        seen.setdefault((name, value), _Point(name, value, "privstream (source tree)"))
    return list(seen.values())


def _load(point: _Point) -> Family:
    try:
        loaded = metadata.EntryPoint(point.name, point.value, GROUP).load()
    except Exception as exc:
        raise FamilyDiscoveryError(
            f"the {GROUP} entry point {point.name} = {point.value!r} of {point.origin} failed "
            f"to load ({type(exc).__name__}: {exc}); fix or uninstall that distribution"
        ) from exc
    if not isinstance(loaded, Family):
        raise FamilyDiscoveryError(
            f"the {GROUP} entry point {point.name} = {point.value!r} of {point.origin} names "
            f"a {type(loaded).__name__}, not a privstream.families.spec.Family"
        )
    if loaded.name != point.name:
        raise FamilyDiscoveryError(
            f"the {GROUP} entry point {point.name!r} of {point.origin} names the family "
            f"{loaded.name!r}: the entry point's name must be the family's name"
        )
    return loaded


@functools.cache
def families() -> dict[str, Family]:
    """Every discovered family by name, the built-ins first (cached; ``families.cache_clear()``
    rediscovers). Refuses two entry points that name one family with different objects."""
    points = _points()
    order = {name: i for i, name in enumerate(BUILTIN)}
    points.sort(key=lambda p: (order.get(p.name, len(order)), p.name))
    found: dict[str, tuple[Family, _Point]] = {}
    for point in points:
        loaded = _load(point)
        if point.name in found and found[point.name][0] is not loaded:
            other = found[point.name][1]
            raise FamilyDiscoveryError(
                f"two {GROUP} entry points name the family {point.name!r}: {other.value!r} of "
                f"{other.origin} and {point.value!r} of {point.origin}; uninstall one"
            )
        found.setdefault(point.name, (loaded, point))
    return {name: entry for name, (entry, _) in found.items()}


def family(name: str) -> Family:
    """The family called ``name``; a clear error naming the choices otherwise."""
    try:
        return families()[name]
    except KeyError:
        choices = ", ".join(families())
        raise ValueError(f"unknown family {name!r}; choose from {choices}") from None


class _Families(Mapping[str, Family]):
    """``families()`` as a read-only mapping, resolved at each use (the old ``FAMILIES``)."""

    def __getitem__(self, name: str) -> Family:
        return families()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(families())

    def __len__(self) -> int:
        return len(families())


class _Registry(Sequence[Registered]):
    """Every mechanism of every discovered family, resolved at each use (the old ``REGISTRY``)."""

    def _all(self) -> tuple[Registered, ...]:
        return tuple(Registered(f, name) for f in families().values() for name in f.mechanisms)

    @overload
    def __getitem__(self, index: int) -> Registered: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Registered]: ...
    def __getitem__(self, index: Any) -> Any:
        return self._all()[index]

    def __iter__(self) -> Iterator[Registered]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


FAMILIES: Final[Mapping[str, Family]] = _Families()
"""Every discovered family, by name."""

REGISTRY: Final[Sequence[Registered]] = _Registry()
"""Every registered mechanism of every discovered family."""


def __getattr__(name: str) -> Family:
    """The built-in entries under their old names (``LDP_IDS``, ``PERSONALIZED``, ``CGM``)."""
    old = {"LDP_IDS": "ldp-ids", "PERSONALIZED": "personalized", "CGM": "cgm"}
    if name in old:
        return family(old[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
