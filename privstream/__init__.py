"""privstream: differentially private statistics over infinite streams of user events.

The engine-free core lives in ``privstream.mechanisms``; Bytewax operators in
``privstream.operators``; sources, sinks and the embedded broker in ``privstream.connectors``;
ready dataflows in ``privstream.flows``.
"""

from pathlib import Path as _Path

# In a source checkout the sub-packages are sibling folders of this one (design §2: setuptools
# package-dir mapping). When Python imports privstream straight from the checkout (the checkout
# is the working directory, e.g. `python -m bytewax.run privstream.flows.ldp_ids:build` run from
# it), let privstream.mechanisms & co. resolve to those folders, as they do when installed.
_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "mechanisms" / "__init__.py").is_file() and str(_checkout) not in __path__:
    __path__.append(str(_checkout))

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
