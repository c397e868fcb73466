"""What a Bytewax user composes: privstream's operator and the few Bytewax names a dataflow
needs, from one module (the README's composition example imports from ``privstream`` and from
here only; ``docs/decisions.md``, "The public face").

The Bytewax names are Bytewax's own objects, re-exported unchanged (``op`` is the module
``bytewax.operators``), so a dataflow written against Bytewax directly mixes freely with one
written against this module. Importing this module imports Bytewax; ``import privstream`` does
not.
"""

from __future__ import annotations

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource, run_main

from privstream.connectors.json_events import parse_json_lines
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.seeding import NoiseKey
from privstream.operators.family import family_mechanisms
from privstream.operators.slotting import MechanismOut, SlottingConfig
from privstream.schema.events import DeadLetter, EventBatch

__all__ = [
    "BudgetSplit",
    "Dataflow",
    "DeadLetter",
    "EventBatch",
    "MechanismOut",
    "NoiseKey",
    "SlottingConfig",
    "TestingSink",
    "TestingSource",
    "family_mechanisms",
    "op",
    "parse_json_lines",
    "run_main",
]
