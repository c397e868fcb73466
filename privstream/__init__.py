"""privstream: differentially private statistics over infinite streams of user events.

The engine-free core lives in ``privstream.mechanisms``; Bytewax operators in
``privstream.operators``; sources, sinks and the embedded broker in ``privstream.connectors``;
ready dataflows in ``privstream.flows``.

The checkout's top-level folders ``mechanisms/``, ``operators/``, ``connectors/`` and ``flows/``
are these sub-packages: the wheel maps them (``package-dir`` in ``pyproject.toml``), and the
checkout's ``privstream/`` folder links them, so an import from the checkout, an editor and mypy
see the same modules as the installed package.
"""

from privstream.mechanisms.contract import LedgerEntry, Release, Slot
from privstream.mechanisms.errors import IncompatibleState, PrivacyBudgetExceeded
from privstream.mechanisms.guarantees import Guarantee

__version__ = "0.1.0"

__all__ = [
    "Guarantee",
    "IncompatibleState",
    "LedgerEntry",
    "PrivacyBudgetExceeded",
    "Release",
    "Slot",
    "__version__",
]
