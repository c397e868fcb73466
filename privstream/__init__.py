"""privstream: differentially private statistics over infinite streams of user events.

This module is the engine-free public face: the estimation tasks, the release and ledger
records, the guarantee a release states, the errors a mechanism raises, and the family lookup
(``family``; the registry is imported on first use, so ``import privstream`` stays light and
never imports Bytewax). What a Bytewax user composes into a dataflow is in
``privstream.dataflow``.

The engine-free core lives in ``privstream.mechanisms``; Bytewax operators in
``privstream.operators``; sources, sinks and the embedded broker in ``privstream.connectors``;
ready dataflows in ``privstream.flows``. The checkout's top-level folders ``mechanisms/``,
``operators/``, ``connectors/`` and ``flows/`` are these sub-packages: the wheel maps them
(``package-dir`` in ``pyproject.toml``), and the checkout's ``privstream/`` folder links them,
so an import from the checkout, an editor and mypy see the same modules as the installed
package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from privstream.mechanisms.contract import LedgerEntry, Release, Slot
from privstream.mechanisms.errors import IncompatibleState, PrivacyBudgetExceeded
from privstream.mechanisms.guarantees import Guarantee
from privstream.mechanisms.tasks import BallTask, EstimationTask, FrequencyTask, MeanTask

if TYPE_CHECKING:
    from privstream.families.registry import Family

__version__ = "0.1.0"

__all__ = [
    "BallTask",
    "EstimationTask",
    "FrequencyTask",
    "Guarantee",
    "IncompatibleState",
    "LedgerEntry",
    "MeanTask",
    "PrivacyBudgetExceeded",
    "Release",
    "Slot",
    "__version__",
    "family",
]


def family(name: str) -> Family:
    """The registered mechanism family ``name`` (``"ldp-ids"``, ``"personalized"``, ``"cgm"``):
    its mechanisms, defaults and ``make_config``. The registry is imported on first use; it
    holds no Bytewax code."""
    from privstream.families.registry import family as lookup

    return lookup(name)
