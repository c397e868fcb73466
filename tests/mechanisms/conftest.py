"""Shared fixtures for the engine-free core tests.

``python -m pytest`` run from the repository root puts the root first on ``sys.path``. There the
top-level source folder ``privstream/`` (only ``__init__.py``; its sub-packages live in sibling
folders mapped by setuptools) shadows the strict editable install, and ``privstream.mechanisms``
cannot be imported. Drop the root from ``sys.path`` (and any half-imported ``privstream``) before
the tests import the package, so ``pytest`` and ``python -m pytest`` behave the same.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]


def _unshadow_installed_package() -> None:
    if not (_ROOT / "privstream" / "__init__.py").exists():
        return
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]
    pkg = sys.modules.get("privstream")
    if pkg is not None and "mechanisms" not in getattr(pkg, "__dict__", {}):
        for name in [m for m in sys.modules if m == "privstream" or m.startswith("privstream.")]:
            del sys.modules[name]


_unshadow_installed_package()
