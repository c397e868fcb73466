"""privstream: differentially private statistics over infinite streams of user events.

The engine-free core lives in ``privstream.mechanisms``; Bytewax operators in
``privstream.operators``; sources, sinks and the embedded broker in ``privstream.connectors``;
ready dataflows in ``privstream.flows``.
"""

from privstream.mechanisms.contract import LedgerEntry, PrivacyCost, Release, Slot
from privstream.mechanisms.errors import IncompatibleState, PrivacyBudgetExceeded

__version__ = "0.1.0"

__all__ = [
    "IncompatibleState",
    "LedgerEntry",
    "PrivacyBudgetExceeded",
    "PrivacyCost",
    "Release",
    "Slot",
    "__version__",
]
