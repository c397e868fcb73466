"""What a Bytewax user composes: privstream's operator and the few Bytewax names a dataflow
needs, from one module (the README's composition example imports from ``privstream`` and from
here only; ``docs/decisions.md``, "The public face"; ``docs/composing.md``).

The Bytewax names are Bytewax's own objects, re-exported unchanged (``op`` is the module
``bytewax.operators``), so a dataflow written against Bytewax directly mixes freely with one
written against this module; ``run_main`` is Bytewax's own function, only declared with its
signature so that ``mypy --strict`` accepts a call to it. Importing this module imports
Bytewax; ``import privstream`` does not.

The building blocks of input: the parsers (``parse_json_lines`` for lines,
``parse_raw_batch`` for Kafka polls), ``split_parsed`` (their ``EventBatch | DeadLetter``
items into two typed streams) and privstream's Kafka source (``KafkaEventSource`` with
``KafkaSettings``; ``require_topics`` counts a topic's partitions for
``SlottingConfig.partitions``). Its batches carry their Kafka partition, which the per-partition
watermarks need; Bytewax's own ``KafkaSource`` does not give it (docs/composing.md).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

import bytewax.operators as op
from bytewax import testing as _testing
from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig
from bytewax.testing import TestingSink, TestingSource

from privstream.connectors.json_events import parse_json_lines
from privstream.connectors.kafka import (
    KafkaEventSource,
    KafkaSettings,
    RawBatch,
    parse_raw_batch,
    require_topics,
)
from privstream.connectors.parsed import split_parsed
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.seeding import NoiseKey
from privstream.operators.family import family_mechanisms
from privstream.operators.slotting import MechanismOut, SlottingConfig
from privstream.schema.events import DeadLetter, EventBatch


class RunMain(Protocol):
    """The signature of Bytewax's ``bytewax.testing.run_main`` (an unannotated extension)."""

    def __call__(
        self,
        flow: Dataflow,
        *,
        epoch_interval: timedelta | None = None,
        recovery_config: RecoveryConfig | None = None,
    ) -> None: ...


run_main: RunMain = _testing.run_main
"""Run ``flow`` to its end in this thread: Bytewax's own ``run_main``, the same object."""

__all__ = [
    "BudgetSplit",
    "Dataflow",
    "DeadLetter",
    "EventBatch",
    "KafkaEventSource",
    "KafkaSettings",
    "MechanismOut",
    "NoiseKey",
    "RawBatch",
    "SlottingConfig",
    "TestingSink",
    "TestingSource",
    "family_mechanisms",
    "op",
    "parse_json_lines",
    "parse_raw_batch",
    "require_topics",
    "run_main",
    "split_parsed",
]
