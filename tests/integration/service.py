"""A context manager for the test services (proxy, brokers, Prometheus, flow processes):
``with Service() as running`` starts it and always stops it."""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

S = TypeVar("S", bound="Managed")


class Managed:
    """Subclasses define ``start() -> self`` and ``stop()``."""

    def start(self: S) -> S:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: S) -> S:
        return self.start()

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.stop()
